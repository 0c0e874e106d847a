"""What agents send on their streams and answer to commands, as values the controller's services work on.

`rasd.controller.wire` converts rasd.api.v1 messages into these at the edge (and back, where a
result is stored for another replica); the ingest, the repair ladder and the power loop never see
a protobuf message. A node's Hello is `fleet.NodeHello` and its health events are
`rasd.controller.store.repo.StoredEvent`, as before.

Pure: values only, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from rasd.controller.core import fleet
from rasd.controller.core.remediation.escalation import Outcome

__all__ = [
    "AgentResult",
    "CheckVerdict",
    "EnforcedLimit",
    "GpuPeak",
    "NodePower",
    "Outcome",
    "PowerSeries",
    "Telemetry",
    "TelemetrySummary",
    "ValidationRun",
    "Welcome",
]


@dataclasses.dataclass(frozen=True, slots=True)
class PowerSeries:
    """One GPU's power samples of a telemetry batch, evenly spaced."""

    gpu_uuid: str
    first_sample_unix_ns: int
    sample_interval_ms: int
    power_w: Sequence[float]


@dataclasses.dataclass(frozen=True, slots=True)
class Telemetry:
    """A validated telemetry batch: its power series and the freshest values per GPU."""

    power: tuple[PowerSeries, ...]
    latest: Mapping[str, fleet.GpuLatest]
    """The freshest values per GPU in the batch (`wire.agent.latest_from_telemetry`)."""
    newest_counters_unix_ns: int | None
    """The agent's stamp of the batch's newest counters sample (None: the batch has none)."""


@dataclasses.dataclass(frozen=True, slots=True)
class GpuPeak:
    """One GPU's highest sample over a summary interval."""

    gpu_uuid: str
    last_sample_unix_ns: int
    """When the interval's last sample was taken."""
    max_w: float


@dataclasses.dataclass(frozen=True, slots=True)
class NodePower:
    """A node's summed draw per bucket: power_w[i] over gpus[i] GPUs at first + i * interval."""

    node_id: str
    first_sample_unix_ns: int
    sample_interval_ms: int
    power_w: Sequence[float]
    gpus: Sequence[int]


@dataclasses.dataclass(frozen=True, slots=True)
class TelemetrySummary:
    """A validated telemetry summary (`TelemetrySummary` on the wire): what the controller's loops read."""

    latest: Mapping[str, fleet.GpuLatest]
    """Per GPU: its last sample, its power-loop counters, and whole counters where they came (`fleet.merge_summary`)."""
    peaks: tuple[GpuPeak, ...]
    node_power: NodePower | None
    full_rate: tuple[PowerSeries, ...]
    """The series of the GPUs the controller asked for (`FullRateRequest`)."""
    samples: int
    """Power samples the agent summarised."""
    newest_counters_unix_ns: int | None
    """The agent's stamp of the newest counters sample in it (None: none)."""
    edges: Mapping[str, Sequence[int]] = dataclasses.field(default_factory=dict)
    """Per GPU with any, its compute -> communication edges this interval, Unix ns (agent clock)."""


@dataclasses.dataclass(frozen=True, slots=True)
class EnforcedLimit:
    """A GPU's power limit as the agent read it back after a SetPowerCap."""

    gpu_uuid: str
    power_limit_w: int
    slew_target_w: int = 0
    """The target of a raise still moving there (0: none)."""
    max_raise_w_per_s: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class CheckVerdict:
    """One check of a validation run."""

    check: str
    gpu_uuid: str
    verdict: str
    """"pass", "fail", "suspect" or "software_drift"."""
    evidence: str = ""
    duration_s: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class AgentResult:
    """How a command ended, from the agent that ran it or a controller-side executor.

    ``outcome`` is an `Outcome` (an int enum whose values are rasd.api.v1.ActionOutcome's).
    """

    command_id: str
    outcome: Outcome
    message: str = ""
    started_unix_ns: int = 0
    finished_unix_ns: int = 0
    enforced_limits: tuple[EnforcedLimit, ...] = ()
    """For SetPowerCap: the limits read back after the set."""
    verdicts: tuple[CheckVerdict, ...] = ()
    """For RunValidation: each check's verdict."""
    validation_verdict: str = ""
    """For RunValidation: "pass", "fail", "suspect" or "software_drift"."""
    replayed: bool = False
    """The agent had run this command id before and answered from its journal."""
    severity: int = 0

    @property
    def outcome_name(self) -> str:
        """The outcome as the wire names it (``ACTION_OUTCOME_SUCCEEDED``): what logs, metrics and the audit show."""
        return outcome_name(self.outcome)


def outcome_name(outcome: Outcome) -> str:
    """``ACTION_OUTCOME_<NAME>``, rasd.api.v1.ActionOutcome's name of outcome."""
    return _OUTCOME_NAMES[outcome]


_OUTCOME_NAMES = {outcome: f"ACTION_OUTCOME_{outcome.name}" for outcome in Outcome}


@dataclasses.dataclass(frozen=True, slots=True)
class Welcome:
    """The controller's answer to a Hello."""

    session_id: str
    acked_seq: int
    """Every event of the node's spool with seq <= this is durably stored."""
    controller_version: str
    agent_config: Mapping[str, int]
    """AgentConfig fields (`IngestSettings.agent_config`)."""
    summaries: bool = False
    """The stream sends telemetry summaries (the agent offered them and this controller takes them)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ValidationRun:
    """An operator's validation run on a node (``rasctl validate``): not a ladder action, no ticket."""

    command_id: str
    node_id: str
    gpu_uuids: tuple[str, ...]
    """The GPUs to check (none: every GPU of the node)."""
    suite: str
    seed: int
    reason: str
    issued_unix_ns: int
    deadline_unix_ns: int
