"""rasd-agent's settings: frozen dataclasses by concern, and `load()`, which builds them from agent.toml and flags.

`load()` is the one place that reads settings: it takes the parsed agent.toml table, the ``RASD_*``
variables and the command-line flags (flags > variables > file > defaults), checks them all with
the `AgentFile` model (rasd.common.settings), and names every bad one by its key path, where it came
from and what it accepts::

    sampling.power_sample_interval_ms (agent.toml): expected an integer, got "fast"
    gpus (--gpus): expected an integer in 1..64, got 99
    sampling.buffer_s (env RASD_SAMPLING__BUFFER_S): expected a number > 0, got 0

The rest of the agent gets the typed `AgentSettings` (or the group it needs) and never indexes a
dict by a string. Pure: `load()` reads no file and no environment (main.py passes both in); what
the defaults depend on that only the host knows (its name, whether it has InfiniBand) comes in as
`HostDefaults`.

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
import logging
import pathlib
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, NoReturn

import pydantic

from rasd.agent import gpu
from rasd.agent.core import health
from rasd.common import net, tls
from rasd.common import settings as settings_layer

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

    power_sample_interval_ms: Annotated[int, pydantic.Field(ge=1)] = 100
    """Power sampling period (10 Hz); the controller may override it in Welcome."""
    counter_interval_ms: Annotated[int, pydantic.Field(ge=1)] = 1000
    """Counter sampling period (1 Hz); the controller may override it in Welcome."""
    event_poll_interval_ms: Annotated[int, pydantic.Field(ge=1)] = 200
    """How often the backend is polled for health observations."""
    buffer_s: Annotated[float, pydantic.Field(gt=0)] = 60.0
    """Seconds of power samples kept per GPU while the stream is down."""
    power_buffer_interval_ms: Annotated[int, pydantic.Field(ge=1)] = 1000
    """Where the backend keeps its own power samples (NVML's driver buffer, `nvmlDeviceGetSamples`):
    how often the agent reads them, instead of reading every GPU every power_sample_interval_ms."""
    counters_heartbeat_s: Annotated[float, pydantic.Field(gt=0)] = 30.0
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


# ----- load: agent.toml + $RASD_* + flags -> AgentSettings ------------------------------------------

KeyPath = tuple[str, ...]
"""A key's place in agent.toml: ("gpus",) at the top level, ("tls", "ca") in a table."""

_NonEmpty = Annotated[str, pydantic.Field(min_length=1)]
_HostName = Annotated[str, pydantic.Field(min_length=1, max_length=253)]
_Argv = Annotated[tuple[_NonEmpty, ...], pydantic.Field(min_length=1)]
# Any name the logging module knows, in any case (`_settings` checks it); the schema says the same.
_LogLevel = Annotated[
    str,
    pydantic.Field(
        json_schema_extra={"pattern": "^(?i:" + "|".join(sorted(logging.getLevelNamesMapping())).lower() + ")$"}
    ),
]


KernelLogSource = Literal["kmsg", "journal", "none"]
"""Where the kernel log is read from; none turns it off."""


class _Table(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True)


class TlsTable(_Table):
    """agent.toml's [tls]: the node's certificate files (read even with insecure, so a bad one is named)."""

    ca: _NonEmpty = TLS_DEFAULTS["ca"]
    cert: _NonEmpty = TLS_DEFAULTS["cert"]
    key: _NonEmpty = TLS_DEFAULTS["key"]
    server_name: str = ""


class CommandsTable(_Table):
    """agent.toml's [commands]: each a non-empty argv replacing the default (`CommandSettings`)."""

    list_compute_apps: _Argv | None = None
    reset_gpu: _Argv | None = None
    restart_unit: _Argv | None = None
    reboot: _Argv | None = None
    validate_: _Argv | None = pydantic.Field(default=None, alias="validate")  # BaseModel has a validate()
    trough_filler: _Argv | None = None


class AgentFile(_Table):
    """agent.toml's keys, each with its type, its range or allowed values, and its default.

    None where the default depends on other keys or on the host (`load` fills it in).
    """

    node_id: _HostName | None = None
    controller: str = LinkSettings.controller_address
    insecure: bool = False
    log_level: _LogLevel = "info"
    backend: Literal[gpu.BACKEND_NAMES] = "nvml"  # type: ignore[valid-type]
    gpus: Annotated[int, pydantic.Field(ge=1, le=64)] = GpuSettings.gpus
    seed: int = GpuSettings.seed
    sim_step_period_s: Annotated[float, pydantic.Field(ge=0)] = GpuSettings.sim_step_period_s
    sim_scenario: str = ""
    state_dir: _NonEmpty = str(SpoolSettings.state_dir)
    kernel_log: KernelLogSource | None = None
    kmsg_path: _NonEmpty = KernelLogSettings.kmsg_path
    ib_sysfs_root: str | None = None
    failsafe_power_limit_w: Annotated[int, pydantic.Field(ge=50, le=5000)] | None = None
    failsafe_after_s: Annotated[float, pydantic.Field(ge=0)] = FailsafeSettings.after_s
    metrics_port: Annotated[int, pydantic.Field(ge=-1, le=65535)] = MetricsSettings.port
    metrics_addr: _HostName | None = None
    metrics_nvlink_per_link: bool = MetricsSettings.nvlink_per_link
    destructive_actions: bool = False
    labels: dict[str, str] = pydantic.Field(default_factory=dict)
    tls: TlsTable = pydantic.Field(default_factory=TlsTable)
    sampling: settings_layer.model_of(SamplingSettings) = pydantic.Field(  # type: ignore[valid-type]
        default_factory=settings_layer.model_of(SamplingSettings)
    )
    commands: CommandsTable = pydantic.Field(default_factory=CommandsTable)


CHART_SETS: tuple[str, ...] = ("node_id", "state_dir", "tls")
"""agent.toml keys the Helm chart sets itself (the Node's name, agent.stateDir, the certificates'
host path), so its ``agent.config`` leaves them out."""


def chart_config_schema() -> dict[str, Any]:
    """The JSON Schema of the chart's ``agent.config``: agent.toml's keys but `CHART_SETS`.

    No defaults: the chart renders only the keys a user sets, and the agent fills in the rest.
    """
    full = settings_layer.schema_of(AgentFile)
    properties = {key: value for key, value in full["properties"].items() if key not in CHART_SETS}
    for value in properties.values():
        value.pop("default", None)
    properties["controller"]["description"] = "host:port; default: this release's Service"
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "agent.toml key for key, except " + ", ".join(CHART_SETS) + " (set by the chart) "
        "(generated: python helm/generate_schema.py)",
        "properties": properties,
    }


KERNEL_LOG_SOURCES: tuple[str, ...] = typing.get_args(
    typing.get_args(AgentFile.model_fields["kernel_log"].annotation)[0]
)
"""Where the kernel log is read from; none turns it off."""

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
    table: Mapping[str, Any],
    flags: Mapping[str, Any],
    host: HostDefaults,
    *,
    file_name: str = "agent.toml",
    environ: Mapping[str, str] | None = None,
) -> AgentSettings:
    """Build the agent's settings: flags over ``RASD_*`` variables over agent.toml over the defaults.

    Args:
        table: agent.toml as `tomllib` parsed it ({} without a file).
        flags: argparse's values by destination (`vars(args)`); None, and False for a switch, is
            "not given". `label` is a list of KEY=VALUE.
        host: the defaults only the host knows.
        file_name: how messages name the file.
        environ: the environment (``RASD_GPUS``, ``RASD_SAMPLING__BUFFER_S`` ...); None: none.

    Raises:
        SettingsError: one line per bad setting, each naming its key path, where it came from (the
            file, the variable or the flag), what it accepts and what it got.
    """
    layers = settings_layer.Layers()
    layers.add(table, lambda path: file_name)
    layers.add(settings_layer.env_table(AgentFile, environ or {}), lambda path: f"env {settings_layer.env_name(path)}")
    given, flag_of = _flag_table(flags)
    layers.add(given, lambda path: flag_of.get(path, "--label"))
    checked, problems = settings_layer.validate(AgentFile, layers.data)
    if checked is None:
        raise SettingsError("\n".join(f"{p.dotted()} ({layers.source_of(p.path)}): {p.message}" for p in problems))
    return _settings(checked, host, lambda path, why: _refuse(layers, path, why))


def _refuse(layers: settings_layer.Layers, path: KeyPath, why: str) -> NoReturn:
    raise SettingsError(f"{'.'.join(path)} ({layers.source_of(path)}): {why}")


def _settings(file: AgentFile, host: HostDefaults, refuse: Callable[[KeyPath, str], NoReturn]) -> AgentSettings:
    """The checked keys as the agent's settings; the defaults that depend on others filled in."""
    try:
        host_name, _ = net.split_host_port(file.controller)
    except ValueError:
        refuse(("controller",), f"expected host:port, got {settings_layer.show(file.controller)}")
    # Any name the logging module knows (warn, critical, ...) works, as it did before it was checked.
    if file.log_level.upper() not in logging.getLevelNamesMapping():
        refuse(
            ("log_level",), f"expected one of debug, info, warning, error, got {settings_layer.show(file.log_level)}"
        )
    if file.insecure and not net.is_loopback_host(host_name):
        refuse(("insecure",), f"refusing plaintext gRPC to non-loopback controller {host_name!r}")
    paths = {key: pathlib.Path(getattr(file.tls, key)) for key in TLS_DEFAULTS}
    commands = file.commands.model_dump(by_alias=True, exclude_none=True)
    return AgentSettings(
        node_id=file.node_id or host.hostname,
        labels=dict(file.labels),
        log_level=file.log_level,
        link=LinkSettings(controller_address=file.controller),
        tls=TlsSettings(files=None if file.insecure else tls.TlsFiles(**paths), server_name=file.tls.server_name),
        gpu=GpuSettings(
            backend=file.backend,
            gpus=file.gpus,
            seed=file.seed,
            sim_step_period_s=file.sim_step_period_s,
            sim_scenario=file.sim_scenario or None,
        ),
        sampling=settings_layer.to_dataclass(file.sampling),
        spool=SpoolSettings(state_dir=pathlib.Path(file.state_dir)),
        kernel_log=KernelLogSettings(
            source=file.kernel_log or ("kmsg" if file.backend == "nvml" else "none"), kmsg_path=file.kmsg_path
        ),
        ib=IbSettings(sysfs_root=_ib_sysfs_root(file, host)),
        failsafe=FailsafeSettings(power_limit_w=file.failsafe_power_limit_w, after_s=file.failsafe_after_s),
        metrics=MetricsSettings(
            port=file.metrics_port,
            addr=file.metrics_addr or ("127.0.0.1" if file.insecure else MetricsSettings.addr),
            nvlink_per_link=file.metrics_nvlink_per_link,
        ),
        actions=ActionSettings(destructive_enabled=file.destructive_actions),
        commands=CommandSettings(**commands),
    )


def _ib_sysfs_root(file: AgentFile, host: HostDefaults) -> str:
    """As set ("" reads none), else IB_SYSFS_ROOT where the host has it."""
    if file.ib_sysfs_root is not None:
        return file.ib_sysfs_root
    return IB_SYSFS_ROOT if host.ib_sysfs_present else ""


def _flag_table(flags: Mapping[str, Any]) -> tuple[dict[str, Any], dict[KeyPath, str]]:
    """The flags given as a table like agent.toml's, and the flag that set each key path."""
    table: dict[str, Any] = {}
    flag_of: dict[KeyPath, str] = {}
    for dest, (path, flag) in FLAGS.items():
        value = flags.get(dest)
        if value is None or value is False:  # not given (a switch's False is its absence)
            continue
        node = table
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = str(value) if isinstance(value, pathlib.PurePath) else value
        flag_of[path] = flag
    for pair in flags.get("label") or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SettingsError(f"--label: expected KEY=VALUE, got {settings_layer.show(pair)}")
        table.setdefault("labels", {})[key] = value
    return table, flag_of
