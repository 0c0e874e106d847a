"""How the power period sees the fleet: which GPUs count, and what each one draws, holds and needs.

This module owns the step from the gathered telemetry (`inputs.FleetView`) to the allocator's
`allocate.GpuViews`:

- **inventory** (`inventory`): every GPU of the tree's nodes whose cap counts, whether its agent is
  connected or not: known from its node's Hello to this process, from the store (read at start), or
  from the apply state;
- **read-backs** (`readbacks`): the enforced limits in telemetry, in controller time, at the most
  that may be in force (a raise the agent is still slewing counts at its target);
- **draw** (`gpu_views`): each GPU's peak over the draw window (`allocate.draw_window_s`; a window
  inside a communication trough would read a busy GPU at its trough), its latest draw when it is
  idle, and the cap that may be in force when its telemetry is stale; SW-power-cap throttling (and a
  job-start ramp still rising) marks it capped; nodes without a stream are unreachable; GPUs whose
  cap went up less than one detected step plus one telemetry batch ago are settling; quarantined
  GPUs (or GPUs of quarantined nodes) the work has left are ineligible (`allocate.released`);
  GPUs under a repair that may return them to their default limit keep their maximum; a GPU's
  floor (`inputs.PeriodInputs.floors_w`, a straggler's raise) is its floor column;
- **idleness** (`LatestColumns.idle`, `job_running`, `idle_for_s`): from the GPUs' utilisation.

Pure: no I/O, no logging, no clock reads; `now_s` comes in.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from rasd.controller.core import aggregates, fleet
from rasd.controller.core.power import allocate as power
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import inputs as period_inputs
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import tree as power_tree

SW_POWER_CAP = 0x4
"""NVML clock event reason: clocks held down by the software power cap."""

PRIORITY_LABEL = "power-priority"
"""The node label that sets its GPUs' priority class (an integer; default 0)."""


@dataclasses.dataclass(frozen=True)
class _InventoryMemo:
    """The last inventory's inputs (copies: the view's mappings may be live) and its result."""

    node_names: frozenset[str]
    records: dict[str, fleet.GpuRecord]
    known_records: dict[str, fleet.GpuRecord]
    gpu_nodes: dict[str, str]
    known: tuple[power_apply.GpuLimits, ...]
    gpus: tuple[power_apply.GpuLimits, ...]

    def answers(
        self, node_names: Collection[str], view: period_inputs.FleetView, known: Sequence[power_apply.GpuLimits]
    ) -> bool:
        # Whole-mapping comparisons run in C and find the (usually identical) values at once.
        return (
            self.node_names == node_names
            and self.known == tuple(known)
            and self.records == view.records
            and self.known_records == view.known_records
            and self.gpu_nodes == view.gpu_nodes
        )


_last_inventory: list[_InventoryMemo] = []
"""The last `inventory` call's memo: between periods the inventory's inputs rarely change."""


def inventory(
    node_names: Collection[str], view: period_inputs.FleetView, known: Sequence[power_apply.GpuLimits]
) -> list[power_apply.GpuLimits]:
    """The GPUs of the tree's nodes whose caps count: every one known, whether its agent is here or not.

    A GPU is known from its node's Hello to this process, from the store (every Hello since the
    first, read at start), or from the apply state (`known`). Counting only the GPUs whose agents
    had said Hello since a restart dropped the others' caps from every sum: their budget went to
    the nodes that came back first while they still ran at their old caps.

    The answer for inputs equal to the last call's is that call's (the same result, found by a few
    whole-mapping comparisons instead of a pass and a sort over every GPU).
    """
    if _last_inventory and _last_inventory[0].answers(node_names, view, known):
        return list(_last_inventory[0].gpus)
    gpus = _inventory(node_names, view, known)
    _last_inventory[:] = [
        _InventoryMemo(
            frozenset(node_names),
            dict(view.records),
            dict(view.known_records),
            dict(view.gpu_nodes),
            tuple(known),
            tuple(gpus),
        )
    ]
    return gpus


def _inventory(
    node_names: Collection[str], view: period_inputs.FleetView, known: Sequence[power_apply.GpuLimits]
) -> list[power_apply.GpuLimits]:
    """`inventory`, computed."""
    records = {**view.known_records, **view.records}  # this process's Hellos are newest
    gpu_nodes = view.gpu_nodes
    # A GPU whose limits did not change keeps its object: the period compares inventories element by
    # element, and identical objects compare at once (most GPUs, most periods).
    known_by_uuid = {g.gpu_uuid: g for g in known}
    out: dict[str, power_apply.GpuLimits] = {}
    for gpu_uuid, record in records.items():
        node_id = record.node_id
        if node_id not in node_names:
            continue
        node_now = gpu_nodes.get(gpu_uuid)
        if node_now is not None and node_now != node_id:
            continue  # moved to another node: counted under that node's record
        min_w, max_w = int(record.power_limit_min_w), int(record.power_limit_max_w)
        same = known_by_uuid.get(gpu_uuid)
        if same is None or same.node_id != node_id or same.min_w != min_w or same.max_w != max_w:
            same = power_apply.GpuLimits(gpu_uuid, node_id, min_w, max_w)
        out[gpu_uuid] = same
    for gpu in known:
        if gpu.gpu_uuid not in records and gpu.node_id in node_names:
            out[gpu.gpu_uuid] = gpu
    return sorted(out.values(), key=operator.attrgetter("node_id", "gpu_uuid"))


def node_mins_w(gpus: Sequence[power_apply.GpuLimits]) -> dict[str, float]:
    """Node -> the sum of its GPUs' minimum limits, W (the tree's node minimums)."""
    mins: dict[str, float] = {}
    for g in gpus:
        mins[g.node_id] = mins.get(g.node_id, 0) + g.min_w
    return mins


def readbacks(
    gpus: Sequence[power_apply.GpuLimits], view: period_inputs.FleetView, now_s: float
) -> list[power_apply.CapReadback]:
    """The enforced limits in telemetry, each at the most that may be in force, in controller time."""
    has, enforced_w, sample_s = readbacks_aligned(gpus, view, now_s)
    return [power_apply.CapReadback(gpus[i].gpu_uuid, enforced_w[i], sample_s[i]) for i in np.flatnonzero(has)]


NO_NS = aggregates.NO_NS
"""`LatestColumns.controller_ns` where the fleet view has no controller time for the GPU."""


@dataclasses.dataclass(frozen=True, eq=False)
class LatestColumns(aggregates.LatestBlock):
    """The latest readings' fields a period reads, one array each (`aggregates.LatestBlock`'s), aligned with `gpus`.

    Built in one pass (`latest_columns`): read-backs, draw and idleness each walked 100,000 GPUs'
    readings on their own, and those walks were half a fleet period. A missing reading reads as
    None in every field.
    """

    gpus: Sequence[power_apply.GpuLimits]
    present: np.ndarray
    """True where the GPU has a reading."""

    def idle(self) -> np.ndarray:
        """True where the reading shows no utilisation (no job runs on the GPU)."""
        return self.utilization_pct == 0

    def busy(self) -> np.ndarray:
        """True where the reading shows utilisation (a missing reading or utilisation is not busy)."""
        return np.nan_to_num(self.utilization_pct, nan=0.0) != 0


def latest_columns(gpus: Sequence[power_apply.GpuLimits], view: period_inputs.FleetView) -> LatestColumns:
    """`LatestColumns` of `gpus` from the view's latest readings.

    The GPUs in the view's block (the other replicas' GPUs, `FleetView.latest_block`) take their
    rows from it; the others' readings are looked up one by one and read a field at a time.
    """
    uuids = [g.gpu_uuid for g in gpus]
    block = view.latest_block
    if block is None or not block.gpu_uuids:
        return _columns_of_readings(gpus, uuids, view)
    rows = block.rows(uuids)
    found = rows >= 0
    # A GPU missing from the block reads the last row here: filled from its reading below.
    columns = {name: getattr(block, name)[rows] for name in aggregates.BLOCK_COLUMNS}
    missing = np.flatnonzero(~found)
    if len(missing):
        rest = _columns_of_readings([gpus[i] for i in missing.tolist()], [uuids[i] for i in missing.tolist()], view)
        for name in aggregates.BLOCK_COLUMNS:
            columns[name][missing] = getattr(rest, name)
        found[missing] = rest.present
    return LatestColumns(gpus=gpus, gpu_uuids=uuids, present=found, **columns)


def _columns_of_readings(
    gpus: Sequence[power_apply.GpuLimits], uuids: list[str], view: period_inputs.FleetView
) -> LatestColumns:
    """`latest_columns` from the view's mappings: one lookup per GPU, then a comprehension per field."""
    get, controller_get = view.latest.get, view.latest_controller_ns.get
    readings = [get(u) for u in uuids]
    # numpy reads None as nan in a float array; integer columns take 0 for a missing reading. List
    # comprehensions, not generators into np.fromiter: a third less time at 100,000 GPUs.
    return LatestColumns(
        gpus=gpus,
        gpu_uuids=uuids,
        present=np.array([r is not None for r in readings], dtype=bool),
        enforced_w=np.array([r and r.enforced_power_limit_w for r in readings], dtype=np.float64),
        slew_target_w=np.array([(r and r.power_limit_slew_target_w) or 0.0 for r in readings], dtype=np.float64),
        counters_ns=np.array([r.counters_unix_ns if r else 0 for r in readings], dtype=np.int64),
        power_w=np.array([r and r.power_w for r in readings], dtype=np.float64),
        power_sample_ns=np.array([r.power_sample_unix_ns if r else 0 for r in readings], dtype=np.int64),
        utilization_pct=np.array([r and r.utilization_gpu_pct for r in readings], dtype=np.float64),
        clock_event_reasons=np.array([(r and r.clock_event_reasons) or 0 for r in readings], dtype=np.int64),
        controller_ns=np.array([controller_get(u, NO_NS) for u in uuids], dtype=np.int64),
    )


def readbacks_aligned(
    gpus: Sequence[power_apply.GpuLimits],
    view: period_inputs.FleetView,
    now_s: float,
    columns: LatestColumns | None = None,
) -> power_apply.AlignedReadbacks:
    """The enforced limits in telemetry (most that may be in force, controller time) as arrays aligned with `gpus`.

    A raise the agent is still slewing gets to its target without another command: that is the most
    that may be in force (power_apply's module doc). In controller time: the apply state compares it
    with deadlines this clock set. No per-GPU objects (`apply.record_aligned` takes them). columns:
    `latest_columns(gpus, view)`, when the caller has them.
    """
    c = columns if columns is not None and columns.gpus is gpus else latest_columns(gpus, view)
    has = c.present & ~np.isnan(c.enforced_w) & (c.counters_ns != 0)
    # `apply.in_force_w`, as arrays: the higher of the limit and the slew target.
    enforced_w = np.where(has, np.where(c.slew_target_w > c.enforced_w, c.slew_target_w, c.enforced_w), 0.0)
    at_ns = np.where(c.controller_ns != NO_NS, c.controller_ns, np.minimum(c.counters_ns, int(now_s * 1e9)))
    sample_s = np.where(has, at_ns / 1e9, 0.0)
    return power_apply.AlignedReadbacks(has, enforced_w, sample_s)


def priority(labels: Mapping[str, str]) -> int:
    """A node's priority class from its `power-priority` label (default 0)."""
    try:
        return int(labels.get(PRIORITY_LABEL, "0"))
    except ValueError:
        return 0


def job_running(columns: LatestColumns) -> bool:
    """At least half the managed GPUs report utilisation (the job runs)."""
    return int(np.count_nonzero(columns.busy())) >= 0.5 * len(columns.gpus)


def idle_for_s(
    columns: LatestColumns, idle_since_s: Mapping[str, float], now_s: float
) -> tuple[np.ndarray, dict[str, float]]:
    """How long each GPU's utilisation has read 0 (or not been reported), s; nan while it reads busy.

    Returns:
        (the durations, aligned with `columns.gpus`; GPU -> when the counters sample that began its
        current run of 0 % utilisation was taken, for the next period).
    """
    uuids, counters_ns = columns.gpu_uuids, columns.counters_ns
    since: dict[str, float] = {}
    out = np.full(len(uuids), np.nan)
    for i in np.flatnonzero(~columns.busy()).tolist():  # mostly few: a training job keeps its GPUs busy
        gpu_uuid, at_ns = uuids[i], int(counters_ns[i])
        sampled = at_ns / 1e9 if at_ns else now_s
        since[gpu_uuid] = idle_since_s.get(gpu_uuid, min(sampled, now_s))
        out[i] = now_s - since[gpu_uuid]
    return out, since


@dataclasses.dataclass(frozen=True, eq=False)
class DrawViews:
    """The allocator's views of one period, with the draw figures the status shows."""

    views: power.GpuViews
    known: np.ndarray
    """True where the draw comes from fresh telemetry."""
    drawn_w: np.ndarray
    """The latest draw, W (0 where not known)."""
    idle_since_s: Mapping[str, float]
    """For the next period (`idle_for_s`)."""


@dataclasses.dataclass(frozen=True)
class ViewContext:
    """What `gpu_views` needs besides the state and the inputs: the period's knobs and carried memory."""

    now_s: float
    config: period_inputs.PeriodConfig
    policy: power_policy.PowerPolicy
    step_s: float | None
    """The step period the detector measured on unmanaged power (None: not measured)."""
    ramping: frozenset[str]
    """GPUs whose job-start ramp was rising last period."""
    raised_at_s: Mapping[str, float]
    """GPU -> when its may-be-in-force cap last went up."""
    idle_since_s: Mapping[str, float]


def _draw(
    state: power_apply.ApplyState, columns: LatestColumns, inputs: period_inputs.PeriodInputs, ctx: ViewContext
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(draw W, known, latest draw W, throttled) per GPU: each GPU's draw as the allocator judges it."""
    peaks = inputs.window.draw_peaks_w
    stale_ns = int((ctx.now_s - ctx.config.telemetry_stale_s) * 1e9)
    uuids = columns.gpu_uuids
    get = peaks.get
    peak_w = np.array([get(u, np.nan) for u in uuids], dtype=np.float64)  # one lookup a GPU, not two
    has_peak = ~np.isnan(peak_w)
    without = np.flatnonzero(~has_peak)
    if len(without):  # mostly few; a NaN peak that is there still counts as one, as before
        has_peak[without] = [uuids[i] in peaks for i in without.tolist()]
    power_w = columns.power_w
    fresh = columns.present & ~np.isnan(power_w) & (columns.power_sample_ns >= stale_ns)
    known = fresh & has_peak
    # An idle GPU (no utilisation: its job stopped or left) needs what it draws now; the window's
    # peak would hold its watts for a whole window after a load change. Stale telemetry: drawing
    # at the cap that may be in force.
    draw = np.where(known, np.where(columns.idle(), power_w, peak_w), power_apply.may_be_in_force_w(state))
    drawn = np.where(known, np.nan_to_num(power_w, nan=0.0), 0.0)
    throttled = (columns.clock_event_reasons & SW_POWER_CAP) != 0
    if ctx.ramping:
        # A GPU whose job-start ramp is still rising is held by its ceiling, and its limit lags
        # what the budget counts (the agent slews it): by the draw it would look uncapped and
        # get no raise, stalling its ramp.
        throttled |= np.array([u in ctx.ramping for u in uuids], dtype=bool)
    return draw, known, drawn, throttled


def _marked(gpus: Sequence[power_apply.GpuLimits], uuids: Collection[str]) -> np.ndarray:
    """True for each GPU in `uuids` (all False at once when it is empty, as it mostly is)."""
    if not uuids:
        return np.zeros(len(gpus), dtype=bool)
    return np.array([g.gpu_uuid in uuids for g in gpus], dtype=bool)


def _node_columns(
    gpus: Sequence[power_apply.GpuLimits], tree: power_tree.PowerTree, inputs: period_inputs.PeriodInputs
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tree node index, priority class, reachable, node quarantined) per GPU, each judged once per tree node."""
    view, quarantined_nodes = inputs.fleet, inputs.quarantined_nodes
    node_of_name, names = tree.index.node_of_name, tree.index.node_names
    node_idx = np.array([node_of_name[g.node_id] for g in gpus], dtype=np.intp)
    labels, sessions = view.node_labels, view.sessions
    by_node_priority = np.array([priority(labels.get(n, {})) for n in names])
    by_node_reachable = np.array([n in sessions for n in names], dtype=bool)
    by_node_quarantined = np.array([n in quarantined_nodes for n in names], dtype=bool)
    if not len(node_idx):
        return node_idx, np.array([]), np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    return node_idx, by_node_priority[node_idx], by_node_reachable[node_idx], by_node_quarantined[node_idx]


def gpu_views(
    state: power_apply.ApplyState,
    tree: power_tree.PowerTree,
    inputs: period_inputs.PeriodInputs,
    ctx: ViewContext,
    columns: LatestColumns | None = None,
) -> DrawViews:
    """The allocator's views of the state's GPUs this period (see the module docstring).

    columns: `latest_columns(state.gpus, inputs.fleet)`, when the caller has them.
    """
    gpus = state.gpus
    if columns is None or columns.gpus is not gpus:
        columns = latest_columns(gpus, inputs.fleet)
    draw, known, drawn, throttled = _draw(state, columns, inputs, ctx)
    view = inputs.fleet
    node_idx, node_priority, reachable, node_quarantined = _node_columns(gpus, tree, inputs)
    # Settling: the step, at most the configured draw window.
    step_s = min(ctx.step_s, ctx.config.draw_window_s) if ctx.step_s is not None else None
    settle = power.settle_s(step_s, ctx.policy.control_period_s, view.telemetry_interval_s)
    settling = np.array([ctx.now_s - ctx.raised_at_s.get(g.gpu_uuid, -np.inf) < settle for g in gpus])
    # A quarantined GPU releases its share once it has read idle for as long as a raise settles:
    # one step plus the telemetry delay (the scheduler takes a rank out at a step boundary).
    idle_for, idle_since = idle_for_s(columns, ctx.idle_since_s, ctx.now_s)
    quarantined = node_quarantined | _marked(gpus, inputs.quarantined_gpus)
    repairing = _marked(gpus, inputs.repairing_gpus)
    views = power.GpuViews(
        gpu_uuids=tuple(columns.gpu_uuids),
        node_idx=node_idx,
        priority=node_priority,
        draw_w=draw,
        cap_w=power_apply.may_be_in_force_w(state),
        # A GPU under a repair keeps its default limit's watts: the others make room for it.
        min_w=np.where(repairing, state.max_w, state.min_w) if inputs.repairing_gpus else state.min_w,
        max_w=state.max_w,
        throttled=throttled,
        eligible=~power.released(quarantined, idle_for, settle),
        marginal=np.zeros(len(gpus), dtype=bool),
        reachable=reachable,
        settling=settling,
        floor_w=_floors(gpus, state.min_w, inputs.floors_w),
    )
    return DrawViews(views, known, drawn, idle_since)


def _floors(
    gpus: Sequence[power_apply.GpuLimits], min_w: np.ndarray, floors_w: Mapping[str, float]
) -> np.ndarray | None:
    """Each GPU's floor (its minimum where it has none); None when no GPU has one, as mostly."""
    if not floors_w:
        return None
    return np.array([floors_w.get(g.gpu_uuid, m) for g, m in zip(gpus, min_w.tolist(), strict=True)])
