"""The power half of rasd-sim: the fleet's budget tree, the ground-truth probe, report.json's power figures.

Ground truth comes from the simulated GPUs themselves, not from the controller's telemetry: the
probe samples the shared training job (`rasd.agent.gpu.step_job.StepJob`) at 10 Hz, i.e. what every
GPU drew and which limit it enforced, as the controller's commands left them. The *unmanaged*
reference is a second job with the same seed and the same ranks that nobody caps or smooths, run in
the same process over the same instants: the same scenario with power management off, in the same run.

Figures (all over the measurement window, from the moment smoothing was active plus a settling time,
to the end; unmanaged figures over the same instants):

- swing_p2p_w_*: max - min of aggregate draw; swing_reduction_pct = 1 - managed / unmanaged;
- band_power_attenuation_db: 10 log10 of unmanaged over managed aggregate power in 0.1-2 Hz (Welch);
  band_power_attenuation_db_undisturbed: the same over the GPUs whose work and smoothing profile no
  event changed from one step before the window to its end (no rank evicted or rejoining, no
  profile cleared by a reset or a reboot), with band_attenuation_note saying what the difference is;
- max_ramp_w_per_s: largest |P(t + 1 s) - P(t)| of the managed aggregate over the whole run (a job
  that runs before the controller has seen it, or before the detector has, swings unmanaged until
  then); max_ramp_w_per_s_window: the same over the measurement window;
- step_time_cost_pct: mean managed step time over mean unmanaged step time, minus 1;
- energy_overhead_pct: managed energy per step over unmanaged energy per step, minus 1; the analytic
  minimum for the chosen floor is `swing.floor_energy_overhead_pct` over the unmanaged per-GPU draw;
- stranded_power_pct: the allocator's stranded watts (headroom held by uncapped GPUs while some GPU
  is capped), mean over the window's control periods, as % of the cluster budget;
- budget_violations: samples where the limits the GPUs enforce exceed a domain's budget, plus the
  limit changes between samples that left a budget exceeded (budget_violation_changes: every limit
  change is judged, so a GPU held at its default limit for an instant by a reset or a reboot counts
  whether or not a sample falls in that instant), outside the enforcement time of a budget cut
  (reported per cut as budget_cuts[].enforced_s, measured by polling the GPUs every 10 ms after the
  SetPowerBudget call), counted from the first instant every budget held (budgets_first_enforced_s:
  GPUs boot at their default limits, which may exceed the budgets).

GPUs the controller quarantines leave the job in both twins (the scheduler evicts them), so a GPU
held at its minimum cap does not stall the synchronous step; the quarantines are read at every
sample, so an eviction lasts as long as its quarantine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import numpy as np

from rasd.agent.gpu import step_job
from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.controller.core.power import swing
from rasd.controller.core.power import tree as power_tree
from rasd.controller.power import loop as power_loop
from rasd.sim import scenario as scenario_mod

SAMPLE_HZ = 10.0
SETTLE_S = 3.0
"""Seconds after smoothing starts before the measurement window opens (profiles land, ramps settle)."""
CUT_GRACE_S = 3.0
"""After a budget cut, the limits may exceed the new budget this long (the enforcement time, measured)."""


def tree_mapping(
    nodes: Sequence[tuple[str, str, str]], gpus_per_node: int, max_w: int, power: scenario_mod.PowerScenario
) -> dict[str, Any]:
    """The `[power.tree]` for the fleet: (node, rack, row) triples from the nodes' labels."""
    rows: dict[str, dict[str, list[str]]] = {}
    for node, rack, row in nodes:
        rows.setdefault(row, {}).setdefault(rack, []).append(node)
    cluster = power.cluster_budget_w or len(nodes) * gpus_per_node * max_w

    def budget(value: float | None) -> dict[str, int]:
        return {} if value is None else {"budget_w": int(value)}

    return {
        "name": "cluster",
        "budget_w": int(cluster),
        "rows": [
            {
                "name": row,
                "racks": [
                    {
                        "name": rack,
                        **budget(power.rack_budget_w),
                        "nodes": [{"name": n, **budget(power.node_budget_w)} for n in names],
                    }
                    for rack, names in racks.items()
                ],
            }
            for row, racks in rows.items()
        ],
    }


def power_table(tree: dict[str, Any], power: scenario_mod.PowerScenario) -> dict[str, Any]:
    """The controller's `[power]` table for this scenario."""
    return {"tree": tree, "policy": power.policy.to_mapping(), **power.loop}


@dataclasses.dataclass
class BudgetCut:
    """A scripted budget change and how long the GPUs took to enforce it."""

    at_s: float
    domain: str
    level: str
    budget_w: int
    enforced_s: float | None = None
    error: str = ""


@dataclasses.dataclass
class PowerTrace:
    """What the probe recorded (arrays aligned with `t_s`)."""

    t_s: np.ndarray
    managed_w: np.ndarray
    unmanaged_w: np.ndarray
    unmanaged_per_gpu_w: np.ndarray
    """(samples, gpus), float32: for the analytic energy minimum of a floor."""
    cluster_budget_w: np.ndarray
    violations: int
    violation_domains: list[str]
    violation_times_s: list[float]
    cuts: list[BudgetCut]
    smoothing_from_s: float | None
    floor_w: float | None
    managed_steps_s: list[tuple[float, float, int]]
    """(start s, length s, step index) of each completed step of the managed job."""
    unmanaged_steps_s: list[tuple[float, float, int]]
    stranded_w: list[tuple[float, float]]
    settling_w: list[tuple[float, float]]
    """(s since start, W a raise granted and the draw has not shown yet) per control period."""
    loop_step_ms: list[float]
    periods: int
    smoothing_mode: str
    managed: bool
    initial_enforced_s: float | None = None
    violation_changes: int = 0
    """Limit changes between samples that left a budget exceeded (counted in `violations` too)."""
    managed_per_gpu_w: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    """(samples, gpus), float32: the managed job's draws, for the figures over undisturbed GPUs."""
    disturbed: list[tuple[float, tuple[int, ...]]] = dataclasses.field(default_factory=list)
    """(s since start, ranks) whenever ranks left or rejoined the job or lost their smoothing floor."""
    load_changes_s: list[float] = dataclasses.field(default_factory=list)
    job_start_s: float | None = None
    """Seconds after the run's start at which the job's first step began."""
    ramp_gpus: list[tuple[float, int, int]] = dataclasses.field(default_factory=list)
    """(s since start, GPUs parked, GPUs ramping) as the power loop last reported, per sample."""
    start_smoothed: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    """(s since start, GPUs under a job-start smoothing profile) as the power loop last reported, per sample."""
    managed_cap_w: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 2)))
    """(s since start, summed limits the managed GPUs enforce, W), read at each wake-up of the sampler
    (about 10 Hz; later when the event loop is busy, so not on the grid of `t_s`)."""


class PowerProbe:
    """Samples the managed job and its unmanaged twin; plays the scenario's budget changes."""

    def __init__(
        self,
        job: step_job.StepJob,
        seed: int,
        rank_nodes: Sequence[str],
        rank_gpus: Sequence[str],
        max_w: float,
        power: scenario_mod.PowerScenario,
        started_ns: int,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        """Build the unmanaged twin of `job` (same seed, same ranks); call after every rank joined."""
        self.job = job
        self.shadow = step_job.StepJob(job.shape, seed)
        self.shadow.add_ranks(job.compute_w.tolist(), job.comm_w.tolist(), [max_w] * len(job.compute_w))
        self.rank_nodes = list(rank_nodes)
        self.rank_gpus = list(rank_gpus)
        self.quarantined: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None
        """Reads the controller's active quarantines: their GPUs leave the job (the scheduler evicts them)."""
        self.workload_stopped: Callable[[], set[str]] | None = None
        """The GPUs whose process is gone (killed, or dead of its fault): they stay out of the job too."""
        self.initial_enforced_s: float | None = None
        self._loads = list(power.load_changes)
        self.stopped_nodes: set[str] = set()
        self.load_changes_s: list[float] = []
        self.power = power
        self.started_ns = started_ns
        self.clock = clock
        self.loop: power_loop.PowerLoop | None = None
        self._t: list[float] = []
        self._managed: list[float] = []
        self._unmanaged: list[float] = []
        self._per_gpu: list[np.ndarray] = []
        self._per_gpu_managed: list[np.ndarray] = []
        self._disturbed: list[tuple[float, tuple[int, ...]]] = []
        self._seen_ranks = (job.active.copy(), job.floor_w.copy())
        """The job's membership and smoothing floors at the last wake-up (`_note_disturbances`)."""
        self._budget: list[float] = []
        self._caps: list[tuple[float, float]] = []
        self.violations = 0
        self.violation_changes = 0
        self._caps_in_force = job.watch_caps()
        """The limits in force as the limit changes replayed so far left them (`judge_limit_changes`)."""
        self._tree_before: power_tree.PowerTree | None = None
        self._node_idx: tuple[Any, np.ndarray] | None = None
        """(the tree index it was built for, each rank's node index in it)."""
        self.violation_domains: set[str] = set()
        self.violation_times_s: list[float] = []
        self.cuts: list[BudgetCut] = []
        self.smoothing_from_s: float | None = None
        self.floor_w: float | None = None
        self.smoothing_mode = "off"
        self._ramp_gpus: list[tuple[float, int, int]] = []
        self._start_smoothed: list[tuple[float, int]] = []

    def _elapsed_s(self) -> float:
        return (self.clock() - self.started_ns) / 1e9

    def _over(self, tree: power_tree.PowerTree, caps_w: np.ndarray | None = None) -> list[str]:
        """The domains whose budget the limits exceed (caps_w: the job's limits in force now)."""
        idx = tree.index
        if self._node_idx is None or self._node_idx[0] is not idx:
            node_idx = np.array([idx.node_of_name.get(n, -1) for n in self.rank_nodes], dtype=np.intp)
            self._node_idx = (idx, node_idx)
        node_idx = self._node_idx[1]
        known = node_idx >= 0
        return idx.over_budget(node_idx[known], (self.job.cap_w if caps_w is None else caps_w)[known])

    def judge_limit_changes(self, tree: power_tree.PowerTree) -> None:
        """Replay the limit changes since the last wake-up and count each that left a budget exceeded.

        A change is judged against the budgets in force at this wake-up and at the one before (a cut
        made in between must not be held against a limit set before it): over both, it is a
        violation, unless it falls in a cut's enforcement time or before the budgets first held.
        """
        before = self._tree_before or tree
        self._tree_before = tree
        start_s = self.started_ns / 1e9
        for at_s, rank, cap_w in self.job.take_cap_changes():
            self._caps_in_force[rank] = cap_w
            t = at_s - start_s
            if self.initial_enforced_s is None or t < self.initial_enforced_s:
                continue
            if any(c.at_s <= t < c.at_s + CUT_GRACE_S for c in self.cuts):
                continue
            over = self._over(tree, self._caps_in_force)
            if over:
                over = [d for d in self._over(before, self._caps_in_force) if d in over]
            if over:
                self.violations += 1
                self.violation_changes += 1
                self.violation_domains.update(over)
                self.violation_times_s.append(round(t, 2))

    async def sample(self, duration_s: float) -> None:
        """Sample both jobs on a uniform 10 Hz grid until duration_s after the start.

        The job keeps every step it computed, so grid instants the event loop was too busy to visit
        on time are evaluated when it wakes (the spectrum needs uniform samples); the limits in force
        are read at the wake-up.
        """
        period = 1.0 / SAMPLE_HZ
        n = 0
        start_s = self.started_ns / 1e9
        while n * period <= duration_s:
            await asyncio.sleep(max(0.0, n * period - self._elapsed_s()))
            if self._loads and self._loads[0].at_s <= self._elapsed_s():
                self._apply_load_changes()
            if self.quarantined is not None:
                # At every wake-up, so an eviction lasts as long as its quarantine (to a sample): read once
                # a second, the ~50 ms quarantine of a reset or a reboot was seen by chance and then kept
                # its ranks out of the job for the whole second, a cost no real scheduler would add.
                await self._evict_quarantined()
            elapsed = min(self._elapsed_s(), duration_s)
            loop = self.loop
            if loop is not None:
                self.judge_limit_changes(loop.tree)
            self._note_disturbances()
            budget = float(loop.tree.domains[0].budget_w or math.nan) if loop is not None else math.nan
            # The limits are read at the wake-up, which a busy loop delays: kept with the time they were read.
            self._caps.append((self._elapsed_s(), float(self.job.cap_w.sum())))
            due = []
            while n * period <= elapsed:
                due.append(n * period)
                n += 1
            for at in due:
                managed = self.job.draw_w(slice(None), start_s + at)
                unmanaged = self.shadow.draw_w(slice(None), start_s + at)
                self._t.append(at)
                self._managed.append(float(managed.sum()))
                self._unmanaged.append(float(unmanaged.sum()))
                self._per_gpu.append(unmanaged.astype(np.float32))
                self._per_gpu_managed.append(managed.astype(np.float32))
                self._budget.append(budget)
            if loop is None or not due:
                continue
            self._ramp_gpus.append((self._t[-1], loop.stats.ramp_parked, loop.stats.ramp_ramping))
            self._start_smoothed.append((self._t[-1], loop.stats.start_smoothed))
            smoothing = loop.status.smoothing
            if smoothing is not None and smoothing.active and self.smoothing_from_s is None:
                self.smoothing_from_s = self._t[-1]
                self.floor_w = smoothing.floor_w
                self.smoothing_mode = smoothing.mode
            in_grace = any(c.at_s <= self._t[-1] < c.at_s + CUT_GRACE_S for c in self.cuts)
            over = self._over(loop.tree)
            if self.initial_enforced_s is None:
                # GPUs boot at their default limits: the first enforcement is a cut from "no budget".
                if not over:
                    self.initial_enforced_s = self._t[-1]
                continue
            if over and not in_grace:
                self.violations += len(due)
                self.violation_domains.update(over)
                self.violation_times_s.append(round(due[0], 1))

    def _note_disturbances(self) -> None:
        """Record the ranks that left or rejoined the job, or lost their smoothing floor, since the last wake-up.

        A floor that goes to 0 while the job runs is a profile a reset or a reboot cleared (the
        controller puts it back once telemetry shows it gone); the controller's own floor changes
        are not disturbances.
        """
        active, floor = self.job.active.copy(), self.job.floor_w.copy()
        was_active, was_floor = self._seen_ranks
        changed = np.flatnonzero((active != was_active) | ((floor != was_floor) & (floor == 0)))
        if len(changed):
            self._disturbed.append((self._elapsed_s(), tuple(int(r) for r in changed)))
        self._seen_ranks = (active, floor)

    def _apply_load_changes(self) -> None:
        now = self._elapsed_s()
        while self._loads and self._loads[0].at_s <= now:
            change = self._loads.pop(0)
            names = list(dict.fromkeys(self.rank_nodes))[: change.nodes]
            if change.running:
                self.stopped_nodes.difference_update(names)
            else:
                self.stopped_nodes.update(names)
            self.load_changes_s.append(now)
        self._set_active(set(), set())

    def _set_active(self, nodes: set[str], gpus: set[str]) -> None:
        if self.workload_stopped is not None:
            gpus = gpus | self.workload_stopped()
        for rank, (node, gpu) in enumerate(zip(self.rank_nodes, self.rank_gpus, strict=True)):
            active = node not in nodes and gpu not in gpus and node not in self.stopped_nodes
            self.job.set_active(rank, active)
            self.shadow.set_active(rank, active)

    async def _evict_quarantined(self) -> None:
        assert self.quarantined is not None
        rows = await self.quarantined()
        nodes = {q["node_id"] for q in rows if not q["gpu_uuid"] and not q["port"]}
        gpus = {q["gpu_uuid"] for q in rows if q["gpu_uuid"]}
        self._set_active(nodes, gpus)

    async def play_budget_changes(self, admin: admin_grpc.AdminServiceStub, duration_s: float) -> None:
        """Send each scripted budget change through AdminService and time its enforcement on the GPUs."""
        for change in self.power.budget_changes:
            if change.at_s >= duration_s or self.loop is None:
                continue
            await asyncio.sleep(max(0.0, change.at_s - self._elapsed_s()))
            names = {d.name: d.level for d in self.loop.tree.domains}
            level = names.get(change.domain, "?")
            cut = BudgetCut(self._elapsed_s(), change.domain, level, change.budget_w)
            self.cuts.append(cut)
            sent = time.perf_counter()
            try:
                await admin.SetPowerBudget(
                    admin_pb.SetPowerBudgetRequest(
                        domain_id=change.domain, budget_w=change.budget_w, reason="scenario budget change"
                    ),
                    timeout=10,
                )
            except grpc.aio.AioRpcError as exc:  # a refused change is part of the report, not a crash
                cut.error = f"{exc.code().name}: {exc.details()}"
                continue
            while time.perf_counter() - sent < 30.0:
                if change.domain not in self._over(self.loop.tree):
                    cut.enforced_s = time.perf_counter() - sent
                    break
                await asyncio.sleep(0.01)

    def trace(self, until_ns: int) -> PowerTrace:
        """Everything recorded, with both jobs' steps up to until_ns."""
        loop = self.loop
        since = self.job.start_s
        until = until_ns / 1e9

        def steps(job: step_job.StepJob) -> list[tuple[float, float, int]]:
            return [
                (s.start_s - self.started_ns / 1e9, s.end_s - s.start_s, s.index)
                for s in job.completed_steps(since, until)
            ]

        return PowerTrace(
            t_s=np.array(self._t),
            managed_w=np.array(self._managed),
            unmanaged_w=np.array(self._unmanaged),
            unmanaged_per_gpu_w=np.array(self._per_gpu, dtype=np.float32),
            managed_per_gpu_w=np.array(self._per_gpu_managed, dtype=np.float32),
            disturbed=list(self._disturbed),
            cluster_budget_w=np.array(self._budget),
            managed_cap_w=np.array(self._caps).reshape(-1, 2),
            violations=self.violations,
            violation_changes=self.violation_changes,
            violation_domains=sorted(self.violation_domains),
            violation_times_s=self.violation_times_s[:50],
            cuts=self.cuts,
            smoothing_from_s=self.smoothing_from_s,
            floor_w=self.floor_w,
            managed_steps_s=steps(self.job),
            unmanaged_steps_s=steps(self.shadow),
            stranded_w=[(t - self.started_ns / 1e9, w) for t, w in loop.stats.stranded_w] if loop else [],
            settling_w=[(t - self.started_ns / 1e9, w) for t, w in loop.stats.settling_w] if loop else [],
            loop_step_ms=list(loop.stats.step_ms) if loop else [],
            periods=loop.stats.periods if loop else 0,
            smoothing_mode=self.smoothing_mode,
            managed=loop is not None,
            initial_enforced_s=self.initial_enforced_s,
            load_changes_s=self.load_changes_s,
            job_start_s=self.job.start_s - self.started_ns / 1e9,
            ramp_gpus=self._ramp_gpus,
            start_smoothed=self._start_smoothed,
        )


def _r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def report_section(
    trace: PowerTrace, policy: Any, *, measure_from_s: float | None = None, measure_until_s: float | None = None
) -> dict[str, Any]:
    """The managed-power figures of report.json (see the module docstring for each definition)."""
    t = trace.t_s
    if len(t) < 8:
        return {"managed": trace.managed, "note": "too few samples to measure"}
    start, window = _measure_window(trace, measure_from_s, measure_until_s)
    managed, unmanaged = trace.managed_w[window], trace.unmanaged_w[window]
    p2p_m = float(managed.max() - managed.min())
    p2p_u = float(unmanaged.max() - unmanaged.min())
    band_m = swing.band_power(managed, SAMPLE_HZ, policy.band_low_hz, policy.band_high_hz)
    band_u = swing.band_power(unmanaged, SAMPLE_HZ, policy.band_low_hz, policy.band_high_hz)
    win_from, win_to = float(t[window][0]), float(t[window][-1])
    step_m = _mean_step(trace.managed_steps_s, win_from, win_to)
    step_u = _mean_step(trace.unmanaged_steps_s, win_from, win_to)
    step_cost = 100.0 * (step_m / step_u - 1.0) if step_m and step_u else None
    energy = None
    if step_m and step_u and unmanaged.mean() > 0:
        energy = 100.0 * ((managed.mean() * step_m) / (unmanaged.mean() * step_u) - 1.0)
    analytic = None
    if trace.floor_w:
        per_gpu = trace.unmanaged_per_gpu_w[window].T
        # Only GPUs running the job carry the floor (evicted ones idle without a profile).
        running = per_gpu.max(axis=1) > trace.floor_w
        analytic = swing.floor_energy_overhead_pct(per_gpu[running], trace.floor_w, SAMPLE_HZ)
    budget = float(np.nanmax(trace.cluster_budget_w)) if np.isfinite(trace.cluster_budget_w).any() else None
    stranded = [w for s, w in trace.stranded_w if s >= start]
    ramp = swing.max_ramp_w_per_s(trace.managed_w, SAMPLE_HZ, 1.0)
    ramp_u = swing.max_ramp_w_per_s(trace.unmanaged_w, SAMPLE_HZ, 1.0)
    return {
        "managed": trace.managed,
        "budget_violations": trace.violations,
        "budget_violation_changes": trace.violation_changes,
        "budgets_first_enforced_s": _r(trace.initial_enforced_s, 2),
        "budget_violation_domains": trace.violation_domains,
        "budget_violation_times_s": trace.violation_times_s,
        "swing_p2p_w_unmanaged": _r(p2p_u),
        "swing_p2p_w_managed": _r(p2p_m),
        "swing_reduction_pct": _r(100.0 * (1.0 - p2p_m / p2p_u), 2) if p2p_u > 0 else None,
        "band_power_attenuation_db": _r(swing.attenuation_db(band_u, band_m), 2),
        **_undisturbed_band(trace, window, start, policy, swing.attenuation_db(band_u, band_m)),
        "band_hz": [policy.band_low_hz, policy.band_high_hz],
        "max_ramp_w_per_s": _r(ramp),
        "max_ramp_w_per_s_unmanaged": _r(ramp_u),
        "max_ramp_w_per_s_window": _r(swing.max_ramp_w_per_s(managed, SAMPLE_HZ, 1.0)),
        "step_time_cost_pct": _r(step_cost, 3),
        "step_s_managed": _r(step_m, 4),
        "step_s_unmanaged": _r(step_u, 4),
        "energy_overhead_pct": _r(energy, 2),
        "energy_overhead_analytic_min_pct": _r(analytic, 2),
        "energy_overhead_ratio_to_min": _r(energy / analytic, 3) if energy is not None and analytic else None,
        "stranded_power_pct": _r(100.0 * float(np.mean(stranded)) / budget, 3) if stranded and budget else None,
        "stranded_power_pct_max": _r(100.0 * float(np.max(stranded)) / budget, 3) if stranded and budget else None,
        "smoothing_mode": trace.smoothing_mode,
        "smoothing_from_s": _r(trace.smoothing_from_s, 2),
        "floor_w_per_gpu": _r(trace.floor_w),
        "window_s": [_r(win_from, 2), _r(win_to, 2)],
        "control_periods": trace.periods,
        "control_period_ms_p99": _r(float(np.percentile(trace.loop_step_ms, 99)), 2) if trace.loop_step_ms else None,
        "budget_cuts": [_cut_row(c) for c in trace.cuts],
    }


BAND_GOAL_DB = 20.0
"""The in-band attenuation goal (bench/power.py's GOALS)."""


def _undisturbed_band(
    trace: PowerTrace, window: np.ndarray, start_s: float, policy: Any, all_db: float
) -> dict[str, Any]:
    """The band attenuation over the GPUs no event disturbed in the window, and what the difference says.

    A rank that leaves or rejoins the job, or whose smoothing profile a reset or a reboot clears until
    the controller puts it back, changes the fleet's load in a step that no smoothing damps and whose
    spectrum falls in the band too; in a small fleet each such step is a large share of the load.
    """
    per_gpu_m, per_gpu_u = trace.managed_per_gpu_w, trace.unmanaged_per_gpu_w
    if per_gpu_m.shape != per_gpu_u.shape or per_gpu_m.ndim != 2 or per_gpu_m.shape[0] != len(trace.t_s):
        return {}
    gpus = per_gpu_m.shape[1]
    # A change up to one step before the window still shapes the window's first step.
    steps = [length for _, length, _ in trace.managed_steps_s]
    lead_s = float(np.median(steps)) if steps else SETTLE_S
    disturbed = {r for at_s, ranks in trace.disturbed if at_s >= start_s - lead_s for r in ranks}
    keep = np.array([r not in disturbed for r in range(gpus)], dtype=bool)
    if not keep.any():
        return {"undisturbed_gpus": 0, "disturbed_gpus": gpus}
    band = [
        swing.band_power(series[window][:, keep].sum(axis=1).astype(np.float64), SAMPLE_HZ,
                         policy.band_low_hz, policy.band_high_hz)
        for series in (per_gpu_u, per_gpu_m)
    ]  # fmt: skip
    undisturbed_db = swing.attenuation_db(band[0], band[1])
    out: dict[str, Any] = {
        "band_power_attenuation_db_undisturbed": _r(undisturbed_db, 2),
        "undisturbed_gpus": int(keep.sum()),
        "disturbed_gpus": gpus - int(keep.sum()),
    }
    if disturbed and math.isfinite(all_db) and all_db < BAND_GOAL_DB:
        verdict = "met" if undisturbed_db >= BAND_GOAL_DB else "not met either"
        out["band_attenuation_note"] = (
            f"over the {int(keep.sum())} GPUs no event disturbed it is {undisturbed_db:.1f} dB "
            f"({BAND_GOAL_DB:g} dB goal {verdict}), over all {gpus} {all_db:.1f} dB: events took "
            f"{len(disturbed)} GPUs' work out of the job or back in, or cleared their smoothing profile "
            f"({100.0 * len(disturbed) / gpus:.0f}% of this fleet), load steps that no smoothing damps and "
            "that fall in the band; the same events are a smaller share of a larger fleet"
        )
    return out


def _measure_window(
    trace: PowerTrace, measure_from_s: float | None, measure_until_s: float | None
) -> tuple[float, np.ndarray]:
    """(start, mask) of the samples report_section measures: from settling after smoothing began by default."""
    t = trace.t_s
    start = measure_from_s
    if start is None:
        start = (trace.smoothing_from_s + SETTLE_S) if trace.smoothing_from_s is not None else float(t[len(t) // 3])
    window = (t >= start) & (t < (measure_until_s if measure_until_s is not None else math.inf))
    # Budget cuts change the managed level on purpose; they stay in the window (they are part of the
    # run), but a window with fewer than 10 s cannot say much about a 0.1 Hz band.
    if window.sum() < 8:
        window = t >= t[len(t) // 2]
    return start, window


def _mean_step(steps: list[tuple[float, float, int]], win_from: float, win_to: float) -> float | None:
    """Mean duration of the steps (start, duration, index) wholly inside [win_from, win_to]; None if none."""
    inside = [d for s, d, _ in steps if s >= win_from and s + d <= win_to]
    return float(np.mean(inside)) if inside else None


def _cut_row(cut: BudgetCut) -> dict[str, Any]:
    """One budget cut as report.json lists it."""
    return {
        "at_s": round(cut.at_s, 2),
        "domain": cut.domain,
        "level": cut.level,
        "budget_w": cut.budget_w,
        "enforced_s": _r(cut.enforced_s, 3),
        **({"error": cut.error} if cut.error else {}),
    }


def _max_rise_1s(t_s: np.ndarray, watts: np.ndarray) -> float:
    """Largest P(t2) - P(t1) over samples with 0 < t2 - t1 <= 1 s, in their own times, W (0: no rise).

    The samples' own read times, not a grid: a reading the busy event loop delayed by 0.2 s, put on
    the grid instant it was due, would stretch a "1 s" window to 1.2 s of landed raises.
    """
    rise = 0.0
    for i in range(len(t_s)):
        later = (t_s > t_s[i]) & (t_s <= t_s[i] + 1.0)
        if later.any():
            rise = max(rise, float(watts[later].max() - watts[i]))
    return rise


def job_start_section(trace: PowerTrace, *, period_s: float, after_ramp_s: float = 2.0) -> dict[str, Any]:
    """Job-start figures: the aggregate ramp over 1 s while the job starts, and what the start ramp costs.

    The window runs from 1 s before the job's first step to `after_ramp_s` after the last period in
    which the power loop raised a job-start ceiling (or `after_ramp_s` after the start without a
    ramp). Over it, managed and unmanaged (same instants):

    - job_start_ramp_1s_w_per_s_*: largest |P(t + 1 s) - P(t)| of the aggregate draw (G3's measure);
      in a step-synchronous job it holds the step's own compute/communication swing under the
      rising cap as well as the start (which the start profiles' ramp rates hold, where the GPUs
      have smoothing hardware: `rasd.controller.core.power.start_smoothing`);
    - job_start_ramp_1s_w_per_s_to_end_managed: the same from 1 s before the start to the end of the
      run (the hand-over to the swing plan, or the release of the start profiles, included);
    - job_start_smoothing_from_s / _until_s / _gpus: when GPUs first and last carried a start
      profile (seconds since the run's start) and the most that did at once; swing_plan_from_s:
      when the detected-swing plan was first in force;
    - job_start_envelope_ramp_1s_w_per_s_*: the same over the aggregate averaged over one step
      (`period_s`), i.e. the start ramp without the step's swing;
    - job_start_jump_w: the managed aggregate's rise in the first 1 s of the job: idle draw to the
      start cap (no cap can go below a GPU's minimum limit);
    - job_start_cap_ramp_1s_w_per_s: largest rise over 1 s of the summed limits the GPUs enforce,
      in the times they were read (the landed cap changes alone, without the start jump or the
      job's own draw).

    Cost: step k of both twins starts from the same instant; full_speed_after_s is when the first
    managed step no more than 1 % longer than its unmanaged twin began (seconds after the job
    start), and job_start_delay_s how far the managed job was behind the unmanaged one then (the
    extra seconds the first steps took).
    """
    t = trace.t_s
    start = trace.job_start_s
    if start is None or len(t) < 8 or start < 1.0:
        return {"job_start_note": "the job starts with the run: no parked start to measure"}
    ramping = [at for at, _, n in trace.ramp_gpus if n > 0 and at >= start]
    profiled = [at for at, n in trace.start_smoothed if n > 0 and at >= start]
    ramp_end = max(ramping) if ramping else None
    until = (ramp_end if ramp_end is not None else start) + after_ramp_s
    window = (t >= start - 1.0) & (t <= until)
    envelope_managed, envelope_unmanaged = _envelope_ramps(trace, window, period_s)
    caps = trace.managed_cap_w
    in_window = (caps[:, 0] >= start - 1.0) & (caps[:, 0] <= until)
    first_s = (t >= start) & (t <= start + 1.0)
    before = t < start
    full_speed, delay = _full_speed(trace, start)
    return {
        "job_start_s": _r(start, 2),
        "job_start_ramp_end_s": _r(ramp_end, 2),
        "job_start_window_s": [_r(start - 1.0, 2), _r(until, 2)],
        "job_start_ramp_1s_w_per_s_managed": _r(swing.max_ramp_w_per_s(trace.managed_w[window], SAMPLE_HZ, 1.0)),
        "job_start_ramp_1s_w_per_s_unmanaged": _r(swing.max_ramp_w_per_s(trace.unmanaged_w[window], SAMPLE_HZ, 1.0)),
        "job_start_envelope_ramp_1s_w_per_s_managed": _r(envelope_managed),
        "job_start_envelope_ramp_1s_w_per_s_unmanaged": _r(envelope_unmanaged),
        "job_start_cap_ramp_1s_w_per_s": _r(_max_rise_1s(caps[:, 0][in_window], caps[:, 1][in_window]))
        if in_window.any()
        else None,
        "job_start_jump_w": _r(float(trace.managed_w[first_s].max() - trace.managed_w[before][-1]))
        if first_s.any() and before.any()
        else None,
        "job_start_ramp_1s_w_per_s_to_end_managed": _r(
            swing.max_ramp_w_per_s(trace.managed_w[t >= start - 1.0], SAMPLE_HZ, 1.0)
        ),
        "job_start_smoothing_from_s": _r(min(profiled), 2) if profiled else None,
        "job_start_smoothing_until_s": _r(max(profiled), 2) if profiled else None,
        "job_start_smoothing_gpus": max((n for _, n in trace.start_smoothed), default=0),
        "swing_plan_from_s": _r(trace.smoothing_from_s, 2),
        "job_start_parked_gpus": max((p for _, p, _ in trace.ramp_gpus), default=0),
        "full_speed_after_s": _r(full_speed, 2),
        "job_start_delay_s": _r(delay, 2),
    }


def _envelope_ramps(trace: PowerTrace, window: np.ndarray, period_s: float) -> tuple[float, float]:
    """Largest 1 s ramp (managed, unmanaged) in window of the aggregate averaged over one step, W/s."""
    lag = max(1, round(period_s * SAMPLE_HZ))

    def envelope(series: np.ndarray) -> np.ndarray:
        return np.convolve(series, np.ones(lag) / lag, mode="valid")

    env_window = window[lag - 1 :]
    return (
        swing.max_ramp_w_per_s(envelope(trace.managed_w)[env_window], SAMPLE_HZ, 1.0),
        swing.max_ramp_w_per_s(envelope(trace.unmanaged_w)[env_window], SAMPLE_HZ, 1.0),
    )


def _full_speed(trace: PowerTrace, start: float) -> tuple[float | None, float | None]:
    """(full_speed_after_s, job_start_delay_s): see `job_start_section`; (None, None) if never."""
    # Twins are paired by step index, not by position: a list can lack a first step the other has
    # (one that began a hair before the job's recorded start), and a shift of one pairs step k with
    # step k + 1 (seen as a negative delay).
    unmanaged_by_index = {index: (u_start, u_len) for u_start, u_len, index in trace.unmanaged_steps_s}
    for m_start, m_len, index in trace.managed_steps_s:
        twin = unmanaged_by_index.get(index)
        if twin is not None and m_len <= 1.01 * twin[1]:
            return m_start - start, m_start - twin[0]
    return None, None


def _undisturbed_text(power: dict[str, Any]) -> str:
    """The band figure over undisturbed GPUs for report.md's row ("" when every GPU was undisturbed)."""
    if not power.get("disturbed_gpus") or power.get("band_power_attenuation_db_undisturbed") is None:
        return ""
    return (
        f"; {power['band_power_attenuation_db_undisturbed']} dB over the {power['undisturbed_gpus']} GPUs "
        f"no event disturbed (goal {BAND_GOAL_DB:g} dB)"
    )


def markdown_rows(power: dict[str, Any]) -> list[str]:
    """Rows for report.md's table: the managed-power figures, or why there are none."""
    if "swing_p2p_w_managed" not in power:
        return ["", "Power management was not run in this scenario (no `[power]` table): no managed figures."]
    cuts = "; ".join(
        f"{c['domain']} to {c['budget_w']} W in {c['enforced_s']} s" if c.get("enforced_s") is not None
        else f"{c['domain']} to {c['budget_w']} W: {c.get('error') or 'not enforced'}"
        for c in power.get("budget_cuts", [])
    ) or "none"  # fmt: skip
    return [
        f"| swing peak-to-peak unmanaged / managed | {power['swing_p2p_w_unmanaged']} W / "
        f"{power['swing_p2p_w_managed']} W ({power['swing_reduction_pct']} % less) |",
        f"| in-band (0.1-2 Hz) power attenuation | {power['band_power_attenuation_db']} dB{_undisturbed_text(power)} |",
        f"| max ramp managed / unmanaged | {power['max_ramp_w_per_s']} W/s / "
        f"{power['max_ramp_w_per_s_unmanaged']} W/s |",
        f"| step-time cost / energy overhead | {power['step_time_cost_pct']} % / {power['energy_overhead_pct']} % "
        f"(analytic minimum for the floor {power['energy_overhead_analytic_min_pct']} %) |",
        f"| smoothing | {power['smoothing_mode']} from {power['smoothing_from_s']} s, "
        f"floor {power['floor_w_per_gpu']} W/GPU |",
        f"| stranded power (mean / max of budget) | {power['stranded_power_pct']} % / "
        f"{power['stranded_power_pct_max']} % |",
        f"| budget violations (limits in force over a budget) | {power['budget_violations']} |",
        f"| budget cuts enforced on the GPUs | {cuts} |",
    ] + (["", f"In-band attenuation: {power['band_attenuation_note']}."] if power.get("band_attenuation_note") else [])
