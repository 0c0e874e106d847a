"""The agent's own data types: what a GPU is, what was sampled, what was observed, what to do.

These are frozen dataclasses independent of NVML structs and of the wire format; `rasd.agent.wire`
converts them to and from rasd.api.v1 messages. Counter fields are `None` when the GPU does not
support them, which is different from a zero count. The vocabulary shared with the controller
(severity, event kinds, command outcomes, GPU identity) is ``rasd.common.vocabulary``.
"""

from __future__ import annotations

import array
import dataclasses
import enum
from collections.abc import Mapping

from rasd.common.kernel_log import KernelEvent
from rasd.common.vocabulary import ActionOutcome as ActionOutcome
from rasd.common.vocabulary import EventKind as EventKind
from rasd.common.vocabulary import GpuInfo as GpuInfo
from rasd.common.vocabulary import Severity as Severity

# Severity, EventKind, ActionOutcome and GpuInfo are rasd's shared vocabulary (rasd.common.vocabulary),
# named here too because the agent's modules and tests know them as `model.*`.


class ClockEventReason(enum.IntFlag):
    """NVML clock event ("throttle") reason bits that rasd acts on (nvmlClocksEventReason*)."""

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100


@dataclasses.dataclass(frozen=True)
class PowerReading:
    """Instant power draw of one GPU at one moment."""

    gpu_uuid: str
    time_unix_ns: int
    power_w: float


@dataclasses.dataclass(frozen=True, slots=True)
class PowerSamples:
    """One GPU's power samples in time order, as two flat arrays: no Python object per sample."""

    gpu_uuid: str
    times_unix_ns: array.array[int]
    """array('q') of sample times, Unix ns."""
    watts: array.array[float]
    """array('d') of draws, W, as long as times_unix_ns."""


@dataclasses.dataclass(frozen=True)
class NvLinkCounters:
    """One NVLink's state and error counters; None means unsupported."""

    link: int
    active: bool
    crc_errors: int | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None


@dataclasses.dataclass(frozen=True)
class GpuCounters:
    """Slow-moving counters of one GPU (sampled at about 1 Hz). None means unsupported."""

    gpu_uuid: str
    sample_unix_ns: int
    enforced_power_limit_w: int | None = None
    requested_power_limit_w: int | None = None
    total_energy_mj: int | None = None
    temperature_c: int | None = None
    utilization_gpu_pct: int | None = None
    clock_event_reasons: int | None = None
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    pcie_replay_count: int | None = None
    recovery_action: int | None = None
    nvlinks: tuple[NvLinkCounters, ...] = ()
    power_smoothing_enabled: bool | None = None
    nvlink_sample_unix_ns: int | None = None
    """When nvlinks was read, if earlier than sample_unix_ns (backends may read links less often)."""
    power_limit_slew_target_w: int | None = None
    """The target of a raise the agent is still moving (`core.cap_slew`); None when none. Set by the
    agent's executor, not by a backend: enforced_power_limit_w stays the limit read back."""
    pcie_link_width: int | None = None
    """PCIe link lanes now; below pcie_link_width_max: trained down."""
    pcie_link_width_max: int | None = None
    pcie_link_gen: int | None = None
    """PCIe generation now (it may drop at idle to save power); below pcie_link_gen_max under load: trained down."""
    pcie_link_gen_max: int | None = None


@dataclasses.dataclass(frozen=True)
class Observation:
    """A health signal seen on the node, before it is spooled and given a sequence number."""

    kind: EventKind
    observed_unix_ns: int
    message: str
    source: str
    gpu_uuid: str = ""
    xid: int | None = None
    severity: Severity = Severity.UNSPECIFIED
    """A source's own rating where it has one (NVML counters); UNSPECIFIED for kernel-log events, which the
    controller classifies from their facts."""
    attributes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    kernel_log: KernelEvent | None = None
    """For kernel-log events: what the line said, sent as the typed ``HealthEvent.kernel_log``."""


@dataclasses.dataclass(frozen=True)
class SpooledEvent:
    """An observation with its spool sequence number: the unit the controller acks."""

    seq: int
    observation: Observation


@dataclasses.dataclass(frozen=True)
class SetPowerCap:
    """Set each listed GPU's power limit, in watts."""

    limits_w: Mapping[str, int]
    max_raise_w_per_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU -> the fastest its limit may rise to the new value, W/s (`core.cap_slew`); absent or 0:
    at once. Decreases are always set at once."""


@dataclasses.dataclass(frozen=True)
class SetPowerSmoothing:
    """Apply a power-smoothing profile to some GPUs."""

    gpu_uuids: tuple[str, ...]
    enabled: bool
    floor_pct: float
    ramp_up_w_per_s: float
    ramp_down_w_per_s: float


@dataclasses.dataclass(frozen=True)
class SetTroughFiller:
    """Emulated smoothing: the node-side trough-filler hook holds some GPUs' draw at a floor."""

    gpu_uuids: tuple[str, ...]
    enabled: bool
    floor_w: float
    """The draw held during communication phases, W per GPU."""
    ramp_down_w_per_s: float
    """Switched off, the floor falls at this rate (0: at once)."""


@dataclasses.dataclass(frozen=True)
class RestartProcess:
    """Restart the workload on one GPU: SIGTERM, then SIGKILL after grace_s."""

    gpu_uuid: str
    pids: tuple[int, ...] = ()
    systemd_unit: str = ""
    grace_s: float = 30.0


@dataclasses.dataclass(frozen=True)
class ResetGpu:
    """Reset one GPU; refused while processes run on it."""

    gpu_uuid: str


@dataclasses.dataclass(frozen=True)
class RebootNode:
    """Reboot the node through the configured command."""


@dataclasses.dataclass(frozen=True)
class RunValidation:
    """Run a rasd-validate suite on some GPUs (all when empty)."""

    suite: str
    gpu_uuids: tuple[str, ...] = ()
    seed: int = 0


Action = SetPowerCap | SetPowerSmoothing | SetTroughFiller | RestartProcess | ResetGpu | RebootNode | RunValidation


@dataclasses.dataclass(frozen=True)
class Command:
    """A controller command; command_id is its idempotency key."""

    command_id: str
    issued_unix_ns: int
    deadline_unix_ns: int
    reason: str
    action: Action
    deadline_agent_unix_ns: int = 0
    """The deadline on this node's clock, as the controller bounds it (0: none; see `runtime.on_local_clock`)."""


@dataclasses.dataclass(frozen=True)
class ActionResult:
    """What the agent answers for a command."""

    command_id: str
    outcome: ActionOutcome
    message: str
    started_unix_ns: int
    finished_unix_ns: int
    enforced_limits_w: Mapping[str, int] = dataclasses.field(default_factory=dict)
    replayed: bool = False
    slew_targets_w: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """For SetPowerCap: GPU -> the target of a raise still moving (`core.cap_slew`); the limit gets
    there without another command, so the controller counts it as in force."""
    validation_verdict: str = ""
    """For RunValidation: "pass", "fail", "suspect" or "software_drift"."""
    check_verdicts: tuple[tuple[str, str, str, str], ...] = ()
    """For RunValidation: (check, gpu, verdict, evidence) per check and GPU."""
