"""rasd-agent's settings: frozen dataclasses by concern, and `load()`, which builds them from agent.toml and flags.

`load()` is the one place that reads settings: it takes the parsed agent.toml table, the ``RASD_*``
variables and the command-line flags (flags > variables > file > defaults), checks them all with
the `AgentFile` model (`settings_file.py`, on rasd.common.settings), and names every bad one by
its key path, where it came from and what it accepts::

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
import pathlib
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import annotated_types

from rasd.agent.core import health
from rasd.common import tls

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

    power_sample_interval_ms: Annotated[int, annotated_types.Ge(1)] = 100
    """Power sampling period (10 Hz); the controller may override it in Welcome."""
    counter_interval_ms: Annotated[int, annotated_types.Ge(1)] = 1000
    """Counter sampling period (1 Hz); the controller may override it in Welcome."""
    event_poll_interval_ms: Annotated[int, annotated_types.Ge(1)] = 200
    """How often the backend is polled for health observations."""
    buffer_s: Annotated[float, annotated_types.Gt(0)] = 60.0
    """Seconds of power samples kept per GPU while the stream is down."""
    power_buffer_interval_ms: Annotated[int, annotated_types.Ge(1)] = 1000
    """Where the backend keeps its own power samples (NVML's driver buffer, `nvmlDeviceGetSamples`):
    how often the agent reads them, instead of reading every GPU every power_sample_interval_ms."""
    counters_heartbeat_s: Annotated[float, annotated_types.Gt(0)] = 30.0
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
# The checking itself (pydantic models of agent.toml) lives in settings_file.py, imported only by
# load(): an agent built from these dataclasses (rasd-sim, tests, the overhead bench) never loads
# pydantic, whose modules and models cost the agent's process MiBs for its whole life.

KeyPath = tuple[str, ...]
"""A key's place in agent.toml: ("gpus",) at the top level, ("tls", "ca") in a table."""

KernelLogSource = Literal["kmsg", "journal", "none"]
"""Where the kernel log is read from; none turns it off."""

KERNEL_LOG_SOURCES: tuple[str, ...] = typing.get_args(KernelLogSource)
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
    from rasd.agent import settings_file  # on the config path only (see above)

    return settings_file.load(table, flags, host, file_name=file_name, environ=environ)
