"""One control period of the power manager as a pure function: `step(state, inputs, now_s)`.

This module owns the order of a period's decisions and what carries from one period to the next
(`PeriodState`: the tree and policy in force, the two-phase apply state, the allocator's and the
ramp's random generators, the job-start ramp, the smoothing plans, the BMC fallback). The loop
(`rasd.controller.power.loop`) gathers the inputs (`core.power.inputs`), calls `step`, persists what
must be durable and sends the commands. Each period:

1. fold in what came back since the last one: BMC answers, unanswered smoothing commands;
2. inventory: the GPUs of the tree's nodes (`views.inventory`); a node that came back with a new boot
   id is forgotten (its limits reset to default: `apply.forget_node`);
3. fold in the SetPowerCap acks and the enforced limits in telemetry (`apply.record`), and the
   limits BMCs confirmed for unreachable nodes (`fallback.count_confirmed_limits`); GPUs a repair
   may return to their default limit (`inputs.PeriodInputs.repairing_gpus`) count at their maximum;
4. views (`views.gpu_views`), `allocate.allocate`, the aggregate ramp-rate limit on raises
   (`swing.limit_aggregate_raise`), the job-start ceiling (`ramp.job_start_ramp`; it only lowers
   targets), emulated smoothing's peak cap (it only lowers targets), then `apply.plan`: decreases
   first, raises only into slack that counts unconfirmed decreases as not applied;
5. the detected-swing plan and the job-start profiles (`smoothing`);
6. node limits through the BMC for unreachable nodes whose caps must come down (`fallback`);
7. the status (`status`), with what each GPU could still be given within the budgets
   (`status.GpuRoom`: the straggler watch sizes a raise to it). GPUs with a floor
   (`inputs.PeriodInputs.floors_w`, a straggler's raise) get it within the headroom (`allocate`).

Example: two GPUs of one 1,200 W node confirmed at 600 W; a draws 300 W, b draws 600 W and reports
SW power cap -> commands: one SetCaps to the node with a -> 350 W (a decrease, sent at once); b's
raise waits until a's decrease is confirmed (its ack comes back as an input of a later period).

Pure: no I/O, no logging, no clock reads; `now_s` comes in, randomness is carried in the state as
the generators' states, effects go out as data (`core.power.commands`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from rasd.controller.core.power import allocate as power
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import commands, fallback, smoothing, start_smoothing, status, swing, views
from rasd.controller.core.power import inputs as period_inputs
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import ramp as power_ramp
from rasd.controller.core.power import tree as power_tree


@dataclasses.dataclass(frozen=True, eq=False)
class PeriodState:
    """Everything the power manager carries from one period to the next."""

    config: period_inputs.PeriodConfig
    tree: power_tree.PowerTree
    """The budget tree in force (config, the operator's budgets, the GPUs' minimums)."""
    policy: power_policy.PowerPolicy
    apply: power_apply.ApplyState
    """The two-phase apply state (persisted before any command leaves)."""
    allocate_rng: Mapping[str, Any]
    """The raise jitter's generator, as `numpy.random.PCG64.state`."""
    ramp_rng: Mapping[str, Any]
    """The job-start ramp's generator, as `numpy.random.PCG64.state`."""
    targets_w: np.ndarray | None = None
    """Last period's targets (the allocator's reference), aligned with `apply.gpus`."""
    ramp: power_ramp.RampState = dataclasses.field(default_factory=power_ramp.RampState)
    ramped_at_s: float | None = None
    """When a busy GPU was last under a job-start ceiling: the swing detector's window starts after it."""
    raised_at_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU -> when its may-be-in-force cap last went up (it settles until a step ran under it)."""
    idle_since_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU -> when the counters sample that began its current run of 0 % utilisation was taken."""
    boot_ids: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Node -> the boot id its caps were confirmed under."""
    start: start_smoothing.StartState = dataclasses.field(default_factory=start_smoothing.StartState)
    """The job-start profiles the GPUs carry (persisted before any start-profile command leaves)."""
    smoothing: smoothing.SmoothingState = dataclasses.field(default_factory=smoothing.SmoothingState)
    fallback: fallback.FallbackState = dataclasses.field(default_factory=fallback.FallbackState)
    periods: int = 0
    """Periods run with GPUs to manage."""


@dataclasses.dataclass(frozen=True, eq=False)
class PeriodStatus:
    """The period's status: what rasctl and the metrics show, and the figures the loop counts."""

    power: status.PowerStatus | None
    """None when there was nothing to manage (`reason` says why)."""
    reason: str
    ramp_parked: int = 0
    """GPUs parked at the job-start cap."""
    ramp_ramping: int = 0
    """GPUs whose job-start ceiling rose."""
    start_smoothed: int = 0
    """GPUs under a job-start smoothing profile after the period."""
    stranded_w: float = 0.0
    settling_w: float = 0.0
    """W a raise granted and the draw does not show yet."""


class Period(NamedTuple):
    """One period's result."""

    state: PeriodState
    commands: commands.Commands
    status: PeriodStatus
    room: status.GpuRoom | None = None
    """What each GPU could still be given within the budgets after the period (None: nothing managed)."""


def initial_state(
    config: period_inputs.PeriodConfig,
    tree: power_tree.PowerTree,
    policy: power_policy.PowerPolicy,
    apply: power_apply.ApplyState,
    *,
    seed: int,
    start: start_smoothing.StartState | None = None,
    plan: tuple[swing.SmoothingPlan, swing.SwingReport] | None = None,
) -> PeriodState:
    """The state a loop starts from: its settings and what the store held (a restored plan is judged later)."""
    restored = smoothing.SmoothingState()
    if plan is not None:
        restored = smoothing.SmoothingState(plan=plan[0], unmanaged=plan[1], restored=True)
    return PeriodState(
        config=config,
        tree=tree,
        policy=policy,
        apply=apply,
        allocate_rng=np.random.default_rng(seed).bit_generator.state,
        ramp_rng=np.random.default_rng([seed, 1]).bit_generator.state,
        start=start or start_smoothing.StartState(),
        smoothing=restored,
    )


def window_reads(state: PeriodState, fleet_view: period_inputs.FleetView, now_s: float) -> period_inputs.WindowReads:
    """What the loop must read from the power window for this period's `step`.

    The draw window follows the step period the detector measured (`allocate.draw_window_s`); the
    detector's series and the GPUs' peaks over its window are needed only while no plan is in force.
    """
    config, policy = state.config, state.policy
    detected = state.smoothing.unmanaged
    step_s = detected.period_s if detected is not None else None
    window_s = power.draw_window_s(
        config.draw_window_s,
        policy.control_period_s,
        step_s,
        fleet_view.telemetry_interval_s,
        longest_s=config.detect_window_s,
    )
    detect_ns = int((now_s - config.detect_window_s) * 1e9) if state.smoothing.plan is None else None
    return period_inputs.WindowReads(
        draw_since_unix_ns=int((now_s - window_s) * 1e9),
        detect_since_unix_ns=detect_ns,
        swing_tracked=state.start.active(),
        status_since_unix_ns=int((now_s - status.RECENT_SWING_S) * 1e9),
    )


def with_tree(state: PeriodState, tree: power_tree.PowerTree) -> PeriodState:
    """The state with another budget tree in force (the operator changed a budget)."""
    return dataclasses.replace(state, tree=tree)


def change_policy(
    state: PeriodState, policy: power_policy.PowerPolicy, fleet_view: period_inputs.FleetView, now_s: float
) -> tuple[PeriodState, commands.Commands]:
    """Put a new policy in force: the swing plan is switched off and planned again from fresh data."""
    smooth = state.smoothing
    sent: tuple[commands.NodeCommand, ...] = ()
    notes: tuple[commands.Note, ...] = ()
    if smooth.plan is not None:
        smooth, sent, notes = smoothing.disable(smooth, "policy changed", fleet=fleet_view, now_s=now_s, policy=policy)
    smooth = dataclasses.replace(smooth, off_since_s=now_s)
    return dataclasses.replace(state, policy=policy, smoothing=smooth), commands.Commands(smoothing=sent, notes=notes)


def _generator(saved: Mapping[str, Any]) -> np.random.Generator:
    """A generator that continues from a saved `PCG64.state`."""
    bits = np.random.PCG64()
    bits.state = dict(saved)
    return np.random.Generator(bits)


def _sync_inventory(
    state: PeriodState, gpus: Sequence[power_apply.GpuLimits], boot_ids: Mapping[str, str], now_s: float
) -> tuple[PeriodState, list[commands.Note]]:
    """The state for this period's inventory: new GPUs start unknown, a rebooted node is forgotten."""
    apply, tree, targets = state.apply, state.tree, state.targets_w
    notes: list[commands.Note] = []
    if tuple(gpus) != apply.gpus:
        apply = apply.with_gpus(gpus, now_s=now_s, policy=state.policy)
        targets = None
        try:
            tree = tree.with_node_mins(views.node_mins_w(gpus))
        except power_tree.PowerTreeError as exc:
            notes.append(commands.Note("error", "power_tree_minimums_rejected", {"error": str(exc)}))
    known = dict(state.boot_ids)
    carried = dict(state.smoothing.nodes)
    for node_id, boot_id in boot_ids.items():
        previous = known.get(node_id)
        if previous is not None and previous != boot_id:
            # NVML limits do not survive a reboot: the node's caps are unknown again.
            apply = power_apply.forget_node(apply, node_id, now_s=now_s, policy=state.policy)
            carried.pop(node_id, None)
            notes.append(commands.Note("info", "power_node_rebooted", {"node": node_id}))
        known[node_id] = boot_id
    smooth = dataclasses.replace(state.smoothing, nodes=carried)
    return dataclasses.replace(
        state, apply=apply, tree=tree, targets_w=targets, boot_ids=known, smoothing=smooth
    ), notes


class _Caps(NamedTuple):
    """The cap part of a period."""

    state: PeriodState
    """With the new apply state, targets, generators, ramp and raise times."""
    before: power_apply.ApplyState
    """The apply state the plan started from (after acks and read-backs)."""
    plan: power_apply.CapPlan
    targets_w: np.ndarray
    allocation: power.Allocation
    ramp: power_ramp.RampDecision
    draw: views.DrawViews
    columns: views.LatestColumns
    """The latest readings of `before`'s GPUs."""


def _caps(state: PeriodState, inputs: period_inputs.PeriodInputs, now_s: float) -> _Caps:
    """Steps 3 and 4: fold in what the GPUs confirmed, allocate, limit, ramp and plan the caps."""
    policy, fleet_view = state.policy, inputs.fleet
    # Acks first, then the telemetry's read-backs (one per GPU: folded in as arrays), as `record` orders them.
    apply = power_apply.record(state.apply, acks=inputs.acks, policy=policy)
    # The latest readings as columns, once for the period's three uses (read-backs, draw, idleness).
    columns = views.latest_columns(state.apply.gpus, fleet_view)
    apply = power_apply.record_aligned(
        apply, views.readbacks_aligned(state.apply.gpus, fleet_view, now_s, columns), policy=policy
    )
    apply = fallback.count_confirmed_limits(apply, state.fallback, fleet_view.sessions, policy)
    if inputs.repairing_gpus:
        # A reset or a reboot brings the default limit back without a cap command: counted at the
        # maximum from now until one command lifetime after its outcome is known (`apply.forget_gpus`).
        repairing = np.array([g.gpu_uuid in inputs.repairing_gpus for g in apply.gpus], dtype=bool)
        apply = power_apply.forget_gpus(apply, repairing, now_s=now_s, policy=policy)
    detected = state.smoothing.unmanaged
    ctx = views.ViewContext(
        now_s=now_s,
        config=state.config,
        policy=policy,
        step_s=detected.period_s if detected is not None else None,
        ramping=state.ramp.ramping_gpus(),
        raised_at_s=state.raised_at_s,
        idle_since_s=state.idle_since_s,
    )
    if columns.gpus is not apply.gpus:  # an ack or a repair changed the list (rare)
        columns = views.latest_columns(apply.gpus, fleet_view)
    draw = views.gpu_views(apply, state.tree, inputs, ctx, columns)
    previous = state.targets_w if state.targets_w is not None and len(state.targets_w) == len(apply.gpus) else None
    rng = _generator(state.allocate_rng)
    allocation = power.allocate(state.tree, draw.views, previous, policy=policy, rng=rng)
    reference = previous if previous is not None else draw.views.cap_w
    targets = swing.limit_aggregate_raise(
        reference, allocation.caps_w, policy.control_period_s, policy.ramp_limit_w_per_s
    ).astype(np.int64)
    ramp_rng = _generator(state.ramp_rng)
    ramp = power_ramp.job_start_ramp(
        state.ramp,
        gpu_uuids=[g.gpu_uuid for g in apply.gpus],
        idle=columns.idle(),
        targets_w=targets,
        min_w=apply.min_w,
        max_w=apply.max_w,
        now_s=now_s,
        policy=policy,
        rng=ramp_rng,
        reserved_w_per_s=start_smoothing.reserved_w_per_s(state.start, state.ramp.ramping_gpus()),
    )
    # Parking and the start ramp only lower targets: every budget that held still holds.
    targets = ramp.targets_w
    plan_in_force = state.smoothing.plan
    if plan_in_force is not None and plan_in_force.peak_cap_w is not None:
        # Emulated smoothing's peak cap rides on the caps: it only lowers targets, so every
        # budget still holds, and the two-phase apply carries it like any decrease.
        targets = swing.apply_peak_cap(targets, plan_in_force.peak_cap_w, apply.min_w)
    new_apply, plan = power_apply.plan(
        apply, targets, state.tree, now_s=now_s, policy=policy, raise_rates_w_per_s=ramp.raise_rates_w_per_s
    )
    raised_at = dict(state.raised_at_s)
    raised = power_apply.may_be_in_force_w(new_apply) > power_apply.may_be_in_force_w(apply)
    for i in np.flatnonzero(raised):
        raised_at[new_apply.gpus[i].gpu_uuid] = now_s
    new = dataclasses.replace(
        state,
        apply=new_apply,
        targets_w=targets,
        allocate_rng=rng.bit_generator.state,
        ramp_rng=ramp_rng.bit_generator.state,
        ramp=ramp.state,
        ramped_at_s=now_s if ramp.starting else state.ramped_at_s,
        raised_at_s=raised_at,
        idle_since_s=draw.idle_since_s,
    )
    return _Caps(new, apply, plan, targets, allocation, ramp, draw, columns)


def step(state: PeriodState, inputs: period_inputs.PeriodInputs, now_s: float) -> Period:
    """Run one control period: the new state, the commands to send, the status (see the module docstring).

    Args:
        state: What the previous period (and the operator's changes since) left.
        inputs: What the loop gathered for this period.
        now_s: Controller time, Unix seconds.

    Returns:
        (state, commands, status). Persist what the commands need durable before they leave: the
        apply state when there are cap commands, the start state when it changed, a new swing plan.
    """
    state = dataclasses.replace(
        state,
        fallback=fallback.fold_results(state.fallback, inputs.node_limit_results),
        smoothing=smoothing.fold_outcomes(state.smoothing, inputs.outcomes),
    )
    gpus = views.inventory(frozenset(state.tree.index.node_names), inputs.fleet, state.apply.gpus)
    if not gpus:
        return Period(state, commands.Commands(), PeriodStatus(None, "no GPUs in the power tree yet"))
    state, notes = _sync_inventory(state, gpus, inputs.fleet.boot_ids, now_s)
    caps = _caps(state, inputs, now_s)
    state, plan, allocation = caps.state, caps.plan, caps.allocation
    ctx = smoothing.SmoothContext(
        now_s=now_s,
        policy=state.policy,
        config=state.config,
        gpus=caps.before.gpus,
        max_w=caps.before.max_w,
        fleet=inputs.fleet,
        window=inputs.window,
        start=state.start,
        ramped_at_s=state.ramped_at_s,
        columns=caps.columns,
    )
    smooth, smoothing_commands, smoothing_notes = smoothing.smooth(state.smoothing, ctx)
    profiles = smoothing.start_profiles(
        state.start,
        caps.ramp,
        ctx,
        plan_active=smooth.plan is not None,
        canary_p2p_w=smooth.canary_p2p_w,
        unanswered=inputs.outcomes.start_unanswered,
    )
    if not profiles.start.active():
        smooth = dataclasses.replace(smooth, canary_p2p_w=None)
    held_back, limits = fallback.requests(
        state.fallback,
        state.apply,
        caps.targets_w,
        sessions=inputs.fleet.sessions,
        bmc_nodes=inputs.bmc_nodes,
        after_s=state.config.bmc_fallback_after_s,
        now_s=now_s,
    )
    state = dataclasses.replace(
        state, smoothing=smooth, start=profiles.start, fallback=held_back, periods=state.periods + 1
    )
    if plan.decreases or plan.increases or plan.over_budget:
        notes.append(commands.Note("info", "power_period", {"reason": plan.reason, "allocation": allocation.reason}))
    out = commands.Commands(
        caps=plan,
        cap_commands=commands.cap_commands(plan),
        smoothing=smoothing_commands,
        start_profiles=profiles.commands,
        node_limits=limits,
        track_gpus=profiles.start.canaries,
        notes=(*notes, *smoothing_notes, *profiles.notes),
    )
    return Period(state, out, _status(state, caps, inputs, now_s, profiles.held), _room(state, caps, now_s))


def _room(state: PeriodState, caps: _Caps, now_s: float) -> status.GpuRoom:
    """What each GPU could still be given, under the higher of its target and the cap that may be in force."""
    cap_w = np.maximum(caps.targets_w, power_apply.may_be_in_force_w(state.apply))
    views = caps.draw.views
    return status.GpuRoom(
        at_unix_s=now_s,
        gpu_uuids=views.gpu_uuids,
        cap_w=cap_w,
        max_w=views.max_w,
        headroom_w=power.gpu_headroom_w(state.tree, views, cap_w),
        capped=caps.allocation.capped,
    )


def _status(
    state: PeriodState, caps: _Caps, inputs: period_inputs.PeriodInputs, now_s: float, start_smoothed: int
) -> PeriodStatus:
    """Step 7: the period's status."""
    drawn = np.where(caps.draw.known, caps.draw.drawn_w, 0.0)
    allocation, plan = caps.allocation, caps.plan
    power_status = status.PowerStatus(
        at_unix_s=now_s,
        sums=status.domain_sums(
            state.tree,
            state.apply,
            caps.targets_w,
            drawn,
            caps.draw.views.node_idx if state.apply.gpus is caps.before.gpus else None,
        ),
        swing=status.recent_swing(inputs.window.status_rows, inputs.window.sample_hz, state.policy),
        smoothing=state.smoothing.plan,
        stranded_w=allocation.stranded_w,
        unmet_w=allocation.unmet_w,
        over_budget=plan.over_budget,
        reason=f"{plan.reason}; {allocation.reason}",
        periods=state.periods,
        unconfirmed_decreases=power_apply.unconfirmed_decreases(state.apply),
    )
    return PeriodStatus(
        power=power_status,
        reason=power_status.reason,
        ramp_parked=caps.ramp.parked,
        ramp_ramping=caps.ramp.ramping,
        start_smoothed=start_smoothed,
        stranded_w=allocation.stranded_w,
        settling_w=allocation.settling_w,
    )
