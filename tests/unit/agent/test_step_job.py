"""The simulated training job: stragglers set the pace, caps cost time, floors cost energy only."""

from __future__ import annotations

import numpy as np
import pytest

from rasd.agent.gpu import simulated, step_job


def _job(**shape) -> step_job.StepJob:
    base = {"period_s": 1.0, "compute_fraction": 0.7, "rank_jitter_s": (0.005, 0.020), "anchor_unix_s": 100.0}
    job = step_job.StepJob(step_job.JobShape(**{**base, **shape}), seed=5)
    job.add_ranks([675.0, 690.0, 660.0, 700.0], [125.0, 110.0, 140.0, 100.0], [700.0] * 4)
    return job


def _mean_step_s(job: step_job.StepJob, until_s: float = 160.0) -> float:
    steps = job.completed_steps(100.0, until_s)
    return float(np.mean([s.end_s - s.start_s for s in steps]))


def test_a_step_ends_only_after_its_slowest_rank():
    job = _job()
    for step in job.completed_steps(100.0, 120.0):
        assert step.end_s == pytest.approx(step.compute_end_s.max() + 0.3)
        assert np.all(step.compute_end_s <= step.end_s)
    # 5-20 ms of jitter: the straggler adds at most 20 ms to the 1 s step.
    assert 1.005 <= _mean_step_s(job) <= 1.020


def test_draw_follows_compute_and_communication_phases():
    job = _job()
    step = job.completed_steps(100.0, 110.0)[3]
    mid_compute = float(step.compute_start_s.max() + 0.3)
    mid_comm = float(step.compute_end_s.max() + 0.1)
    assert list(job.draw_w(slice(None), mid_compute)) == [675.0, 690.0, 660.0, 700.0]
    assert list(job.draw_w(slice(None), mid_comm)) == [125.0, 110.0, 140.0, 100.0]


def test_a_cap_below_demand_slows_the_whole_step_by_the_dvfs_model():
    free = _mean_step_s(_job())
    capped = _job()
    capped.set_cap(3, 350.0, 100.0)  # one rank at half its 700 W demand computes at half speed
    slow = _mean_step_s(capped)
    # Its 0.7 s compute takes 1.4 s; the step waits for it.
    assert slow - free == pytest.approx(0.7, abs=0.02)
    step = capped.completed_steps(100.0, 110.0)[2]
    assert capped.draw_w(slice(None), float(step.compute_start_s.max() + 0.2))[3] == 350.0


def test_a_floor_costs_energy_not_time():
    free, floored = _job(), _job()
    for rank in range(4):
        floored.set_smoothing(rank, floor_w=500.0, ramp_up_w_per_s=0.0, ramp_down_w_per_s=0.0)
    assert _mean_step_s(floored) == pytest.approx(_mean_step_s(free), abs=1e-9)
    times = np.arange(100.0, 130.0, 0.01)
    energy = [sum(job.draw_w(slice(None), t).sum() for t in times) for job in (free, floored)]
    assert energy[1] > energy[0]
    assert min(floored.draw_w(slice(None), t).min() for t in times) >= 500.0


def test_a_ramp_up_limit_costs_the_documented_time_and_slews_the_draw():
    free, ramped = _job(), _job()
    for rank in range(4):
        ramped.set_smoothing(rank, floor_w=500.0, ramp_up_w_per_s=1000.0, ramp_down_w_per_s=1000.0)
    # Slowest rank (700 W): (700 - 500)^2 / (2 x 1000 x 700) = 28.6 ms of extra compute per step.
    extra = _mean_step_s(ramped) - _mean_step_s(free)
    assert 0.015 <= extra <= 0.035
    step = ramped.completed_steps(100.0, 110.0)[2]
    t = float(step.compute_start_s[3] + 0.05)
    assert ramped.draw_w(np.array([3]), t)[0] == pytest.approx(550.0)


def test_a_ramp_down_too_slow_for_the_trough_leaves_the_draw_continuous():
    job = _job()
    for rank in range(4):
        job.set_smoothing(rank, floor_w=0.0, ramp_up_w_per_s=200.0, ramp_down_w_per_s=200.0)
    # 0.3 s of communication at 200 W/s: the draw falls 60 W, never to the trough, and the next
    # compute rises from where it got to: no jump anywhere.
    times = np.arange(105.0, 115.0, 0.005)
    draws = np.array([job.draw_w(slice(None), t) for t in times])
    assert np.abs(np.diff(draws, axis=0)).max() <= 200.0 * 0.005 + 1e-6
    steps = job.completed_steps(105.0, 115.0)
    # (A rank that finishes its compute early communicates a little longer: up to 0.4 s here.)
    assert np.all(steps[-1].rise_from_w >= steps[-1].peak_w - 200.0 * 0.4)
    # Only the rise from there costs compute time: (80 W)^2 / (2 x 200 x 660) = 24 ms at the most (only
    # the job's first step rises from the trough: 550 W at 200 W/s, over a second).
    assert all(1.0 < s.end_s - s.start_s <= 1.020 + 0.024 for s in steps)


def test_a_profile_landing_mid_compute_limits_the_fall_that_ends_it():
    def landing(floor_w, rate):
        job = _job(period_s=2.0)
        step = job.step_at(105.0)  # the step computing at 105 s (steps are computed as time goes)
        assert step is not None and step.compute_start_s.max() < 105.0 < step.compute_end_s.min()
        for rank in range(4):
            job.set_smoothing(rank, floor_w=floor_w, ramp_up_w_per_s=rate, ramp_down_w_per_s=rate, at_s=105.0)
        return job, float(job.steps[-1].compute_end_s[0])

    # The fall that ends this compute is already limited: 30 W in 0.3 s.
    job, end = landing(0.0, 100.0)
    assert job.draw_w(np.array([0]), end + 0.3)[0] == pytest.approx(675.0 - 30.0)
    # A floor with no ramp limit holds this step's trough at once (not only the next step's).
    job, end = landing(300.0, 0.0)
    assert job.draw_w(np.array([0]), end + 0.3)[0] == pytest.approx(300.0)


def test_checkpoint_stalls_lengthen_every_nth_step():
    job = _job(checkpoint_every_steps=5, checkpoint_s=2.0)
    steps = job.completed_steps(100.0, 130.0)
    long = [s.index for s in steps if s.end_s - s.start_s > 2.5]
    assert long and all((i + 1) % 5 == 0 for i in long)


def test_job_start_and_stop_idle_the_ranks():
    job = _job(start_after_s=5.0, stop_after_s=20.0)
    assert list(job.draw_w(slice(None), 102.0)) == [70.0] * 4
    assert list(job.draw_w(slice(None), 125.0)) == [70.0] * 4
    assert job.draw_w(slice(None), 105.3).max() > 600.0
    assert job.completed_steps(100.0, 200.0)[-1].end_s <= 121.1


def test_simulated_nodes_sharing_a_job_wait_for_a_capped_rank_on_another_node():
    workload = simulated.StepWorkload(period_s=1.0, anchor_unix_s=0.0)
    job = step_job.StepJob(workload.shape(), seed=1)
    a = simulated.SimulatedBackend("a", 2, 1, workload=workload, job=job)
    b = simulated.SimulatedBackend("b", 2, 1, workload=workload, job=job)
    b.set_power_limit(b.inventory()[0].uuid, 300)
    steps = job.completed_steps(0.0, 30.0)
    assert np.mean([s.end_s - s.start_s for s in steps[2:]]) > 1.5
    assert len(a.read_power(int(10e9))) == 2


def test_ranks_cannot_join_a_running_job():
    job = _job()
    job.draw_w(slice(None), 101.0)
    with pytest.raises(RuntimeError, match="before its first reading"):
        job.add_ranks([600.0], [100.0], [700.0])


def test_an_evicted_rank_no_longer_holds_the_step_back():
    job = _job()
    job.set_cap(3, 350.0, 100.0)
    slow = _mean_step_s(job, until_s=130.0)
    job.set_active(3, False)  # the scheduler took the GPU out of the job
    steps = job.completed_steps(135.0, 160.0)
    assert slow > 1.6 and np.mean([s.end_s - s.start_s for s in steps]) < 1.03
    mid = float(steps[2].compute_start_s[:3].max() + 0.3)
    assert job.draw_w(np.array([3]), mid)[0] == 70.0


def test_a_cap_raised_mid_compute_lets_the_draw_rise_and_the_compute_finish_sooner():
    # A job-start ramp raises caps while the ranks compute: the rest of the phase runs at the new level.
    job = _job()
    for rank in range(4):
        job.set_cap(rank, 350.0, 100.0)
    step = job.step_at(100.05)
    assert step is not None
    slow_end = float(step.compute_end_s[3])  # 0.7 s of work at half speed: 1.4 s
    cs = float(step.compute_start_s[3])
    assert slow_end - cs == pytest.approx(1.4, abs=1e-9)
    raise_at = cs + 0.4  # 0.2 s of work done, 0.5 s left: at full speed it ends 0.5 s later
    for rank in range(4):
        job.set_cap(rank, 700.0, raise_at)
    assert job.draw_w(slice(None), raise_at)[3] == 700.0
    step = job.step_at(raise_at)
    assert step is not None
    assert float(step.compute_end_s[3]) == pytest.approx(raise_at + 0.5, abs=1e-9)
    assert step.end_s == pytest.approx(float(step.compute_end_s.max()) + 0.3)


def test_a_cap_lowered_mid_compute_slows_the_rest_of_the_phase_from_that_instant():
    # The clock is the test's: the cut lands 0.3 s into rank 3's 0.7 s compute phase, long before
    # any reading, and is costed from the instant it was set, not from the next reading or step.
    job = _job()
    step = job.step_at(100.05)
    assert step is not None
    cs, ce = float(step.compute_start_s[3]), float(step.compute_end_s[3])
    assert ce - cs == pytest.approx(0.7, abs=1e-9)
    cut_at = cs + 0.3
    job.set_cap(3, 350.0, cut_at)  # half of its 700 W demand: the 0.4 s of work left takes 0.8 s
    step = job.step_at(cut_at + 0.5)
    assert step is not None
    assert float(step.compute_end_s[3]) == pytest.approx(cut_at + 0.8, abs=1e-9)
    assert step.end_s == pytest.approx(cut_at + 0.8 + 0.3, abs=1e-9), "the step waits for the slowed rank"
    assert job.draw_w(slice(None), cut_at + 0.5)[3] == 350.0, "the draw is clamped at once"
    assert job.draw_w(slice(None), cut_at + 0.79)[3] == 350.0, "still computing where it would have finished"
    # Raised back 0.2 s later (0.1 s of full-speed work done in it): the 0.3 s left runs at full speed.
    job.set_cap(3, 700.0, cut_at + 0.2)
    step = job.step_at(cut_at + 0.3)
    assert step is not None
    assert float(step.compute_end_s[3]) == pytest.approx(cut_at + 0.2 + 0.3, abs=1e-9)
    assert float(step.compute_end_s[3]) - ce == pytest.approx(0.1, abs=1e-9), "0.2 s at half speed cost 0.1 s"


def test_a_cap_set_in_a_step_nobody_has_read_yet_applies_only_from_its_instant():
    # Steps are computed lazily: the step the cut lands in is computed at the cut, under the cap
    # in force when it started, and only the rest of its compute runs at the new cap.
    twin, job = _job(), _job()
    assert job.step_at(100.05) is not None
    second = twin.completed_steps(100.0, 103.0)[1]
    cs = float(second.compute_start_s[3])
    job.set_cap(3, 350.0, cs + 0.3)
    step = job.step_at(cs + 0.4)
    assert step is not None and step.index == second.index
    assert float(step.compute_end_s[3]) == pytest.approx(cs + 0.3 + 0.8, abs=1e-9)


def test_a_cap_lowered_through_the_backend_is_stamped_by_its_clock():
    now_ns = [0]
    workload = simulated.StepWorkload(period_s=1.0, anchor_unix_s=100.0)
    job = step_job.StepJob(workload.shape(), seed=5)
    backend = simulated.SimulatedBackend("n", 1, 0, workload=workload, job=job, clock=lambda: now_ns[0])
    step = job.step_at(100.05)
    assert step is not None
    cs, ce = float(step.compute_start_s[0]), float(step.compute_end_s[0])
    demand = float(job.compute_w[0])
    now_ns[0] = int((cs + 0.2) * 1e9)
    backend.set_power_limit(backend.inventory()[0].uuid, 300)
    step = job.step_at(cs + 0.25)
    assert step is not None
    left_s = ce - (cs + 0.2)
    assert float(step.compute_end_s[0]) == pytest.approx(cs + 0.2 + left_s * demand / 300.0, abs=1e-6)


def test_a_floor_above_demand_raises_the_draw_not_the_speed_after_a_cut():
    job = _job()
    job.set_smoothing(2, floor_w=680.0, ramp_up_w_per_s=0.0, ramp_down_w_per_s=0.0)  # rank 2 demands 660 W
    step = job.step_at(100.05)
    assert step is not None
    cs, ce = float(step.compute_start_s[2]), float(step.compute_end_s[2])
    job.set_cap(2, 670.0, cs + 0.1)  # still above the 660 W demand: no slower
    assert float(job.step_at(cs + 0.2).compute_end_s[2]) == pytest.approx(ce, abs=1e-9)
    assert job.draw_w(np.array([2]), cs + 0.2)[0] == 670.0


def test_a_cap_changed_in_the_communication_phase_waits_for_the_next_step():
    job = _job()
    step = job.step_at(100.05)
    assert step is not None
    in_comm = float(step.compute_end_s.max()) + 0.1
    end = step.end_s
    job.set_cap(3, 350.0, in_comm)
    assert job.step_at(in_comm).end_s == end
    nxt = job.step_at(end + 0.05)
    assert nxt is not None and float(nxt.compute_end_s[3] - nxt.compute_start_s[3]) == pytest.approx(1.4, abs=1e-9)


def test_readings_and_cap_changes_from_different_threads_keep_one_step_per_index():
    """The agents read the job on the event loop and set caps in worker threads: steps stay a chain.

    Unlocked, two threads computed the same next step and both appended it; a reading then took the
    wrong step for the previous one and the fleet's draw fell to the trough in an instant.
    """
    import random
    import threading
    import time

    job = step_job.StepJob(
        step_job.JobShape(period_s=0.05, compute_fraction=0.7, rank_jitter_s=(0.001, 0.002), anchor_unix_s=0.0), 1
    )
    job.add_ranks([675.0] * 64, [125.0] * 64, [1000.0] * 64)
    started = time.monotonic()
    until = started + 1.0

    def read() -> None:
        while time.monotonic() < until:
            job.draw_w(slice(None), time.monotonic() - started)

    def cap() -> None:
        rng = random.Random(2)
        while time.monotonic() < until:
            job.set_cap(rng.randrange(64), rng.uniform(300, 1000), time.monotonic() - started)

    threads = [threading.Thread(target=t) for t in (read, cap, read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    indices = [s.index for s in job.steps]
    assert len(indices) >= 5
    assert indices == list(range(indices[0], indices[0] + len(indices)))
    starts = [s.start_s for s in job.steps]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)


def test_a_start_delay_makes_the_rank_compute_late_at_full_draw_and_the_step_wait_for_it():
    job, clean = _job(), _job()
    job.set_start_delay(1, 0.035)  # 5 % of a 0.7 s compute phase
    for slow, twin in zip(
        job.completed_steps(100.0, 120.0)[:10], clean.completed_steps(100.0, 120.0)[:10], strict=True
    ):
        assert slow.compute_start_s[1] - slow.start_s == pytest.approx(twin.compute_start_s[1] - twin.start_s + 0.035)
        assert slow.compute_end_s[1] - slow.compute_start_s[1] == pytest.approx(0.7)  # full clocks once started
        assert slow.peak_w[1] == 690.0
    step = job.completed_steps(100.0, 110.0)[3]
    assert job.draw_w(slice(1, 2), float(step.start_s + 0.030))[0] == pytest.approx(110.0)  # waiting at its trough
    assert _mean_step_s(job) == pytest.approx(_mean_step_s(clean) + 0.035, abs=0.016)  # less what jitter hid
    with pytest.raises(ValueError, match="start delay must be"):
        job.set_start_delay(0, -0.1)


def test_a_hung_collective_stops_the_steps_with_the_waiting_ranks_at_their_comm_draw_until_resumed():
    job = _job()
    job.draw_w(slice(None), 110.5)  # steps computed up to about 110.5 s
    job.hang(110.5, stuck_ranks=[2])
    hung = job.step_at(110.5)
    assert hung is not None and hung.end_s == float("inf")
    late = 150.0
    assert list(job.draw_w(slice(None), late)) == [125.0, 110.0, 70.0, 100.0]  # rank 2 idles, the rest spin
    assert [job.hung_busy(rank, late) for rank in range(4)] == [True, True, False, True]
    assert job.completed_steps(111.0, late) == []
    job.set_cap(0, 500.0, 120.0)  # a cap change during the hang does not end the step
    assert job.step_at(130.0).end_s == float("inf")
    job.resume(late)
    assert job.hung_busy(0, 151.0) is None
    steps = job.completed_steps(late, late + 10.0)
    assert len(steps) >= 6 and steps[0].start_s == pytest.approx(late)  # rank 0 capped: 1.26 s steps


def test_a_simulated_hang_reads_100_pct_on_the_waiting_gpus_and_0_on_the_stuck_one_and_a_restart_resumes_it():
    clock = [int(200e9)]
    workload = simulated.StepWorkload(anchor_unix_s=100.0, period_s=1.0)
    backend = simulated.SimulatedBackend(
        "n0", 4, 3, workload=workload, clock=lambda: clock[0], faults=[simulated.ScriptedFault(0.0, "job_hang", gpu=1)]
    )
    backend.read_power(clock[0])
    clock[0] += int(30e9)
    readings = {c.gpu_uuid: c.utilization_gpu_pct for c in backend.read_counters(clock[0])}
    uuids = [g.uuid for g in backend.inventory()]
    assert [readings[u] for u in uuids] == [100, 0, 100, 100]
    backend.set_workload(uuids[1], running=False)  # the stuck rank's process was restarted
    assert backend.job is not None and backend.job.hung_since_s is None
    assert uuids[1] not in backend.stopped_gpus()  # the launcher restarted it with the job
