"""rasd-agent's settings: frozen dataclasses by concern, and `load()`, which builds them from agent.toml and flags.

`load()` is the one place that reads settings: it takes the parsed agent.toml table and the
command-line flags (flags win), checks every value, and names the offending key path, where it came
from and what it accepts::

    agent.toml: [sampling] power_sample_interval_ms: expected an integer > 0, got "fast"
    --gpus: expected an integer in 1..64, got 99

The rest of the agent gets the typed `AgentSettings` (or the group it needs) and never indexes a
dict by a string. Pure: `load()` reads no file and no environment; what the defaults depend on that
only the host knows (its name, whether it has InfiniBand) comes in as `HostDefaults`.

agent.toml keys (agent/packaging/agent.toml) and the groups they fill:

| key (flag) | group.field |
|---|---|
| node_id (--node-id), [labels] (--label), log_level (--log-level) | AgentSettings itself |
| controller (--controller) | link.controller_address |
| insecure (--insecure), [tls] ca, cert, key, server_name (--tls-*) | tls |
| backend, gpus, seed, sim_step_period_s, sim_scenario (same flags) | gpu |
| [sampling] power_sample_interval_ms, counter_interval_ms, event_poll_interval_ms, buffer_s, | sampling |
| [sampling] power_buffer_interval_ms, counters_heartbeat_s | sampling |
| state_dir (--state-dir) | spool.state_dir |
| kernel_log, kmsg_path (--kernel-log, --kmsg-path) | kernel_log |
| ib_sysfs_root (--ib-sysfs-root) | ib.sysfs_root |
| failsafe_power_limit_w, failsafe_after_s (same flags) | failsafe |
| metrics_port, metrics_addr (--metrics-port, --metrics-addr), metrics_nvlink_per_link | metrics |
| destructive_actions (--enable-destructive-actions) | actions.destructive_enabled |
| [commands] reset_gpu, reboot, validate, ... | commands |

Fields without a key (reconnect backoff, keepalive, health thresholds, ...) keep their defaults in
a daemon; tests and rasd-sim set them by building the dataclasses.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from rasd.agent import gpu
from rasd.agent.core import health
from rasd.common import net, tls

KERNEL_LOG_SOURCES = ("kmsg", "journal", "none")
"""Where the kernel log is read from; none turns it off."""
TLS_DEFAULTS = {"ca": "/etc/rasd/tls/ca.crt", "cert": "/etc/rasd/tls/agent.crt", "key": "/etc/rasd/tls/agent.key"}
"""Where a systemd agent finds its certificate (README, "Certificates")."""
IB_SYSFS_ROOT = "/sys/class/infiniband"
"""The InfiniBand sysfs root read when the host has one and the settings name none."""


class SettingsError(ValueError):
    """A setting is unknown or has a bad value; the message names its key path (or flag)."""


# ----- the settings --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LinkSettings:
    """How the agent reaches the controller and paces what it sends."""

    controller_address: str = "127.0.0.1:7443"
    """host:port of the controller's gRPC endpoint."""
    telemetry_send_interval_ms: int = 1000
    """How often buffered telemetry goes out."""
    heartbeat_interval_ms: int = 5000
    """Heartbeat period when nothing else is sent."""
    reconnect_initial_s: float = 0.5
    """First reconnect delay; doubles per failure up to reconnect_max_s (full jitter)."""
    reconnect_max_s: float = 30.0
    """Upper bound of the reconnect delay."""
    welcome_timeout_s: float = 10.0
    """How long to wait for Welcome after Hello before reconnecting."""
    keepalive_time_s: float = tls.CLIENT_KEEPALIVE_TIME_MS / 1000
    """Ping the controller after this long without a frame: finds a controller gone silent (crash,
    partition, SIGSTOP) in keepalive_time_s + keepalive_timeout_s instead of TCP's many minutes."""
    keepalive_timeout_s: float = tls.CLIENT_KEEPALIVE_TIMEOUT_MS / 1000
    """How long an unanswered ping may wait before the stream is declared dead and the agent reconnects."""
    max_events_per_message: int = 500
    """Cap on events per HealthEventBatch."""
    telemetry_summaries: bool = True
    """Offer the controller telemetry summaries (`core.summary`); False sends every sample, as agents
    before summaries did (for comparisons and tests)."""


@dataclasses.dataclass(frozen=True)
class TlsSettings:
    """Mutual TLS to the controller."""

    files: tls.TlsFiles | None = None
    """This node's client certificate and the CA the controller's must chain to; None: plaintext
    (loopback only; agent.toml `insecure = true`, whose default is mutual TLS with TLS_DEFAULTS). The
    files are re-read at every reconnect, so a renewed certificate needs no restart."""
    server_name: str = ""
    """Name to verify in the controller's certificate when it differs from the dialled host."""


@dataclasses.dataclass(frozen=True)
class GpuSettings:
    """Which GPU backend the agent opens, and how the simulated one behaves."""

    backend: str = "nvml"
    """One of `rasd.agent.gpu.BACKEND_NAMES`."""
    gpus: int = 8
    """Simulated backend: number of GPUs (1..64)."""
    seed: int = 0
    """Simulated backend: seed of its GPUs' identities and noise."""
    sim_step_period_s: float = 2.0
    """Simulated backend: training step period; 0 leaves the GPUs idle."""
    sim_scenario: str | None = None
    """Simulated backend: TOML file of scripted faults for this node; None: none."""


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """How often the agent reads its GPUs, and how much it keeps while the controller is away."""

    power_sample_interval_ms: int = 100
    """Power sampling period (10 Hz); the controller may override it in Welcome."""
    counter_interval_ms: int = 1000
    """Counter sampling period (1 Hz); the controller may override it in Welcome."""
    event_poll_interval_ms: int = 200
    """How often the backend is polled for health observations."""
    buffer_s: float = 60.0
    """Seconds of power samples kept per GPU while the stream is down."""
    power_buffer_interval_ms: int = 1000
    """Where the backend keeps its own power samples (NVML's driver buffer, `nvmlDeviceGetSamples`):
    how often the agent reads them, instead of reading every GPU every power_sample_interval_ms."""
    counters_heartbeat_s: float = 30.0
    """With telemetry summaries: every GPU's counters go out at least this often; otherwise a GPU's
    counters go out only when they change (`core.summary.counters_changed`)."""


@dataclasses.dataclass(frozen=True)
class SpoolSettings:
    """The durable event spool and executed-command journal."""

    state_dir: pathlib.Path = pathlib.Path("/var/lib/rasd-agent")
    """Where the spool (spool.db) and the kernel-log cursors live (systemd's StateDirectory)."""
    read_page_events: int = 10_000
    """Events read from the spool at a time when sending; a larger backlog is read page after page."""


@dataclasses.dataclass(frozen=True)
class KernelLogSettings:
    """Where kernel-log faults (Xid, fallen off the bus, SXid, mlx5) are read from."""

    source: str = "none"
    """One of KERNEL_LOG_SOURCES; agent.toml's default follows the backend: kmsg with nvml, else none."""
    kmsg_path: str = "/dev/kmsg"
    """kmsg device, FIFO or file (a file's plain-text lines are followed by byte offset)."""


@dataclasses.dataclass(frozen=True)
class IbSettings:
    """InfiniBand port counters (link flaps)."""

    sysfs_root: str = ""
    """The InfiniBand sysfs root; "" reads none (agent.toml's default: IB_SYSFS_ROOT where present)."""
    poll_interval_s: float = 1.0
    """How often the port counters are read."""


@dataclasses.dataclass(frozen=True)
class FailsafeSettings:
    """The power fail-safe after losing the controller (DESIGN.md invariant 6)."""

    power_limit_w: int | None = None
    """The safe cap per GPU; None disables the fail-safe. It only ever lowers a cap."""
    after_s: float = 300.0
    """After this long without a controller stream, apply the fail-safe power limit."""


@dataclasses.dataclass(frozen=True)
class MetricsSettings:
    """The Prometheus exporter."""

    port: int = 8455
    """TCP port of the exporter; -1 disables it, 0 picks a free one. Not dcgm-exporter's 9400 nor
    node-exporter's 9100, which run on the same GPU nodes (docs/metrics.md says why 8455)."""
    nvlink_per_link: bool = False
    """Export NVLink state and errors per link too (18 links per H100: most of a node's series);
    the per-GPU sums are always exported."""
    addr: str = "0.0.0.0"
    """Address it binds. Unless set: every interface (the cluster's scraper), but loopback with
    `insecure`: a plaintext agent talks to a loopback controller (a demo, a developer's), and its
    metrics (node name, GPU uuids, labels) were open to the network all the same."""


@dataclasses.dataclass(frozen=True)
class ActionSettings:
    """What the agent may do on its own node."""

    destructive_enabled: bool = False
    """Allow restart, reset, reboot and validation; otherwise they are answered DRY_RUN."""
    validation_timeout_s: float = 3600.0
    """Upper bound for one rasd-validate run (the suites enforce their own budgets below this)."""
    kill_poll_s: float = 0.2
    """How often a process is checked for exit during the SIGTERM grace period."""
    cap_slew_step_s: float = 0.1
    """How often a slewing raise moves the limit (`step_slews`); each step at most rate x this."""
    reboot_grace_s: float = 600.0
    """How long after a reboot command the node may take to go down; the repairs and validations
    that arrive meanwhile wait for it. A node still up after this did not reboot: they are answered
    FAILED, and the ladder climbs."""


@dataclasses.dataclass(frozen=True)
class CommandSettings:
    """Command lines for real nodes' repairs; "{gpu_uuid}" and "{unit}" are substituted."""

    list_compute_apps: tuple[str, ...] = (
        "nvidia-smi",
        "--query-compute-apps=gpu_uuid,pid",
        "--format=csv,noheader,nounits",
    )
    reset_gpu: tuple[str, ...] = ("nvidia-smi", "--gpu-reset", "-i", "{gpu_uuid}")
    restart_unit: tuple[str, ...] = ("systemctl", "restart", "{unit}")
    reboot: tuple[str, ...] = ("systemctl", "reboot")
    validate: tuple[str, ...] = ("rasd-validate", "--device", "cuda", "--json")
    trough_filler: tuple[str, ...] = ()
    """The site's trough-filler hook (emulated power smoothing on GPUs without firmware smoothing);
    empty: none. "{gpu_uuids}" (comma-separated), "{floor_w}" and "{ramp_down_w_per_s}" are
    substituted; floor 0 means stop. The hook must return at once and keep the filler running in the
    background (e.g. a low-priority MPS kernel that only runs while the job's kernels do not); see
    README, "Power"."""
    timeout_s: float = 120.0
    """Limit for every command except validation, which has its own (not settable in [commands])."""


@dataclasses.dataclass(frozen=True)
class AgentSettings:
    """Everything one agent is configured with, by concern."""

    node_id: str
    """This node's id (agent.toml's default: the hostname); its certificate must name it."""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Topology labels (rack, row, nvlink_domain, power_feed) used for blast-radius limits."""
    log_level: str = "info"
    """debug, info, warning or error."""
    link: LinkSettings = LinkSettings()
    tls: TlsSettings = TlsSettings()
    gpu: GpuSettings = GpuSettings()
    sampling: SamplingSettings = SamplingSettings()
    spool: SpoolSettings = SpoolSettings()
    kernel_log: KernelLogSettings = KernelLogSettings()
    ib: IbSettings = IbSettings()
    failsafe: FailsafeSettings = FailsafeSettings()
    metrics: MetricsSettings = MetricsSettings()
    health: health.HealthThresholds = dataclasses.field(default_factory=health.HealthThresholds)
    """Rates above which rising GPU counters become health events."""
    actions: ActionSettings = ActionSettings()
    commands: CommandSettings = CommandSettings()


@dataclasses.dataclass(frozen=True)
class HostDefaults:
    """The defaults only the host can give; main.py reads them, so that `load()` does no I/O."""

    hostname: str
    """The default node_id."""
    ib_sysfs_present: bool
    """Whether IB_SYSFS_ROOT exists: the default ib_sysfs_root then."""


# ----- load: agent.toml + flags -> AgentSettings ---------------------------------------------------

KeyPath = tuple[str, ...]
"""A key's place in agent.toml: ("gpus",) at the top level, ("tls", "ca") in a table."""

SCALAR_KEYS = (
    "node_id", "controller", "insecure", "log_level", "backend", "gpus", "seed", "sim_step_period_s",
    "sim_scenario", "state_dir", "kernel_log", "kmsg_path", "ib_sysfs_root", "failsafe_power_limit_w",
    "failsafe_after_s", "metrics_port", "metrics_addr", "metrics_nvlink_per_link", "destructive_actions",
)  # fmt: skip
"""The top-level keys of agent.toml that hold a value."""
TABLE_KEYS: dict[str, tuple[str, ...] | None] = {
    "labels": None,  # any key: the label's name
    "tls": ("ca", "cert", "key", "server_name"),
    "sampling": tuple(f.name for f in dataclasses.fields(SamplingSettings)),
    "commands": tuple(f.name for f in dataclasses.fields(CommandSettings) if f.name != "timeout_s"),
}
"""The tables of agent.toml and the keys each takes (None: any)."""
FLAGS: dict[str, tuple[KeyPath, str]] = {
    "node_id": (("node_id",), "--node-id"),
    "controller": (("controller",), "--controller"),
    "insecure": (("insecure",), "--insecure"),
    "log_level": (("log_level",), "--log-level"),
    "backend": (("backend",), "--backend"),
    "gpus": (("gpus",), "--gpus"),
    "seed": (("seed",), "--seed"),
    "sim_step_period_s": (("sim_step_period_s",), "--sim-step-period-s"),
    "sim_scenario": (("sim_scenario",), "--sim-scenario"),
    "state_dir": (("state_dir",), "--state-dir"),
    "kernel_log": (("kernel_log",), "--kernel-log"),
    "kmsg_path": (("kmsg_path",), "--kmsg-path"),
    "ib_sysfs_root": (("ib_sysfs_root",), "--ib-sysfs-root"),
    "failsafe_power_limit_w": (("failsafe_power_limit_w",), "--failsafe-power-limit-w"),
    "failsafe_after_s": (("failsafe_after_s",), "--failsafe-after-s"),
    "metrics_port": (("metrics_port",), "--metrics-port"),
    "metrics_addr": (("metrics_addr",), "--metrics-addr"),
    "destructive_actions": (("destructive_actions",), "--enable-destructive-actions"),
    "tls_ca": (("tls", "ca"), "--tls-ca"),
    "tls_cert": (("tls", "cert"), "--tls-cert"),
    "tls_key": (("tls", "key"), "--tls-key"),
    "tls_server_name": (("tls", "server_name"), "--tls-server-name"),
}
"""argparse destination -> (the key path it overrides, the flag as typed). --label is read apart."""


def load(
    table: Mapping[str, Any], flags: Mapping[str, Any], host: HostDefaults, *, file_name: str = "agent.toml"
) -> AgentSettings:
    """Build the agent's settings from agent.toml's table and the flags set (flags win).

    Args:
        table: agent.toml as `tomllib` parsed it ({} without a file).
        flags: argparse's values by destination (`vars(args)`); None, and False for a switch, is
            "not given". `label` is a list of KEY=VALUE.
        host: the defaults only the host knows.
        file_name: how messages name the file.

    Raises:
        SettingsError: an unknown key or a bad value; the message names its key path or flag, what
            it accepts, and what it got.
    """
    source = _Source(table, _flag_values(flags), file_name)
    source.check_keys()
    gpu_settings = _gpu(source)
    tls_settings = _tls(source)
    settings = AgentSettings(
        node_id=source.string(("node_id",), host.hostname, max_length=253),
        labels=_labels(source, flags.get("label") or ()),
        log_level=_log_level(source),
        link=LinkSettings(controller_address=_controller_address(source)),
        tls=tls_settings,
        gpu=gpu_settings,
        sampling=_sampling(source),
        spool=SpoolSettings(state_dir=pathlib.Path(source.string(("state_dir",), str(SpoolSettings.state_dir)))),
        kernel_log=KernelLogSettings(
            source=source.choice(
                ("kernel_log",), "kmsg" if gpu_settings.backend == "nvml" else "none", KERNEL_LOG_SOURCES
            ),
            kmsg_path=source.string(("kmsg_path",), KernelLogSettings.kmsg_path),
        ),
        ib=IbSettings(
            sysfs_root=source.string(
                ("ib_sysfs_root",), IB_SYSFS_ROOT if host.ib_sysfs_present else "", allow_empty=True
            )
        ),
        failsafe=FailsafeSettings(
            power_limit_w=source.optional_integer(("failsafe_power_limit_w",), low=50, high=5000, unit="W"),
            after_s=source.number(("failsafe_after_s",), FailsafeSettings.after_s, minimum=0.0),
        ),
        metrics=_metrics(source, plaintext=tls_settings.files is None),
        actions=ActionSettings(destructive_enabled=source.boolean(("destructive_actions",), False)),
        commands=_commands(source),
    )
    if settings.tls.files is None:
        host_name, _ = net.split_host_port(settings.link.controller_address)
        if not net.is_loopback_host(host_name):
            source.refuse(("insecure",), f"refusing plaintext gRPC to non-loopback controller {host_name!r}")
    return settings


def _metrics(source: _Source, *, plaintext: bool) -> MetricsSettings:
    """The exporter's port and address; loopback by default for a plaintext agent (`MetricsSettings.addr`)."""
    return MetricsSettings(
        port=source.integer(("metrics_port",), MetricsSettings.port, low=-1, high=65535),
        addr=source.string(("metrics_addr",), "127.0.0.1" if plaintext else MetricsSettings.addr, max_length=253),
        nvlink_per_link=source.boolean(("metrics_nvlink_per_link",), MetricsSettings.nvlink_per_link),
    )


def _gpu(source: _Source) -> GpuSettings:
    scenario = source.string(("sim_scenario",), "", allow_empty=True)
    return GpuSettings(
        backend=source.choice(("backend",), GpuSettings.backend, gpu.BACKEND_NAMES),
        gpus=source.integer(("gpus",), GpuSettings.gpus, low=1, high=64),
        seed=source.integer(("seed",), GpuSettings.seed),
        sim_step_period_s=source.number(("sim_step_period_s",), GpuSettings.sim_step_period_s, minimum=0.0),
        sim_scenario=scenario or None,
    )


def _sampling(source: _Source) -> SamplingSettings:
    def interval_ms(name: str) -> int:
        return source.integer(("sampling", name), getattr(SamplingSettings, name), low=1)

    return SamplingSettings(
        power_sample_interval_ms=interval_ms("power_sample_interval_ms"),
        counter_interval_ms=interval_ms("counter_interval_ms"),
        event_poll_interval_ms=interval_ms("event_poll_interval_ms"),
        buffer_s=source.number(("sampling", "buffer_s"), SamplingSettings.buffer_s, above=0.0),
        power_buffer_interval_ms=interval_ms("power_buffer_interval_ms"),
        counters_heartbeat_s=source.number(
            ("sampling", "counters_heartbeat_s"), SamplingSettings.counters_heartbeat_s, above=0.0
        ),
    )


def _tls(source: _Source) -> TlsSettings:
    """Mutual TLS with the [tls] files (TLS_DEFAULTS where unset), or plaintext with `insecure`."""
    # Read even when insecure, so that a bad value is named rather than ignored.
    paths = {key: source.string(("tls", key), default) for key, default in TLS_DEFAULTS.items()}
    server_name = source.string(("tls", "server_name"), "", allow_empty=True)
    if source.boolean(("insecure",), False):
        return TlsSettings(files=None, server_name=server_name)
    files = tls.TlsFiles(ca=pathlib.Path(paths["ca"]), cert=pathlib.Path(paths["cert"]), key=pathlib.Path(paths["key"]))
    return TlsSettings(files=files, server_name=server_name)


def _controller_address(source: _Source) -> str:
    path = ("controller",)
    address = source.string(path, LinkSettings.controller_address)
    try:
        net.split_host_port(address)
    except ValueError:
        source.fail(path, "host:port", address)
    return address


def _log_level(source: _Source) -> str:
    path = ("log_level",)
    level = source.string(path, AgentSettings.log_level)
    # Any name the logging module knows (warn, critical, ...) works, as it did before it was checked.
    if level.upper() not in logging.getLevelNamesMapping():
        source.fail(path, "one of debug, info, warning, error", level)
    return level


def _labels(source: _Source, flag_pairs: Sequence[str]) -> dict[str, str]:
    """[labels] with each --label KEY=VALUE added over it."""
    labels = {}
    for key, value in source.table("labels").items():
        if not isinstance(value, str):
            source.fail(("labels", key), "a string", value)
        labels[key] = value
    for pair in flag_pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SettingsError(f"--label: expected KEY=VALUE, got {_show(pair)}")
        labels[key] = value
    return labels


def _commands(source: _Source) -> CommandSettings:
    overrides = {}
    for name in source.table("commands"):
        argv = source.raw(("commands", name), None)
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            source.fail(("commands", name), "a non-empty list of strings", argv)
        overrides[name] = tuple(argv)
    return CommandSettings(**overrides)


def _flag_values(flags: Mapping[str, Any]) -> dict[KeyPath, tuple[Any, str]]:
    """The flags given, by the key path they override, with how each was typed."""
    given = {}
    for dest, (path, flag) in FLAGS.items():
        value = flags.get(dest)
        if value is None or value is False:  # not given (a switch's False is its absence)
            continue
        given[path] = (str(value) if isinstance(value, pathlib.PurePath) else value, flag)
    return given


def _show(value: object) -> str:
    """A value as agent.toml would spell it: "fast", true, 12."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


class _Source:
    """agent.toml's table and the flags given, read by key path and checked; flags win."""

    def __init__(self, table: Mapping[str, Any], flags: Mapping[KeyPath, tuple[Any, str]], file_name: str) -> None:
        self._table = table
        self._flags = flags
        self._file = file_name

    def where(self, path: KeyPath) -> str:
        """How a message names the key: its flag when one set it, else its place in the file."""
        if path in self._flags:
            return self._flags[path][1]
        if len(path) == 1:
            return f"{self._file}: {path[0]}"
        return f"{self._file}: [{path[0]}] {'.'.join(path[1:])}"

    def fail(self, path: KeyPath, expected: str, value: object) -> NoReturn:
        """Raise SettingsError for a value that is not what the key takes."""
        raise SettingsError(f"{self.where(path)}: expected {expected}, got {_show(value)}")

    def refuse(self, path: KeyPath, why: str) -> NoReturn:
        """Raise SettingsError for a value that is well-formed but not allowed with the others."""
        raise SettingsError(f"{self.where(path)}: {why}")

    def check_keys(self) -> None:
        """Refuse unknown keys, and a table key that holds no table, naming the key."""
        for key, value in self._table.items():
            if key in TABLE_KEYS:
                if not isinstance(value, Mapping):
                    raise SettingsError(f"{self._file}: [{key}]: expected a table, got {_show(value)}")
                known = TABLE_KEYS[key]
                unknown = sorted(set(value) - set(known)) if known is not None else []
                if unknown:
                    raise SettingsError(
                        f"{self._file}: [{key}] {unknown[0]}: unknown key (known: {', '.join(known or ())})"
                    )
            elif key not in SCALAR_KEYS:
                known_keys = ", ".join(sorted((*SCALAR_KEYS, *TABLE_KEYS)))
                raise SettingsError(f"{self._file}: {key}: unknown key (known: {known_keys})")

    def table(self, name: str) -> Mapping[str, Any]:
        """A table of the file ({} when absent); `check_keys` made sure it is one."""
        return self._table.get(name, {})

    def raw(self, path: KeyPath, default: Any) -> Any:
        """The value at path as given (flag first), or default."""
        if path in self._flags:
            return self._flags[path][0]
        node: Mapping[str, Any] = self._table
        for part in path[:-1]:
            node = node.get(part, {})
        return node.get(path[-1], default)

    def string(self, path: KeyPath, default: str, *, allow_empty: bool = False, max_length: int | None = None) -> str:
        """A string: non-empty unless allow_empty ("" then means none), at most max_length characters."""
        value = self.raw(path, default)
        if not isinstance(value, str):
            self.fail(path, "a string", value)
        if max_length is not None and not 1 <= len(value) <= max_length:
            self.fail(path, f"a string of 1..{max_length} characters", value)
        if not value and not allow_empty:
            self.fail(path, "a non-empty string", value)
        return value

    def choice(self, path: KeyPath, default: str, choices: Sequence[str]) -> str:
        """One of choices."""
        value = self.raw(path, default)
        if value not in choices:
            self.fail(path, f"one of {', '.join(choices)}", value)
        return value

    def boolean(self, path: KeyPath, default: bool) -> bool:
        """true or false."""
        value = self.raw(path, default)
        if not isinstance(value, bool):
            self.fail(path, "true or false", value)
        return value

    def integer(self, path: KeyPath, default: int, *, low: int | None = None, high: int | None = None) -> int:
        """An integer, in low..high where given."""
        value = self.raw(path, default)
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and ((low is not None and value < low) or (high is not None and value > high)):
            ok = False
        if not ok:
            self.fail(path, _integer_range(low, high), value)
        return value

    def optional_integer(self, path: KeyPath, *, low: int, high: int, unit: str) -> int | None:
        """An integer in low..high, or None when the key is absent."""
        value = self.raw(path, None)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            self.fail(path, f"an integer in {low}..{high} ({unit})", value)
        return value

    def number(
        self, path: KeyPath, default: float, *, minimum: float | None = None, above: float | None = None
    ) -> float:
        """A number (an integer is widened), >= minimum or > above where given."""
        value = self.raw(path, default)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok and ((minimum is not None and value < minimum) or (above is not None and value <= above)):
            ok = False
        if not ok:
            bound = f" >= {minimum:g}" if minimum is not None else f" > {above:g}" if above is not None else ""
            self.fail(path, f"a number{bound}", value)
        return float(value)


def _integer_range(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"an integer in {low}..{high}"
    if low is not None:
        return f"an integer >= {low}" if low != 1 else "an integer > 0"
    return "an integer"
