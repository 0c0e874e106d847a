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
- **idleness** (`idle`, `job_running`, `idle_for_s`): from the GPUs' utilisation.

Pure: no I/O, no logging, no clock reads; `now_s` comes in.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from rasd.controller.core import fleet
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


def readbacks_aligned(
    gpus: Sequence[power_apply.GpuLimits], view: period_inputs.FleetView, now_s: float
) -> power_apply.AlignedReadbacks:
    """The enforced limits in telemetry (most that may be in force, controller time) as arrays aligned with `gpus`.

    A raise the agent is still slewing gets to its target without another command: that is the most
    that may be in force (power_apply's module doc). In controller time: the apply state compares it
    with deadlines this clock set. One pass, no per-GPU objects (`apply.record_aligned` takes them).
    """
    now_ns = int(now_s * 1e9)
    latest, controller_ns = view.latest, view.latest_controller_ns
    n = len(gpus)
    has = np.zeros(n, dtype=bool)
    enforced_w = np.zeros(n)
    sample_s = np.zeros(n)
    for i, g in enumerate(gpus):
        reading = latest.get(g.gpu_uuid)
        if reading is None or reading.enforced_power_limit_w is None or not reading.counters_unix_ns:
            continue
        has[i] = True
        # `apply.in_force_w`, inlined (100,000 calls a period): the higher of the limit and the slew target.
        limit_w, target_w = float(reading.enforced_power_limit_w), float(reading.power_limit_slew_target_w or 0.0)
        enforced_w[i] = target_w if target_w > limit_w else limit_w
        sample_s[i] = controller_ns.get(g.gpu_uuid, min(reading.counters_unix_ns, now_ns)) / 1e9
    return power_apply.AlignedReadbacks(has, enforced_w, sample_s)


def priority(labels: Mapping[str, str]) -> int:
    """A node's priority class from its `power-priority` label (default 0)."""
    try:
        return int(labels.get(PRIORITY_LABEL, "0"))
    except ValueError:
        return 0


def idle(gpus: Sequence[power_apply.GpuLimits], latest: Mapping[str, fleet.GpuLatest]) -> np.ndarray:
    """True for each GPU whose latest reading shows no utilisation (no job runs on it)."""
    return np.array(
        [(r := latest.get(g.gpu_uuid)) is not None and r.utilization_gpu_pct == 0 for g in gpus], dtype=bool
    )


def job_running(gpus: Sequence[power_apply.GpuLimits], latest: Mapping[str, fleet.GpuLatest]) -> bool:
    """At least half the managed GPUs report utilisation (the job runs)."""
    busy = sum(
        1
        for g in gpus
        if (r := latest.get(g.gpu_uuid)) is not None and r.utilization_gpu_pct is not None and r.utilization_gpu_pct > 0
    )
    return busy >= 0.5 * len(gpus)


def idle_for_s(
    gpus: Sequence[power_apply.GpuLimits],
    latest: Mapping[str, fleet.GpuLatest],
    idle_since_s: Mapping[str, float],
    now_s: float,
) -> tuple[np.ndarray, dict[str, float]]:
    """How long each GPU's utilisation has read 0 (or not been reported), s; nan while it reads busy.

    Returns:
        (the durations, aligned with `gpus`; GPU -> when the counters sample that began its current
        run of 0 % utilisation was taken, for the next period).
    """
    since: dict[str, float] = {}
    out = np.full(len(gpus), np.nan)
    for i, g in enumerate(gpus):
        reading = latest.get(g.gpu_uuid)
        if reading is not None and reading.utilization_gpu_pct:
            continue
        sampled = reading.counters_unix_ns / 1e9 if reading is not None and reading.counters_unix_ns else now_s
        since[g.gpu_uuid] = idle_since_s.get(g.gpu_uuid, min(sampled, now_s))
        out[i] = now_s - since[g.gpu_uuid]
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
    state: power_apply.ApplyState, inputs: period_inputs.PeriodInputs, ctx: ViewContext
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(draw W, known, latest draw W, throttled) per GPU: each GPU's draw as the allocator judges it."""
    bound = power_apply.may_be_in_force_w(state)
    latest, peaks = inputs.fleet.latest, inputs.window.draw_peaks_w
    stale_ns = int((ctx.now_s - ctx.config.telemetry_stale_s) * 1e9)
    n = len(state.gpus)
    draw = np.empty(n)
    drawn = np.zeros(n)
    known = np.zeros(n, dtype=bool)
    throttled = np.zeros(n, dtype=bool)
    bound_w, ramping = bound.tolist(), ctx.ramping  # Python floats: cheaper to read one at a time
    for i, g in enumerate(state.gpus):
        gpu_uuid = g.gpu_uuid
        reading = latest.get(gpu_uuid)
        peak = peaks.get(gpu_uuid)
        fresh = reading is not None and reading.power_w is not None and reading.power_sample_unix_ns >= stale_ns
        if fresh and peak is not None:
            assert reading is not None
            # An idle GPU (no utilisation: its job stopped or left) needs what it draws now; the
            # window's peak would hold its watts for a whole window after a load change.
            draw[i] = reading.power_w if reading.utilization_gpu_pct == 0 else peak
            known[i] = True
            drawn[i] = reading.power_w or 0.0
        else:
            draw[i] = bound_w[i]  # stale telemetry: drawing at the cap that may be in force
        if reading is not None and reading.clock_event_reasons is not None:
            throttled[i] = bool(reading.clock_event_reasons & SW_POWER_CAP)
        # A GPU whose job-start ramp is still rising is held by its ceiling, and its limit lags
        # what the budget counts (the agent slews it): by the draw it would look uncapped and
        # get no raise, stalling its ramp.
        if gpu_uuid in ramping:
            throttled[i] = True
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
) -> DrawViews:
    """The allocator's views of the state's GPUs this period (see the module docstring)."""
    gpus = state.gpus
    draw, known, drawn, throttled = _draw(state, inputs, ctx)
    view = inputs.fleet
    node_idx, node_priority, reachable, node_quarantined = _node_columns(gpus, tree, inputs)
    # Settling: the step, at most the configured draw window.
    step_s = min(ctx.step_s, ctx.config.draw_window_s) if ctx.step_s is not None else None
    settle = power.settle_s(step_s, ctx.policy.control_period_s, view.telemetry_interval_s)
    settling = np.array([ctx.now_s - ctx.raised_at_s.get(g.gpu_uuid, -np.inf) < settle for g in gpus])
    # A quarantined GPU releases its share once it has read idle for as long as a raise settles:
    # one step plus the telemetry delay (the scheduler takes a rank out at a step boundary).
    idle_for, idle_since = idle_for_s(gpus, view.latest, ctx.idle_since_s, ctx.now_s)
    quarantined = node_quarantined | _marked(gpus, inputs.quarantined_gpus)
    repairing = _marked(gpus, inputs.repairing_gpus)
    views = power.GpuViews(
        gpu_uuids=tuple(g.gpu_uuid for g in gpus),
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
