"""rasd-agent entry point: arguments and config file → logging → backend → spool → run.

`rasd-agent install` (`rasd.agent.install`) and `rasd-agent check` (`rasd.agent.doctor`) are
dispatched from here too; nothing else lives here. Settings come from /etc/rasd/agent.toml (or
--config) with command-line flags taking precedence: the file is read only here, and
`rasd.agent.settings.load` checks and types both into an `AgentSettings` that the runtime and its
parts are built from.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
import socket
import sys
import time
import tomllib
from collections.abc import Sequence

import structlog
from prometheus_client import CollectorRegistry, start_http_server

from rasd.agent import gpu, kmsg_source, node_ops, runtime, sources, spool, systemd
from rasd.agent import metrics as agent_metrics
from rasd.agent import settings as agent_settings
from rasd.common import VERSION
from rasd.common import logging as rasd_logging

DEFAULT_CONFIG = pathlib.Path("/etc/rasd/agent.toml")
BOOT_ID_PATH = pathlib.Path("/proc/sys/kernel/random/boot_id")


SUBCOMMANDS_EPILOG = """\
other commands:
  rasd-agent install [--dry-run] [--root DIR]   install the systemd unit and /etc/rasd/agent.toml
  rasd-agent check [flags as above]              check this node: GPUs, kernel log, certificate,
                                                 controller, clock, spool (ok/warn/fail, with the fix)
"""


def build_parser(prog: str = "rasd-agent") -> argparse.ArgumentParser:
    """The agent's command line (also that of `rasd-agent check`, which reads the same settings)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="rasd node agent: streams GPU telemetry and health events to the controller "
        "and carries out its commands.",
        epilog=SUBCOMMANDS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=pathlib.Path, help=f"TOML settings file (default {DEFAULT_CONFIG} if present)")
    parser.add_argument("--node-id", help="this node's id (default: the hostname)")
    parser.add_argument("--controller", help="controller gRPC address host:port (default 127.0.0.1:7443)")
    parser.add_argument("--backend", choices=gpu.BACKEND_NAMES, help="GPU backend (default nvml)")
    parser.add_argument("--gpus", type=int, help="simulated backend: number of GPUs (default 8)")
    parser.add_argument("--seed", type=int, help="simulated backend: seed (default 0)")
    parser.add_argument(
        "--sim-step-period-s",
        type=float,
        help="simulated backend: training step period (default 2.0; 0 = idle)",
    )
    parser.add_argument(
        "--state-dir", type=pathlib.Path, help="where the event spool lives (default /var/lib/rasd-agent)"
    )
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="topology label (repeatable)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus exporter port; -1 disables (default 8455)")
    parser.add_argument(
        "--metrics-addr", help="address the exporter binds (default 0.0.0.0; 127.0.0.1 with --insecure)"
    )
    parser.add_argument(
        "--kernel-log",
        choices=agent_settings.KERNEL_LOG_SOURCES,
        help="kernel log source (default: kmsg with nvml, else none)",
    )
    parser.add_argument(
        "--kmsg-path",
        help="kmsg device, FIFO or file (default /dev/kmsg); a file's plain-text lines are followed by byte offset",
    )
    parser.add_argument("--ib-sysfs-root", help="InfiniBand sysfs root (default /sys/class/infiniband if present)")
    parser.add_argument(
        "--failsafe-power-limit-w", type=int, help="per-GPU cap applied after losing the controller (default off)"
    )
    parser.add_argument("--failsafe-after-s", type=float, help="controller outage before the fail-safe (default 300)")
    parser.add_argument("--sim-scenario", help="simulated backend: TOML file of scripted faults for this node")
    parser.add_argument(
        "--enable-destructive-actions",
        dest="destructive_actions",
        action="store_true",
        default=None,
        help="really restart processes, reset GPUs, reboot and validate (default: dry-run)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext gRPC; allowed only to a loopback controller (default: mutual TLS with the [tls] files)",
    )
    parser.add_argument(
        "--tls-ca",
        help=f"CA bundle the controller's certificate must chain to (default {agent_settings.TLS_DEFAULTS['ca']})",
    )
    parser.add_argument(
        "--tls-cert", help=f"this node's client certificate (default {agent_settings.TLS_DEFAULTS['cert']})"
    )
    parser.add_argument("--tls-key", help=f"its private key (default {agent_settings.TLS_DEFAULTS['key']})")
    parser.add_argument("--tls-server-name", help="name to verify in the controller's certificate (default: its host)")
    parser.add_argument("--log-level", default=None, help="debug|info|warning|error (default info)")
    parser.add_argument("--version", action="version", version=f"rasd-agent {VERSION}")
    return parser


def _boot_id() -> str:
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return "unknown"


def load_settings(args: argparse.Namespace) -> agent_settings.AgentSettings:
    """The settings from --config (or /etc/rasd/agent.toml when present) and the flags.

    Raises:
        OSError: the config file cannot be read.
        SettingsError: it is not TOML, or a key is unknown or a value bad (the message names it).
    """
    config_path = _config_path(args)
    try:
        table = tomllib.loads(config_path.read_text()) if config_path else {}
    except tomllib.TOMLDecodeError as exc:
        raise agent_settings.SettingsError(f"{config_path}: not valid TOML: {exc}") from None
    host = agent_settings.HostDefaults(
        hostname=socket.gethostname(), ib_sysfs_present=pathlib.Path(agent_settings.IB_SYSFS_ROOT).is_dir()
    )
    file_name = config_path.name if config_path else "agent.toml"
    return agent_settings.load(table, vars(args), host, file_name=file_name, environ=os.environ)


def _config_path(args: argparse.Namespace) -> pathlib.Path | None:
    """--config, else /etc/rasd/agent.toml when present, else None (defaults and flags only)."""
    return args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)


def open_backend(settings: agent_settings.AgentSettings) -> gpu.GpuBackend:
    """Build the configured GPU backend.

    Raises:
        SystemExit: the backend cannot open; one line says why (the nvml extra missing, NVML down).
    """
    gpu_settings = settings.gpu
    if gpu_settings.backend == "simulated":
        # Imported here: it brings numpy, which an agent on real GPUs does not need (its memory).
        from rasd.agent.gpu import simulated

        period_s = gpu_settings.sim_step_period_s
        workload = simulated.StepWorkload(period_s=period_s) if period_s > 0 else None
        faults = simulated.load_faults(gpu_settings.sim_scenario) if gpu_settings.sim_scenario else ()
        return simulated.SimulatedBackend(
            settings.node_id,
            gpu_settings.gpus,
            gpu_settings.seed,
            workload=workload,
            faults=faults,
            clock=time.time_ns,  # the agent's readings use the wall clock too
        )
    # Imported here so that machines without libnvidia-ml never load pynvml.
    from rasd.agent.gpu import nvml

    # The driver's power-sample buffer is used where it samples at least as often as the agent would.
    try:
        return nvml.open_nvml_backend(power_buffer_max_spacing_ms=settings.sampling.power_sample_interval_ms)
    except gpu.BackendError as exc:
        from rasd.agent import doctor  # see check()

        if doctor.nvml_extra_missing(exc):
            raise SystemExit(f"rasd-agent: {doctor.NVML_EXTRA_MISSING} (or --backend simulated)") from None
        raise SystemExit(f"rasd-agent: {exc} (is the NVIDIA driver loaded? `rasd-agent check` says more)") from None


async def _serve(settings: agent_settings.AgentSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    backend = open_backend(settings)
    state_dir = settings.spool.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    journal = spool.Spool(str(state_dir / "spool.db"))
    agent = runtime.Agent(
        settings, backend, journal, boot_id=_boot_id(), hostname=socket.gethostname(), ops=_node_ops(settings, backend)
    )
    _attach_sources(agent, settings)
    metrics_port = _start_metrics(agent, settings.metrics)
    notifier = systemd.Notifier()
    watchdog = asyncio.create_task(_pet_watchdog(agent, notifier, stop))
    log = structlog.get_logger("rasd.agent")
    log.info(
        "agent_started",
        node=settings.node_id,
        backend=backend.name,
        gpus=len(backend.inventory()),
        power_buffer=getattr(backend, "power_buffer_note", "none"),
        controller=settings.link.controller_address,
        spool_depth=journal.depth(),
        kernel_log=settings.kernel_log.source,
        metrics_port=metrics_port,
        pid=os.getpid(),
    )
    notifier.ready(f"streaming {len(backend.inventory())} GPUs to {settings.link.controller_address}")
    try:
        await agent.run(stop)
    finally:
        notifier.stopping()
        watchdog.cancel()
        backend.close()
        journal.close()
    log.info("agent_stopped", node=settings.node_id, events_spooled=agent.stats.events_spooled)
    return 0


def _attach_sources(agent: runtime.Agent, settings: agent_settings.AgentSettings) -> None:
    """Follow the configured kernel log and InfiniBand counters."""
    state_dir = settings.spool.state_dir
    if settings.kernel_log.source == "kmsg":
        agent.attach_kernel_log(
            kmsg_source.KmsgFollower(state_dir / "kmsg.cursor", path=settings.kernel_log.kmsg_path), source_name="kmsg"
        )
    elif settings.kernel_log.source == "journal":
        agent.attach_kernel_log(kmsg_source.JournalFollower(state_dir / "journal.cursor"), source_name="journal")
    if settings.ib.sysfs_root:
        agent.attach_ib_poller(sources.IbPoller(settings.ib.sysfs_root))


def _start_metrics(agent: runtime.Agent, metrics: agent_settings.MetricsSettings) -> int | None:
    """Serve the agent's metrics on metrics.addr and .port (port -1: not at all); returns the port bound."""
    if metrics.port < 0:
        return None
    registry = CollectorRegistry()
    # dcgm-exporter's `Hostname`, taken as it takes it: the pod's node in Kubernetes, else the host name.
    hostname = os.environ.get("NODE_NAME") or socket.gethostname()
    agent_metrics.register(registry, agent, hostname, metrics.nvlink_per_link)
    try:
        metrics_server, _ = start_http_server(metrics.port, addr=metrics.addr, registry=registry)
    except OSError as exc:
        raise SystemExit(f"rasd-agent: metrics {metrics.addr} port {metrics.port}: {exc.strerror}") from None
    return metrics_server.server_port


def _node_ops(settings: agent_settings.AgentSettings, backend: gpu.GpuBackend) -> node_ops.NodeOps:
    """Simulated GPUs get simulated repairs; real ones get the host's commands."""
    if backend.name == "simulated":
        return node_ops.SimulatedNodeOps(backend)  # type: ignore[arg-type]
    return node_ops.HostNodeOps(settings.commands)


async def _pet_watchdog(agent: runtime.Agent, notifier: systemd.Notifier, stop: asyncio.Event) -> None:
    """Send WATCHDOG=1 while sampling cycles keep succeeding; stay silent when they stall."""
    interval_s = notifier.watchdog_interval_s
    if interval_s is None:
        return
    while not stop.is_set():
        if time.monotonic() - agent.stats.last_cycle_ok_monotonic < 2 * interval_s:
            notifier.watchdog()
        await asyncio.sleep(interval_s)


def check(argv: Sequence[str]) -> int:
    """`rasd-agent check`: print one ok/warn/fail line per check; 1 when any failed."""
    # Imported by the subcommands that use them: the daemon would carry their imports (cryptography
    # for the certificate checks, wheel installing) in its resident set for its whole life.
    from rasd.agent import doctor

    parser = build_parser("rasd-agent check")
    parser.description = "Check that this node can run rasd-agent; each line says ok, warn or fail and what to fix."
    parser.add_argument(
        "--cert-warn-days", type=int, default=doctor.CERT_WARN_DAYS, help="warn when the certificate expires sooner"
    )
    parser.add_argument("--timeout-s", type=float, default=5.0, help="how long the controller may take to answer")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args)
    except (OSError, ValueError) as exc:
        print(doctor.Finding("config", doctor.FAIL, str(exc), "correct agent.toml or the flag named").line())
        return 1
    source = _config_path(args) or "no config file (defaults and flags)"
    print(
        doctor.Finding(
            "config",
            doctor.OK,
            f"{source}: node {settings.node_id}, controller {settings.link.controller_address}, "
            f"backend {settings.gpu.backend}",
        ).line(),
        flush=True,
    )
    findings = []
    for finding in doctor.run_checks(settings, warn_days=args.cert_warn_days, timeout_s=args.timeout_s):
        print(finding.line(), flush=True)
        findings.append(finding)
    return doctor.exit_code(findings)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the agent until SIGTERM or SIGINT, or `rasd-agent install` / `rasd-agent check`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["install"]:
        from rasd.agent import install  # see check()

        return install.main(argv[1:])
    if argv[:1] == ["check"]:
        return check(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if settings.tls.files is not None:
        try:
            settings.tls.files.read()
        except (OSError, ValueError) as exc:
            parser.error(f"tls: {exc} (or pass --insecure for plaintext to a loopback controller)")
    rasd_logging.configure(settings.log_level)
    return asyncio.run(_serve(settings))


if __name__ == "__main__":
    sys.exit(main())
