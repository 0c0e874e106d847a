"""`rasd-agent check`: a doctor for one GPU node, in the style of `gpud scan`.

It reads the same settings the agent would (agent.toml and flags) and checks, one line each, what
the agent needs from this node: the GPUs (NVML reachable, which GPUs, or the nvml extra missing),
the kernel log readable, the node's certificate (present, issued by the CA, a node certificate for
this node id, not expired or near expiry), the controller reachable over a real gRPC call with that
certificate, the clock synchronised, disk space for the spool, and the topology labels::

    ok    gpus        NVML: 8 GPUs: NVIDIA H100 80GB HBM3 x8
    fail  kernel-log  /dev/kmsg: Permission denied; fix: run as root (kernel.dmesg_restrict=1 needs CAP_SYSLOG)
    warn  certificate /etc/rasd/tls/agent.crt expires in 5 days (2025-06-01); fix: renew it ...

Each check is a function of what it looks at (settings, paths, a clock reading), returning one
`Finding`; `run_checks` runs them all and `exit_code` is 1 when any failed. The controller does not
report its time on the wire, so the clock check reads the kernel's NTP state: an unsynchronised
clock is what makes a node's events misordered and its certificate look not yet valid.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import itertools
import os
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rasd.agent import gpu
from rasd.agent import settings as agent_settings
from rasd.common import devcerts, tls

OK, WARN, FAIL = "ok", "warn", "fail"
NVML_EXTRA_MISSING = "the nvml backend needs the nvml extra, which is not installed: pip install 'rasd[nvml]'"
"""The one line that says the nvml extra is missing (the agent and the doctor both print it)."""
AGENT_SERVICE = "rasd.api.v1.AgentService"
"""The health-service name the controller marks SERVING once it takes agent streams."""
CERT_WARN_DAYS = 14
"""A certificate that expires within this many days is a warning."""
SPOOL_WARN_FREE_BYTES = 1 << 30
"""Less free space than this beside the spool is a warning (a long outage spools a lot)."""
SPOOL_FAIL_FREE_BYTES = 100 << 20
"""Less than this is a failure: events could be refused by a full disk."""
_TIME_ERROR = 5
"""adjtimex(2)'s answer when the kernel clock is not synchronised (STA_UNSYNC)."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """What one check found."""

    check: str
    """Short name: gpus, kernel-log, certificate, controller, clock, spool, labels."""
    status: str
    """ok, warn or fail."""
    detail: str
    """What was seen."""
    fix: str = ""
    """What to do about a warn or fail."""

    def line(self) -> str:
        """The finding as the one line `rasd-agent check` prints."""
        fix = f"; fix: {self.fix}" if self.fix and self.status != OK else ""
        return f"{self.status:<5} {self.check:<11} {self.detail}{fix}"


def exit_code(findings: Sequence[Finding]) -> int:
    """1 when any check failed, else 0 (warnings do not fail the doctor)."""
    return 1 if any(f.status == FAIL for f in findings) else 0


def nvml_extra_missing(exc: BaseException) -> bool:
    """Whether a backend error comes from pynvml not being importable (the nvml extra not installed)."""
    return isinstance(exc.__cause__, ImportError)


def check_gpus(settings: agent_settings.AgentSettings) -> Finding:
    """The GPU backend opens: NVML reachable and which GPUs it sees (or the simulated ones)."""
    if settings.gpu.backend != "nvml":
        return Finding("gpus", OK, f"{settings.gpu.backend} backend: {settings.gpu.gpus} GPUs (NVML not used)")
    # Imported here, as main does, so that a node without libnvidia-ml can still run the other checks.
    from rasd.agent.gpu import nvml

    try:
        backend = nvml.open_nvml_backend(watch_events=False)
    except gpu.BackendError as exc:
        if nvml_extra_missing(exc):
            return Finding("gpus", FAIL, NVML_EXTRA_MISSING, f"{sys.executable} -m pip install 'rasd[nvml]'")
        return Finding(
            "gpus", FAIL, str(exc), "load the NVIDIA driver; `nvidia-smi` must list the GPUs (dmesg | grep NVRM)"
        )
    try:
        inventory = list(backend.inventory())
    finally:
        backend.close()
    if not inventory:
        return Finding("gpus", FAIL, "NVML answers but sees no GPU", "`nvidia-smi -L` and the driver's dmesg lines")
    models: dict[str, int] = {}
    for info in inventory:
        models[info.model] = models.get(info.model, 0) + 1
    seen = ", ".join(f"{name} x{count}" for name, count in models.items())
    return Finding("gpus", OK, f"NVML: {len(inventory)} GPUs: {seen}")


def check_kernel_log(settings: agent_settings.KernelLogSettings) -> Finding:
    """The configured kernel log can be read (the Xid and fallen-off-the-bus lines come from it)."""
    if settings.source == "none":
        return Finding(
            "kernel-log",
            WARN,
            'off (kernel_log = "none"): Xid lines and GPUs falling off the bus are not seen',
            'kernel_log = "kmsg" in agent.toml',
        )
    if settings.source == "journal":
        return _check_journal()
    try:
        fd = os.open(settings.kmsg_path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        fix = (
            "run as root (the unit does; kernel.dmesg_restrict=1 needs CAP_SYSLOG)"
            if isinstance(exc, PermissionError)
            else "kmsg_path in agent.toml must name the kmsg device (/dev/kmsg)"
        )
        return Finding("kernel-log", FAIL, f"{settings.kmsg_path}: {exc.strerror}", fix)
    os.close(fd)  # /dev/kmsg checks the reader's permission at open
    return Finding("kernel-log", OK, f"{settings.kmsg_path} readable")


def _check_journal() -> Finding:
    fix = 'install systemd\'s journalctl, or kernel_log = "kmsg" in agent.toml'
    try:
        done = subprocess.run(
            ["journalctl", "-k", "-n", "1", "-q", "--no-pager"], capture_output=True, text=True, timeout=20, check=False
        )
    except FileNotFoundError:
        return Finding("kernel-log", FAIL, "journalctl: not found", fix)
    except subprocess.TimeoutExpired:
        return Finding("kernel-log", FAIL, "journalctl -k: no answer within 20 s", fix)
    if done.returncode != 0:
        return Finding("kernel-log", FAIL, f"journalctl -k: exit {done.returncode}: {done.stderr.strip()[:200]}", fix)
    return Finding("kernel-log", OK, "journalctl -k readable")


def check_certificate(
    settings: agent_settings.AgentSettings, now: datetime.datetime, *, warn_days: int = CERT_WARN_DAYS
) -> Finding:
    """The node's certificate: readable, key matching, issued by the CA, a node certificate for this node, in date.

    Args:
        settings: the agent's settings (tls files and node id).
        now: the time to judge validity at (UTC).
        warn_days: how close to expiry counts as a warning.
    """
    files = settings.tls.files
    if files is None:
        return Finding(
            "certificate", WARN, "plaintext gRPC (insecure = true): loopback only", "mutual TLS with the [tls] files"
        )
    renew = "issue this node a certificate from the cluster's CA (OU=node, SAN DNS = node_id); README, Certificates"
    try:
        ca_pem, cert_pem, _key = files.read()
    except (OSError, ValueError) as exc:
        detail = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename else str(exc)
        return Finding("certificate", FAIL, detail, f"put ca.crt, agent.crt and agent.key in {files.cert.parent}")
    chain = x509.load_pem_x509_certificates(cert_pem)
    authorities = x509.load_pem_x509_certificates(ca_pem)
    if not _chains_to(chain, authorities):
        return Finding("certificate", FAIL, f"{files.cert} is not issued by the CA in {files.ca}", renew)
    identity = tls.parse_certificate(cert_pem)
    if devcerts.NODE_OU not in identity.units:
        units = ",".join(identity.units) or "none"
        return Finding("certificate", FAIL, f"{files.cert} is not a node certificate (OU={units})", renew)
    if identity.node_id != settings.node_id:
        return Finding(
            "certificate",
            FAIL,
            f"{files.cert} speaks for {identity.node_id!r}, but this agent's node_id is {settings.node_id!r}: "
            "the controller would refuse its stream",
            f'node_id = "{identity.node_id}" in agent.toml, or a certificate for {settings.node_id}',
        )
    for certificate, path in ((chain[0], files.cert), *((ca, files.ca) for ca in authorities)):
        finding = _validity(certificate, path, now, warn_days)
        if finding is not None:
            return finding
    days_left = (chain[0].not_valid_after_utc - now).days
    return Finding("certificate", OK, f"{files.cert}: node {identity.node_id}, valid {days_left} more days")


def _chains_to(chain: Sequence[x509.Certificate], authorities: Sequence[x509.Certificate]) -> bool:
    """Whether each certificate of chain is signed by the next, and the last by one of authorities."""
    for child, parent in itertools.pairwise(chain):
        if not _issued_by(child, parent):
            return False
    return any(_issued_by(chain[-1], ca) for ca in authorities)


def _issued_by(child: x509.Certificate, parent: x509.Certificate) -> bool:
    try:
        child.verify_directly_issued_by(parent)
    except (ValueError, TypeError, InvalidSignature):  # another issuer's name, key type or signature
        return False
    return True


def _validity(
    certificate: x509.Certificate, path: pathlib.Path, now: datetime.datetime, warn_days: int
) -> Finding | None:
    """A finding when certificate is not yet valid, expired, or expires within warn_days; None when fine."""
    not_before, not_after = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    if now < not_before:
        return Finding(
            "certificate",
            FAIL,
            f"{path} is not valid until {not_before:%Y-%m-%d %H:%M} UTC",
            "is this node's clock right? (see the clock line)",
        )
    if now >= not_after:
        return Finding("certificate", FAIL, f"{path} expired on {not_after:%Y-%m-%d}", "renew it")
    if not_after - now < datetime.timedelta(days=warn_days):
        days = (not_after - now).days
        return Finding(
            "certificate", WARN, f"{path} expires in {days} days ({not_after:%Y-%m-%d})", "renew it before then"
        )
    return None


def check_controller(settings: agent_settings.AgentSettings, *, timeout_s: float = 5.0) -> Finding:
    """The controller answers the gRPC health service over the node's own mutual TLS."""
    address = settings.link.controller_address
    how = "plaintext" if settings.tls.files is None else "mutual TLS"
    try:
        channel = tls.sync_channel(address, settings.tls.files, server_name=settings.tls.server_name)
    except (OSError, ValueError) as exc:
        return Finding("controller", FAIL, f"{address}: no credentials: {exc}", "see the certificate line")
    started = time.monotonic()
    try:
        with channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=AGENT_SERVICE), timeout=timeout_s
            )
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        name = code.name if code is not None else "error"
        details = (details or "").strip()
        return Finding(
            "controller", FAIL, f"{address} ({how}): {name}: {details[:300]}", _controller_fix(details, settings)
        )
    elapsed_ms = (time.monotonic() - started) * 1000
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    if answer.status != health_pb2.HealthCheckResponse.SERVING:
        return Finding("controller", FAIL, f"{address} ({how}) answers {status}", "look at the controller's log")
    return Finding("controller", OK, f"{address} answered {status} over {how} in {elapsed_ms:.0f} ms")


def _controller_fix(details: str, settings: agent_settings.AgentSettings) -> str:
    """What to do about a failed health call, from gRPC's description of the failure."""
    address = settings.link.controller_address
    if "Connection refused" in details:
        return f"nothing listens at {address}: is the controller running, and `controller` in agent.toml right?"
    if "CERTIFICATE_VERIFY_FAILED" in details:
        ca = settings.tls.files.ca if settings.tls.files else "tls.ca"
        return (
            f"the controller's certificate does not chain to {ca}, or does not name the host dialled: "
            "use the cluster's CA bundle, or set tls.server_name"
        )
    if "Deadline" in details or "DEADLINE" in details:
        return f"no answer from {address}: a firewall dropping packets, or the wrong host"
    return (
        f"check `controller` in agent.toml ({address}), that the port is open from this node, and that the "
        "controller trusts this node's certificate (the same CA)"
    )


def check_clock() -> Finding:
    """The kernel clock is synchronised (NTP): adjtimex(2) read-only."""
    fix = "run an NTP client (chrony or systemd-timesyncd): skewed clocks misorder events and fail TLS"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        timex = ctypes.create_string_buffer(512)  # struct timex, modes = 0: read only
        state = libc.adjtimex(timex)
    except (OSError, AttributeError) as exc:
        return Finding("clock", WARN, f"cannot read the kernel's clock state: {exc}", fix)
    if state < 0:
        return Finding("clock", WARN, f"adjtimex: {os.strerror(ctypes.get_errno())}", fix)
    if state == _TIME_ERROR:
        return Finding("clock", WARN, "the kernel clock is not synchronised (NTP)", fix)
    return Finding("clock", OK, "synchronised (NTP); the controller does not report its time, so skew is not measured")


def check_spool(
    state_dir: pathlib.Path,
    *,
    warn_free_bytes: int = SPOOL_WARN_FREE_BYTES,
    fail_free_bytes: int = SPOOL_FAIL_FREE_BYTES,
) -> Finding:
    """The spool's folder is writable (or can be created) and its file system has room."""
    existing = next((p for p in (state_dir, *state_dir.parents) if p.exists()), pathlib.Path("/"))
    if existing == state_dir and not (state_dir.is_dir() and os.access(state_dir, os.W_OK | os.X_OK)):
        return Finding("spool", FAIL, f"{state_dir} is not a writable folder", "run as root (the unit does)")
    free = shutil.disk_usage(existing).free
    where = str(state_dir) if existing == state_dir else f"{state_dir} (not yet created; {existing})"
    detail = f"{where}: {free / 2**30:.1f} GiB free"
    fix = f"free space on the file system of {existing}: the spool holds every event while the controller is away"
    if free < fail_free_bytes:
        return Finding("spool", FAIL, detail, fix)
    if free < warn_free_bytes:
        return Finding("spool", WARN, detail, fix)
    return Finding("spool", OK, detail)


def check_labels(labels: Mapping[str, str]) -> Finding:
    """Topology labels are set: without them no per-rack or per-domain disruption budget applies."""
    if not labels:
        return Finding(
            "labels",
            WARN,
            "no topology labels: per-rack and per-domain blast-radius limits cannot see this node",
            "[labels] rack, row, nvlink_domain, power_feed in agent.toml",
        )
    shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return Finding("labels", OK, shown)


def run_checks(
    settings: agent_settings.AgentSettings, *, warn_days: int = CERT_WARN_DAYS, timeout_s: float = 5.0
) -> Iterator[Finding]:
    """Every check, in the order `rasd-agent check` prints them, each as soon as it is done."""
    yield check_gpus(settings)
    yield check_kernel_log(settings.kernel_log)
    yield check_certificate(settings, datetime.datetime.now(datetime.UTC), warn_days=warn_days)
    yield check_controller(settings, timeout_s=timeout_s)
    yield check_clock()
    yield check_spool(settings.spool.state_dir)
    yield check_labels(settings.labels)
