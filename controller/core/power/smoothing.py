"""The power period's smoothing decisions: the detected-swing plan and the job-start profiles, as commands.

This module owns, per control period:

- **the detected-swing plan.** Once a window of unmanaged aggregate power shows a coherent swing,
  `swing.plan_smoothing` chooses a plan, its ramp is sized for the highest-drawing rank
  (`ramp_for_the_straggler`), and SetPowerSmoothing goes to every GPU that supports it; where the
  GPUs have no smoothing hardware the plan is emulated: SetTroughFiller asks every node's trough-
  filler hook to hold the floor (a peak cap rides on the caps, `swing.apply_peak_cap`). The plan is
  switched off when the job stops (utilisation gone; the filler ramps its floor down at the job
  ramp) and after a policy change. The detector's window starts after the last period a busy GPU was
  under a job-start ceiling (power under the start ramp is not the unmanaged swing) and after the
  plan was last switched off. Under job-start profiles the aggregate is masked, so the detector reads
  the canaries' sum, scaled to the job. A plan restored from the store is judged (job running or
  stopped) once most of the fleet's telemetry is back, and goes again to every connected node.
  A node gets the plan again when it reconnects (its stream changed) or its telemetry says the
  profile is off (a GPU reset or reboot clears it).
- **job-start profiles** (`start_profiles`, with `core.power.start_smoothing.decide`): on at once for
  GPUs that start a job, handed over to the swing plan (no command: its profile replaces them), off
  after the release time; a command that went unanswered is sent again in whichever state is due.

The edge persists the plan before its first command leaves (so a successor can switch it off) and
deletes it after its "off" commands have left.

Pure: no I/O, no logging, no clock reads; `now_s` comes in, commands go out as data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import commands, start_smoothing, swing, views
from rasd.controller.core.power import inputs as period_inputs
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import ramp as power_ramp

RESTORE_COVERAGE = 0.8
"""Share of the managed GPUs whose telemetry must be in before a restored plan is judged (job running
or stopped): right after a restart, GPUs without telemetry yet would read as idle."""


@dataclasses.dataclass(frozen=True)
class SmoothingState:
    """What the smoothing remembers between periods."""

    plan: swing.SmoothingPlan | None = None
    """The detected swing's plan in force (None: none)."""
    unmanaged: swing.SwingReport | None = None
    """The unmanaged swing the plan was sized from (the step period the draw window follows)."""
    nodes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Node -> the plan and stream it was sent with (a node whose stream changed gets it again)."""
    sent_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Node -> when the plan was last sent to it."""
    off_since_s: float | None = None
    """When the plan was last switched off: the detector's window starts after it."""
    restored: bool = False
    """The plan came from the store: which nodes carry it is not known until telemetry is in."""
    canary_p2p_w: float | None = None
    """The unmanaged swing the detector last estimated from the canaries, W."""


@dataclasses.dataclass(frozen=True, eq=False)
class SmoothContext:
    """One period's facts the smoothing decides from."""

    now_s: float
    policy: power_policy.PowerPolicy
    config: period_inputs.PeriodConfig
    gpus: Sequence[power_apply.GpuLimits]
    max_w: np.ndarray
    fleet: period_inputs.FleetView
    window: period_inputs.WindowView
    start: start_smoothing.StartState
    """The job-start profiles in force (before this period's start decision)."""
    ramped_at_s: float | None
    """When a busy GPU was last under a job-start ceiling (this period included)."""
    columns: views.LatestColumns
    """The latest readings of `gpus` (the period's `views.latest_columns`)."""


Decision = tuple[SmoothingState, tuple[commands.NodeCommand, ...], tuple[commands.Note, ...]]
"""(new state, commands, notes)."""


def fold_outcomes(state: SmoothingState, outcomes: period_inputs.SendOutcomes) -> SmoothingState:
    """Forget the nodes whose plan command went unanswered, or whose start profile may have landed after it."""
    drop = set(outcomes.smoothing_unanswered_nodes)
    if state.plan is not None:
        # The swing plan took over while a start profile was in flight: it may have landed after
        # the plan's profile, so the plan goes to this node again.
        drop |= outcomes.start_answered_nodes
    if not drop & set(state.nodes):
        return state
    return dataclasses.replace(state, nodes={n: k for n, k in state.nodes.items() if n not in drop})


def gpus_for(plan: swing.SmoothingPlan, node_id: str, fleet: period_inputs.FleetView) -> tuple[str, ...]:
    """The node's GPUs the plan's command goes to.

    Firmware profiles only where the GPU has the hardware; the trough filler on every GPU; none
    for a peak cap alone.
    """
    records = fleet.records
    gpus = [u for u in fleet.node_gpus.get(node_id, ()) if u in records]
    if plan.mode == "firmware":
        return tuple(u for u in gpus if records[u].power_smoothing_supported)
    return tuple(gpus) if plan.trough_filler_w else ()


def plan_command(
    plan: swing.SmoothingPlan, node_id: str, gpus: tuple[str, ...], *, enabled: bool, reason: str, deadline_s: float
) -> commands.NodeCommand:
    """The command that switches `plan`'s node-side smoothing on (or off) on some GPUs.

    Firmware: the GPUs' power-smoothing profile. Emulated: the node's trough-filler hook (off, it
    lowers its floor at the job ramp, a soft landing). A peak cap needs no command: it rides on
    the caps.
    """
    if plan.mode == "firmware":
        if not enabled:
            return commands.SetSmoothing(node_id, gpus, False, reason=reason, deadline_s=deadline_s)
        return commands.SetSmoothing(
            node_id,
            gpus,
            True,
            floor_pct=plan.floor_pct,
            ramp_up_w_per_s=plan.ramp_up_w_per_s,
            ramp_down_w_per_s=plan.ramp_down_w_per_s,
            reason=reason,
            deadline_s=deadline_s,
        )
    return commands.SetTroughFiller(
        node_id, gpus, enabled, plan.trough_filler_w or 0.0, plan.job_ramp_w_per_s, reason, deadline_s
    )


def disable(
    state: SmoothingState, why: str, *, fleet: period_inputs.FleetView, now_s: float, policy: power_policy.PowerPolicy
) -> Decision:
    """Switch the plan off: an "off" to every node that carries it (every connected one if not known)."""
    notes = (commands.Note("warning", "power_smoothing_off", {"reason": why}),)
    plan = state.plan
    state = dataclasses.replace(state, plan=None, restored=False)
    if plan is None:
        return state, (), notes
    nodes = state.nodes or dict.fromkeys(fleet.sessions, "restored")  # restored and never judged
    deadline = now_s + policy.command_ttl_s
    out = []
    for node_id in nodes:
        gpus = gpus_for(plan, node_id, fleet)
        if gpus:
            out.append(plan_command(plan, node_id, gpus, enabled=False, reason=why, deadline_s=deadline))
    return dataclasses.replace(state, nodes={}), tuple(out), notes


def _send(
    state: SmoothingState, plan: swing.SmoothingPlan, ctx: SmoothContext, *, only_new: bool
) -> tuple[SmoothingState, tuple[commands.NodeCommand, ...]]:
    """The plan's "on" to every connected node (`only_new`: to those that do not carry it yet)."""
    fleet = ctx.fleet
    nodes, sent_s = dict(state.nodes), dict(state.sent_s)
    out = []
    for node_id, session_id in fleet.sessions.items():
        # Keyed by the stream: a node that reconnected may have rebooted, which clears the profile.
        key = f"{plan.reason}/{session_id}"
        sent_at = sent_s.get(node_id, 0.0)
        # A GPU reset or reboot also clears it: telemetry says so (read after the profile was sent).
        lost = any(
            (r := fleet.latest.get(u)) is not None
            and r.power_smoothing_enabled is False
            and fleet.latest_controller_ns.get(u, 0) / 1e9 > sent_at + 1.0
            for u in fleet.node_gpus.get(node_id, ())
        )
        if only_new and nodes.get(node_id) == key and not lost:
            continue
        gpus = gpus_for(plan, node_id, fleet)
        if not gpus:
            continue
        nodes[node_id] = key
        sent_s[node_id] = ctx.now_s
        deadline = ctx.now_s + ctx.policy.command_ttl_s
        out.append(plan_command(plan, node_id, gpus, enabled=True, reason=plan.reason, deadline_s=deadline))
    return dataclasses.replace(state, nodes=nodes, sent_s=sent_s), tuple(out)


def ramp_for_the_straggler(
    plan: swing.SmoothingPlan,
    report: swing.SwingReport,
    peaks_w: Sequence[float],
    policy: power_policy.PowerPolicy,
) -> swing.SmoothingPlan:
    """Size the ramp rate for the highest-drawing rank, not the mean one.

    `plan_smoothing` sizes the ramp-up so the *mean* GPU loses at most `step_time_cost_max_pct` of
    a step; but a synchronous step waits for its slowest rank, which is the one with the most to
    climb from the floor. Same formula, with the 99th percentile of the GPUs' peak draw over the
    detector's window (`peaks_w`).

    Example: floor 560 W, the mean GPU peaks at 650 W but the 99th percentile at 700 W, 2 s steps,
    0.5 % cost -> ramp >= 140^2 / (2 x 0.005 x 2 x 700) = 1,400 W/s, if the plan's is slower.
    """
    if plan.mode != "firmware" or plan.floor_w <= 0 or not peaks_w:
        return plan
    peak = float(np.percentile(peaks_w, 99))
    kept = peak - plan.floor_w
    cost = policy.step_time_cost_max_pct / 100.0
    if kept <= 0 or cost <= 0:
        return plan
    ramp = kept**2 / (2.0 * cost * (report.period_s or 1.0) * peak)
    if ramp <= plan.ramp_up_w_per_s:
        return plan
    return dataclasses.replace(plan, ramp_up_w_per_s=ramp, ramp_down_w_per_s=ramp)


def _detector_series(ctx: SmoothContext, state: SmoothingState) -> tuple[np.ndarray, int] | commands.Note | None:
    """The unmanaged aggregate series the detector reads, and the GPUs it stands for.

    Returns:
        (series W, GPUs); a note saying why the window cannot be judged yet; None when it is empty.
    """
    window = ctx.config.detect_window_s
    since = ctx.now_s - window
    if state.off_since_s is not None:
        since = max(since, state.off_since_s + 1.0)
    if ctx.ramped_at_s is not None:
        # Power under a rising start ramp is not the unmanaged swing the plan must be sized from.
        since = max(since, ctx.ramped_at_s + 1.0)
    # Under start profiles the aggregate is masked (the profiles' ramp rates hold the swing
    # down): the canaries, kept without one, show the unmanaged swing, scaled to the job.
    masked = ctx.start.active()
    if masked and not ctx.start.canaries:
        why = "start profiles and no canary GPUs: the plan waits for their release"
        return commands.Note("info", "power_swing_masked", {"reason": why})
    since_ns = int(since * 1e9)
    rows = [row for row in ctx.window.swing_rows if row[0] >= since_ns]
    if not rows:
        return None
    full = max(count for _, _, count in rows)
    expected = len(ctx.start.canaries) if masked else len(ctx.gpus)
    n_gpus = len(ctx.start.rate_w_per_s) + len(ctx.start.canaries) if masked else full
    series = swing.scaled_series(rows, full) * (n_gpus / full)
    if len(series) < 0.5 * window * ctx.window.sample_hz or full < 0.8 * expected:
        fields = {"buckets": len(series), "gpus_reporting": full, "canaries": masked}
        return commands.Note("info", "power_swing_window_incomplete", fields)
    return series, n_gpus


def _detect_and_plan(state: SmoothingState, ctx: SmoothContext) -> Decision:
    """Detect the unmanaged swing and, where it is worth its cost, plan smoothing and send it."""
    found = _detector_series(ctx, state)
    if found is None:
        return state, (), ()
    if isinstance(found, commands.Note):
        return state, (), (found,)
    series, n_gpus = found
    policy = ctx.policy
    report = swing.detect(series, ctx.window.sample_hz, policy=policy)
    records = ctx.fleet.records
    supported = all(records[g.gpu_uuid].power_smoothing_supported for g in ctx.gpus if g.gpu_uuid in records)
    tdp = float(np.median(ctx.max_w))
    plan = swing.plan_smoothing(report, n_gpus=n_gpus, tdp_w=tdp, firmware_supported=supported, policy=policy)
    state = dataclasses.replace(state, unmanaged=report)
    if ctx.start.active():
        state = dataclasses.replace(state, canary_p2p_w=report.p2p_w)
    if not plan.active:
        fields = {"reason": plan.reason, "p2p_w": round(report.p2p_w)}
        return state, (), (commands.Note("info", "power_smoothing_not_needed", fields),)
    peaks = ctx.window.straggler_peaks_w or {}
    plan = ramp_for_the_straggler(plan, report, [peaks[g.gpu_uuid] for g in ctx.gpus if g.gpu_uuid in peaks], policy)
    state = dataclasses.replace(state, plan=plan, nodes={})
    fields = {"reason": plan.reason, "floor_w": round(plan.floor_w, 1), "ramp_w_per_s": round(plan.ramp_up_w_per_s, 1)}
    state, sent = _send(state, plan, ctx, only_new=False)
    return state, sent, (commands.Note("info", "power_smoothing_planned", fields),)


def smooth(state: SmoothingState, ctx: SmoothContext) -> Decision:
    """The detected-swing plan for one period: judge a restored plan, keep, resend, end or make one."""
    if state.restored:
        reporting = int(np.count_nonzero(ctx.columns.present))
        if reporting < RESTORE_COVERAGE * len(ctx.gpus):
            return state, (), ()  # judged once the fleet's telemetry is back, or reconnecting GPUs read as idle
        # The predecessor's nodes are not known: every node now connected gets the plan again
        # (the same profile, harmless) or, if the job stopped, its "off".
        state = dataclasses.replace(state, restored=False, nodes=dict.fromkeys(ctx.fleet.sessions, "restored"))
    running = views.job_running(ctx.columns)
    if state.plan is not None:
        if not running:
            state, sent, notes = disable(state, "the job stopped", fleet=ctx.fleet, now_s=ctx.now_s, policy=ctx.policy)
            return dataclasses.replace(state, off_since_s=ctx.now_s), sent, notes
        state, sent = _send(state, state.plan, ctx, only_new=True)
        return state, sent, ()
    if not running:
        return state, (), ()
    return _detect_and_plan(state, ctx)


@dataclasses.dataclass(frozen=True, eq=False)
class StartProfiles:
    """One period's job-start profiles: the new state and the commands that carry it."""

    start: start_smoothing.StartState
    commands: tuple[commands.SetSmoothing, ...]
    notes: tuple[commands.Note, ...]
    held: int
    """GPUs under a start profile after this period."""


def start_profiles(
    start: start_smoothing.StartState,
    ramp: power_ramp.RampDecision,
    ctx: SmoothContext,
    *,
    plan_active: bool,
    canary_p2p_w: float | None,
    unanswered: frozenset[str],
) -> StartProfiles:
    """Start profiles (`core.power.start_smoothing`): on at once for GPUs that start a job.

    Handed over to the swing plan (no command: its profile replaces them), off after the release
    time; GPUs whose command went unanswered (`unanswered`) get it again, in whichever state is due.
    """
    gpus = ctx.gpus
    none = np.zeros(len(gpus), dtype=bool)
    records = ctx.fleet.records
    started = ramp.started if ramp.started is not None else none
    # `decide` reads `supported` only where a job starts: looked up there, not for 100,000 GPUs a period.
    supported = np.zeros(len(gpus), dtype=bool)
    at = np.flatnonzero(started)
    if len(at):
        supported[at] = [
            (r := records.get(gpus[i].gpu_uuid)) is not None and r.power_smoothing_supported for i in at.tolist()
        ]
    decision = start_smoothing.decide(
        start,
        gpu_uuids=[g.gpu_uuid for g in gpus],
        supported=supported,
        started=started,
        starting=ramp.under_ceiling if ramp.under_ceiling is not None else none,
        parked=ramp.parked_mask if ramp.parked_mask is not None else none,
        max_w=ctx.max_w,
        detected_active=plan_active,
        unmanaged_p2p_w=canary_p2p_w,
        now_s=ctx.now_s,
        policy=ctx.policy,
    )
    held = decision.state.rate_w_per_s
    apply = dict(decision.apply_w_per_s)
    release = set(decision.release)
    for gpu in unanswered:  # unanswered last time: again, in whichever state it should be now
        if gpu in held:
            apply.setdefault(gpu, held[gpu])
        elif decision.handed_over == 0 and gpu not in decision.state.canaries:
            release.add(gpu)
    notes = []
    if decision.handed_over:
        notes.append(commands.Note("info", "power_start_smoothing_handed_over", {"gpus": decision.handed_over}))
    node_of = {g.gpu_uuid: g.node_id for g in gpus} if apply or release else {}  # mostly neither: 100,000 GPUs
    groups: dict[tuple[str, float | None], list[str]] = {}
    for gpu, rate in apply.items():
        groups.setdefault((node_of[gpu], rate), []).append(gpu)
    for gpu in sorted(release):
        if gpu in node_of:
            groups.setdefault((node_of[gpu], None), []).append(gpu)
    if groups:
        fields = {"reason": decision.reason, "on": len(apply), "off": len(release)}
        notes.append(commands.Note("info", "power_start_smoothing", fields))
    deadline = ctx.now_s + ctx.policy.command_ttl_s
    out = [_start_command(node_id, tuple(ids), rate, ctx.policy, deadline) for (node_id, rate), ids in groups.items()]
    return StartProfiles(decision.state, tuple(out), tuple(notes), len(held))


def _start_command(
    node_id: str, gpus: tuple[str, ...], rate: float | None, policy: power_policy.PowerPolicy, deadline_s: float
) -> commands.SetSmoothing:
    """A job-start profile on (at `rate`, the firmware's lowest floor) or off (`rate` None)."""
    if rate is None:
        return commands.SetSmoothing(
            node_id, gpus, False, reason="job-start smoothing released", deadline_s=deadline_s, job_start=True
        )
    return commands.SetSmoothing(
        node_id,
        gpus,
        True,
        floor_pct=policy.floor_min_pct,
        ramp_up_w_per_s=rate,
        ramp_down_w_per_s=rate,
        reason="job-start smoothing",
        deadline_s=deadline_s,
        job_start=True,
    )
