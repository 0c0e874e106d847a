"""The report's power figures, computed from two real simulated jobs: one smoothed, one left alone."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import numpy as np

from rasd.agent.gpu import step_job
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import swing
from rasd.controller.core.power import tree as power_tree
from rasd.sim import power_sim, scenario

SHAPE = step_job.JobShape(period_s=1.0, compute_fraction=0.7, rank_jitter_s=(0.005, 0.02), anchor_unix_s=0.0)


def _job() -> step_job.StepJob:
    job = step_job.StepJob(SHAPE, seed=3)
    rng = np.random.default_rng(0)
    job.add_ranks(rng.uniform(650, 700, 64).tolist(), rng.uniform(100, 150, 64).tolist(), [1000.0] * 64)
    return job


def _trace(floor_w: float, ramp_w_per_s: float) -> power_sim.PowerTrace:
    managed, unmanaged = _job(), _job()
    for rank in range(64):
        managed.set_smoothing(rank, floor_w=floor_w, ramp_up_w_per_s=ramp_w_per_s, ramp_down_w_per_s=ramp_w_per_s)
    t = np.arange(0.0, 60.0, 0.1)
    per_gpu = np.array([unmanaged.draw_w(slice(None), x) for x in t])
    return power_sim.PowerTrace(
        t_s=t,
        managed_w=np.array([managed.draw_w(slice(None), x).sum() for x in t]),
        unmanaged_w=per_gpu.sum(axis=1),
        unmanaged_per_gpu_w=per_gpu.astype(np.float32),
        cluster_budget_w=np.full(len(t), 64_000.0),
        violations=0,
        violation_domains=[],
        violation_times_s=[],
        cuts=[],
        smoothing_from_s=0.0,
        floor_w=floor_w,
        managed_steps_s=[(s.start_s, s.end_s - s.start_s, s.index) for s in managed.completed_steps(0.0, 60.0)],
        unmanaged_steps_s=[(s.start_s, s.end_s - s.start_s, s.index) for s in unmanaged.completed_steps(0.0, 60.0)],
        stranded_w=[(float(x), 0.0) for x in range(0, 60, 3)],
        settling_w=[(float(x), 0.0) for x in range(0, 60, 3)],
        loop_step_ms=[1.0],
        periods=20,
        smoothing_mode="firmware",
        managed=True,
    )


def test_a_floor_near_the_peak_cuts_the_swing_and_costs_about_the_analytic_energy():
    policy = power_policy.PowerPolicy()
    figures = power_sim.report_section(_trace(floor_w=620.0, ramp_w_per_s=300.0), policy, measure_from_s=5.0)
    assert figures["swing_reduction_pct"] > 80
    assert figures["band_power_attenuation_db"] > 15
    # Ramps cost (peak - floor)^2 / (2 r peak): about 8 ms of a 1 s step; the floor costs none.
    assert 0.2 < figures["step_time_cost_pct"] < 1.5
    assert 0.95 < figures["energy_overhead_ratio_to_min"] < 1.1
    assert figures["budget_violations"] == 0 and figures["stranded_power_pct"] == 0.0


def test_no_smoothing_means_no_reduction_and_no_cost():
    policy = power_policy.PowerPolicy()
    trace = _trace(floor_w=0.0, ramp_w_per_s=0.0)
    trace.floor_w = None
    figures = power_sim.report_section(trace, policy, measure_from_s=5.0)
    assert figures["swing_reduction_pct"] == 0.0 and figures["step_time_cost_pct"] == 0.0
    assert abs(figures["energy_overhead_pct"]) < 0.01
    assert figures["max_ramp_w_per_s"] == round(swing.max_ramp_w_per_s(trace.unmanaged_w, 10.0, 1.0), 1)


def test_the_landed_cap_ramp_is_measured_in_the_times_the_limits_were_read():
    # Limits rising at 1,000 W/s from 5 s, read every 0.1 s except for a 0.3 s stall of the sampler
    # at 6.0 s: a reading put back on its grid instant would show 1,300 W within "1 s".
    trace = dataclasses.replace(_trace(floor_w=0.0, ramp_w_per_s=0.0), job_start_s=4.0)
    read_s = np.array([*np.arange(3.0, 6.0, 0.1), 6.3, *np.arange(6.4, 9.0, 0.1)])
    caps = 12_800.0 + 1_000.0 * np.clip(read_s - 5.0, 0.0, 3.0)
    trace = dataclasses.replace(trace, managed_cap_w=np.column_stack([read_s, caps]), ramp_gpus=[(8.0, 0, 64)])
    figures = power_sim.job_start_section(trace, period_s=1.0)
    assert figures["job_start_cap_ramp_1s_w_per_s"] == 1_000.0
    flat = dataclasses.replace(trace, managed_cap_w=np.column_stack([read_s, np.full(len(read_s), 12_800.0)]))
    assert power_sim.job_start_section(flat, period_s=1.0)["job_start_cap_ramp_1s_w_per_s"] == 0.0


def test_the_start_delay_pairs_twin_steps_by_index_even_when_one_list_lacks_the_first_step():
    # The managed job's first three steps are 0.5 s longer each (its ramp), then it runs at full
    # speed 1.5 s behind; the unmanaged list lacks step 0 (begun a hair before the recorded start).
    managed = [(4.0, 1.5, 0), (5.5, 1.5, 1), (7.0, 1.5, 2), (8.5, 1.0, 3), (9.5, 1.0, 4)]
    unmanaged = [(5.0, 1.0, 1), (6.0, 1.0, 2), (7.0, 1.0, 3), (8.0, 1.0, 4)]
    trace = dataclasses.replace(
        _trace(floor_w=0.0, ramp_w_per_s=0.0),
        job_start_s=4.0,
        managed_steps_s=managed,
        unmanaged_steps_s=unmanaged,
        managed_cap_w=np.zeros((0, 2)),
        ramp_gpus=[(6.0, 0, 64)],
    )
    figures = power_sim.job_start_section(trace, period_s=1.0)
    assert figures["full_speed_after_s"] == 4.5
    assert figures["job_start_delay_s"] == 1.5  # by position step 3 would pair with step 4: 0.5 s


# --- every limit in force is judged, not only the sampled ones (issue #37 item 8) ----------------------

TREE = power_tree.PowerTree.from_mapping(
    {
        "name": "cluster",
        "budget_w": 7000,
        "rows": [{"name": "row", "racks": [{"name": "rack", "nodes": [{"name": "n"}]}]}],
    }
)


class _Loop:
    """What the probe reads of the power loop when it judges limit changes: the budget tree in force."""

    def __init__(self, tree: power_tree.PowerTree) -> None:
        self.tree = tree


def _probe(job: step_job.StepJob) -> power_sim.PowerProbe:
    probe = power_sim.PowerProbe(job, 3, ["n"] * 8, [f"g{i}" for i in range(8)], 1000.0, scenario.PowerScenario(), 0)
    probe.initial_enforced_s = 0.0  # every budget has held since the start
    return probe


def _eight_ranks_at(cap_w: float) -> step_job.StepJob:
    job = step_job.StepJob(SHAPE, seed=3)
    job.add_ranks([650.0] * 8, [120.0] * 8, [1000.0] * 8)
    for rank in range(8):
        job.set_cap(rank, cap_w, 0.0)
    return job


def test_a_reboot_that_holds_default_limits_for_an_instant_between_samples_is_a_violation():
    """A reboot puts every GPU of the node back at its default limit until the agent restores the caps: no
    10 Hz sample need fall in that instant, but each limit change that left the budget exceeded counts."""
    job = _eight_ranks_at(800.0)  # 6,400 W under a 7,000 W budget
    probe = _probe(job)
    probe.judge_limit_changes(TREE)
    for rank in range(8):
        job.set_cap(rank, 1000.0, 1.0)  # the reboot: default limits
    for rank in range(8):
        job.set_cap(rank, 800.0, 1.001)  # the agent puts the caps back
    probe.judge_limit_changes(TREE)
    assert probe._over(TREE) == [], "a sample now sees nothing wrong"
    # Over 7,000 W from the 4th default limit (7,200 W) until the 5th restored cap (7,000 W).
    assert probe.violation_changes == 5 + 4 and probe.violations == 9
    assert probe.violation_domains == {"cluster"} and probe.violation_times_s[0] == 1.0


def test_a_limit_set_before_a_budget_cut_is_not_held_against_the_cut():
    job = _eight_ranks_at(800.0)
    probe = _probe(job)
    probe.judge_limit_changes(TREE)
    job.set_cap(0, 850.0, 1.0)  # 6,450 W: within 7,000 W, and over the 6,000 W cut made after it
    probe.judge_limit_changes(TREE.with_budget("cluster", 6000))
    assert probe.violations == 0


def _trace_with_evictions(evicted: range, at_s: tuple[float, float]) -> power_sim.PowerTrace:
    """The smoothed job and its twin, with `evicted` ranks out of both from at_s[0] until at_s[1]."""
    managed, unmanaged = _job(), _job()
    for rank in range(64):
        managed.set_smoothing(rank, floor_w=620.0, ramp_up_w_per_s=300.0, ramp_down_w_per_s=300.0)
    t = np.arange(0.0, 60.0, 0.1)
    per_gpu_m, per_gpu_u = [], []
    for x in t:
        for rank in evicted:
            for job in (managed, unmanaged):
                job.set_active(rank, not at_s[0] <= x < at_s[1])
        per_gpu_m.append(managed.draw_w(slice(None), x))
        per_gpu_u.append(unmanaged.draw_w(slice(None), x))
    trace = _trace(floor_w=620.0, ramp_w_per_s=300.0)
    trace.managed_per_gpu_w = np.array(per_gpu_m, dtype=np.float32)
    trace.unmanaged_per_gpu_w = np.array(per_gpu_u, dtype=np.float32)
    trace.managed_w = trace.managed_per_gpu_w.sum(axis=1).astype(np.float64)
    trace.unmanaged_w = trace.unmanaged_per_gpu_w.sum(axis=1).astype(np.float64)
    if len(evicted):
        trace.disturbed = [(at_s[0], tuple(evicted)), (at_s[1], tuple(evicted))]
    return trace


def test_ranks_evicted_in_the_window_cost_the_band_figure_and_the_undisturbed_ranks_keep_theirs():
    """An eviction is a load step in both twins that no smoothing damps: the all-GPU figure falls, and the
    figure over the GPUs no event touched is what the same GPUs reach with no eviction at all."""
    policy = power_policy.PowerPolicy()
    quiet = power_sim.report_section(_trace_with_evictions(range(0), (0.0, 0.0)), policy, measure_from_s=5.0)
    evicted = power_sim.report_section(_trace_with_evictions(range(16), (30.0, 40.0)), policy, measure_from_s=5.0)
    assert "band_power_attenuation_db_undisturbed" in quiet and quiet["disturbed_gpus"] == 0
    assert "band_attenuation_note" not in quiet
    assert evicted["disturbed_gpus"] == 16 and evicted["undisturbed_gpus"] == 48
    assert evicted["band_power_attenuation_db"] < quiet["band_power_attenuation_db"] - 3
    assert abs(evicted["band_power_attenuation_db_undisturbed"] - quiet["band_power_attenuation_db"]) < 1.5
    assert "16 GPUs' work out of the job or back in" in evicted["band_attenuation_note"]
    assert any("GPUs no event disturbed" in row for row in power_sim.markdown_rows(evicted))


def test_an_event_before_the_window_minus_one_step_does_not_count_as_a_disturbance():
    policy = power_policy.PowerPolicy()
    figures = power_sim.report_section(_trace_with_evictions(range(8), (1.0, 2.0)), policy, measure_from_s=5.0)
    assert figures["disturbed_gpus"] == 0 and figures["undisturbed_gpus"] == 64


def test_the_probe_notes_ranks_leaving_or_rejoining_and_floors_cleared_but_not_floors_the_controller_sets():
    job = _eight_ranks_at(800.0)
    probe = _probe(job)
    job.set_smoothing(1, floor_w=600.0, ramp_up_w_per_s=300.0, ramp_down_w_per_s=300.0)  # the controller's
    probe._note_disturbances()
    assert probe._disturbed == []
    job.set_active(2, False)
    job.set_smoothing(1, floor_w=0.0, ramp_up_w_per_s=0.0, ramp_down_w_per_s=0.0)  # a reset cleared it
    probe._note_disturbances()
    job.set_active(2, True)
    probe._note_disturbances()
    assert [ranks for _, ranks in probe._disturbed] == [(1, 2), (2,)]


def test_a_short_quarantine_evicts_its_ranks_for_as_long_as_it_lasts_not_for_a_second_by_chance():
    """The probe evicts what the controller holds quarantined; a reset or a reboot holds a GPU for ~50 ms. Read
    once a second, such a quarantine went unseen, or, when a read fell in it, kept its ranks out of the job for
    a whole second: the demo's rank evictions, step-time cost and stranded power depended on that chance."""
    job = _eight_ranks_at(800.0)
    probe = _probe(job)
    probe.started_ns = time.time_ns()

    async def quarantined() -> list[dict[str, Any]]:
        held = 0.35 <= probe._elapsed_s() < 0.55
        return [{"node_id": "n", "gpu_uuid": "g3", "port": ""}] if held else []

    probe.quarantined = quarantined
    asyncio.run(probe.sample(1.2))
    out, back = probe._disturbed
    assert out[1] == (3,) and back[1] == (3,)
    assert 0.35 <= out[0] < 0.55 and 0.55 <= back[0] < 0.9  # a busy machine wakes the probe late
