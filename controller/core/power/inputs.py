"""What one power period decides from: the values the power loop gathers before `period.step`.

This module owns the input types of the power core: the fleet as the ingest knew it (`FleetView`),
the aggregate and per-GPU power the ingest's window held (`WindowView`, read as `WindowReads` asked),
what came back from commands sent earlier (acks, unanswered profiles, BMC results), and the loop's
own settings that shape a period (`PeriodConfig`). Every field is a plain value, so a recorded
period replays through `period.step` to the same commands.

Pure: no I/O, no logging, no clock reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rasd.controller.core import aggregates, fleet
from rasd.controller.core.power import apply as power_apply

Rows = tuple[tuple[int, float, int], ...]
"""`fleet.PowerWindow.series` rows: (bucket start unix ns, summed W, GPUs reporting)."""


@dataclasses.dataclass(frozen=True)
class PeriodConfig:
    """The loop's settings that shape a period (from `[power]`; see `PowerSettings`)."""

    telemetry_stale_s: float = 5.0
    """A GPU whose last power sample is older than this is treated as drawing at its cap."""
    detect_window_s: float = 20.0
    """Unmanaged aggregate power the swing detector needs before it plans smoothing, s."""
    bmc_fallback_after_s: float = 10.0
    """A node without a stream this long whose caps must come down gets a BMC power limit."""
    draw_window_s: float = 5.0
    """A GPU's draw is its peak over at least this long (`allocate.draw_window_s`)."""


@dataclasses.dataclass(frozen=True, eq=False)
class FleetView:
    """The fleet as the ingest knew it when the period began."""

    records: Mapping[str, fleet.GpuRecord]
    """GPU uuid -> its record from its node's Hello to this process."""
    known_records: Mapping[str, fleet.GpuRecord]
    """GPU uuid -> its record in the store when the loop started (agents not back yet count too)."""
    gpu_nodes: Mapping[str, str]
    """GPU uuid -> the node whose stream announced it last."""
    node_gpus: Mapping[str, tuple[str, ...]]
    """Node -> the GPU uuids of its last Hello (the nodes a smoothing command may go to)."""
    boot_ids: Mapping[str, str]
    """Node -> the boot id of its last Hello."""
    sessions: Mapping[str, str]
    """Node -> the id of its stream, for the nodes connected now."""
    node_labels: Mapping[str, Mapping[str, str]]
    """Node -> its labels (the tree's nodes)."""
    latest: Mapping[str, fleet.GpuLatest]
    """GPU uuid -> its latest telemetry (agent timestamps)."""
    latest_controller_ns: Mapping[str, int]
    """GPU uuid -> when its latest counters were sampled, in controller time, unix ns."""
    telemetry_interval_s: float = 1.0
    """How often agents send telemetry batches, s (the delay before a change shows)."""
    latest_block: aggregates.LatestBlock | None = dataclasses.field(default=None, metadata={"recorded": False})
    """Some GPUs' `latest` and `latest_controller_ns` as columns, exactly (the other replicas' GPUs,
    `core.power.remote`); None: none. Derived from the mappings, so a recording leaves it out."""


@dataclasses.dataclass(frozen=True)
class WindowReads:
    """What to read from the ingest's power window this period (`period.window_reads`)."""

    draw_since_unix_ns: int
    """Each GPU's peak since then is its draw."""
    detect_since_unix_ns: int | None
    """The detector's window: aggregate power since then feeds the swing detector (the core cuts it
    later where it must), and each GPU's peak since then sizes a new plan's ramp; None while a plan
    is in force (no new one can be made)."""
    swing_tracked: bool
    """The detector reads the tracked GPUs' sum (the canaries) instead of the whole fleet's."""
    status_since_unix_ns: int
    """Aggregate power since then feeds the status's swing figures."""


@dataclasses.dataclass(frozen=True, eq=False)
class WindowView:
    """What the power window held, read as `WindowReads` asked."""

    sample_hz: float
    """Buckets per second."""
    draw_peaks_w: Mapping[str, float]
    status_rows: Rows
    swing_rows: Rows = ()
    """Empty when not read (a plan is in force)."""
    straggler_peaks_w: Mapping[str, float] | None = None
    """None when not read (a plan is in force)."""


@dataclasses.dataclass(frozen=True)
class NodeLimitResult:
    """What a BMC answered to a `commands.SetNodeLimit`."""

    node_id: str
    limit_w: int | None
    """The limit asked for (None: lift)."""
    read_back_w: int | None
    """The limit read back (None: none in force)."""
    at_s: float
    """When the answer came, controller time (s)."""
    targets_w: Mapping[str, int]
    """The GPU targets the limit covers (as asked)."""
    failed: bool = False
    """The BMC could not be reached or refused: the node keeps counting at its last known caps."""


@dataclasses.dataclass(frozen=True)
class SendOutcomes:
    """What came of the smoothing commands sent since the last period (caps come back as acks)."""

    start_unanswered: frozenset[str] = frozenset()
    """GPUs whose job-start profile command went unanswered: sent again, in whichever state is due."""
    start_answered_nodes: frozenset[str] = frozenset()
    """Nodes that answered a job-start profile command (if the swing plan took over meanwhile, it
    goes to them again: the start profile may have landed after it)."""
    smoothing_unanswered_nodes: frozenset[str] = frozenset()
    """Nodes whose swing-plan command went unanswered: sent again next period."""


@dataclasses.dataclass(frozen=True, eq=False)
class PeriodInputs:
    """Everything one period decides from besides the carried state and the time."""

    fleet: FleetView
    window: WindowView
    quarantined_nodes: frozenset[str] = frozenset()
    quarantined_gpus: frozenset[str] = frozenset()
    repairing_gpus: frozenset[str] = frozenset()
    """GPUs a repair may return to their default power limit now (a GPU reset, its node's reboot):
    from when the ladder hands the repair over until its outcome is known. Each counts at its
    maximum and keeps it in the allocation, so that the repair leaves only into watts the budget
    holds for it (invariant 1: a reset or a reboot raises a GPU's limit without a cap command)."""
    repairing_ids: frozenset[str] = frozenset()
    """The command ids of the repairs counted in `repairing_gpus` (the loop sends those a period
    found room for: `core.power.repairs.due`)."""
    acks: tuple[power_apply.CapAck, ...] = ()
    """SetPowerCap results since the last period, per GPU."""
    node_limit_results: tuple[NodeLimitResult, ...] = ()
    bmc_nodes: frozenset[str] = frozenset()
    """Nodes with a BMC to ask for a node power limit."""
    outcomes: SendOutcomes = dataclasses.field(default_factory=SendOutcomes)
    floors_w: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU -> the least cap it should get within the budgets' headroom, W (`core.power.floors`: a
    straggler's raise); a GPU not here has none."""
