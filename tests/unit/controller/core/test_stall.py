"""The hung-job verdict (core.stall): a busy job whose steps stopped is named once; an ended job never is."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rasd.controller.core import stall

POLICY = stall.StallPolicy()
SPINNING = stall.GpuNow(100, 120.0, 700.0)
"""In a hung collective: NCCL's kernels keep it busy at about its communication draw."""
IDLE = stall.GpuNow(0, 70.0, 700.0)
BUSY = {f"GPU-{i:02d}": SPINNING for i in range(16)}


def _stepped(period_s: float = 2.0, steps: int = 20, policy: stall.StallPolicy = POLICY) -> stall.Rhythm:
    times = [k * period_s for k in range(steps)]
    return stall.observe(stall.Rhythm(), times, times[-1] + 0.01, policy=policy)


def test_a_busy_job_silent_for_five_periods_or_30_s_is_stalled_once_naming_the_rank_that_fell_idle():
    rhythm = _stepped(period_s=2.0)  # last edge at 38.01 s
    gpus = {**BUSY, "GPU-05": IDLE}
    assert stall.check(rhythm, gpus, now_s=38.01 + 29.9, policy=POLICY) == (rhythm, None)  # 30 s floor, not 10 s
    rhythm, verdict = stall.check(rhythm, gpus, now_s=38.01 + 30.01, policy=POLICY)
    assert verdict is not None and rhythm.stalled_at_s == pytest.approx(68.02)
    assert (verdict.suspect_gpu, verdict.idle_gpus, verdict.busy_gpus, verdict.gpus) == ("GPU-05", ("GPU-05",), 15, 16)
    assert verdict.period_s == pytest.approx(2.0) and verdict.silent_s == pytest.approx(30.01)
    assert verdict.reason == (
        "the job's steps stopped 30 s ago (period 2.0 s, 15 periods); 15 of 16 GPUs still busy: "
        "a hung collective; GPU-05 fell idle: its rank stopped first"
    )
    assert stall.check(rhythm, gpus, now_s=200.0, policy=POLICY)[1] is None  # named once per stall


def test_a_slow_steppers_stall_waits_five_of_its_periods_and_with_no_idle_rank_names_the_first_gpu():
    rhythm = _stepped(period_s=15.0)  # last edge at 285.01 s
    assert stall.check(rhythm, BUSY, now_s=285.01 + 74.0, policy=POLICY)[1] is None
    _, verdict = stall.check(rhythm, BUSY, now_s=285.01 + 75.01, policy=POLICY)
    assert verdict is not None and verdict.suspect_gpu == "GPU-00" and verdict.idle_gpus == ()
    assert verdict.reason.endswith("no rank stands out: any rank's restart restarts the job")


def test_an_edge_after_the_stall_ends_it_and_a_second_stall_is_named_again():
    rhythm, verdict = stall.check(_stepped(), BUSY, now_s=100.0, policy=POLICY)
    assert verdict is not None
    rhythm = stall.observe(rhythm, [], 101.0, policy=POLICY)  # the restarted job's first edge
    assert rhythm.stalled_at_s is None
    rhythm = stall.observe(rhythm, [101.0 + 2 * k for k in range(5)], 111.0, policy=POLICY)
    assert stall.check(rhythm, BUSY, now_s=141.0, policy=POLICY)[1] is not None


def test_a_job_whose_gpus_fell_idle_ended_its_rhythm_is_forgotten_and_nothing_is_named():
    idle = {**{gpu: IDLE for gpu in BUSY}, "GPU-00": SPINNING}  # one busy of 16: under the half
    rhythm, verdict = stall.check(_stepped(), idle, now_s=100.0, policy=POLICY)
    assert verdict is None and rhythm.step_times_s == () and rhythm.steps_seen == 0
    assert not stall.due(rhythm, now_s=1000.0, policy=POLICY)
    unreported = {gpu: stall.GpuNow(None) for gpu in BUSY}  # nothing reported: never judged spinning
    assert stall.check(_stepped(), unreported, now_s=100.0, policy=POLICY)[1] is None
    no_power = {gpu: stall.GpuNow(100) for gpu in BUSY}  # busy, draw unknown: not judged spinning either
    assert stall.check(_stepped(), no_power, now_s=100.0, policy=POLICY)[1] is None


def test_a_job_computing_without_a_collective_is_busy_at_its_compute_draw_and_never_stalled():
    """An evaluation pass or a long generation: no edges, 100 % utilization, but the compute draw."""
    computing = {gpu: stall.GpuNow(100, 640.0, 700.0) for gpu in BUSY}
    assert stall.check(_stepped(), computing, now_s=100.0, policy=POLICY)[1] is None
    half = {**computing, **{f"GPU-{i:02d}": SPINNING for i in range(8)}}  # 8 of 16 spin: the half is enough
    assert stall.check(_stepped(), half, now_s=100.0, policy=POLICY)[1] is not None


def test_a_starting_job_and_a_checkpoint_pause_are_not_stalls():
    assert stall.check(_stepped(steps=9), BUSY, now_s=1000.0, policy=POLICY)[1] is None  # under min_steps
    assert stall.check(_stepped(), BUSY, now_s=38.01 + 25.0, policy=POLICY)[1] is None  # a 25 s checkpoint


def test_the_period_is_the_median_interval_of_the_recent_steps():
    rhythm = stall.observe(stall.Rhythm(), [0.0, 2.0, 4.0, 30.0, 32.0], 32.0, policy=POLICY)  # one checkpoint gap
    assert rhythm.period_s() == pytest.approx(2.0)
    short = stall.StallPolicy(history_steps=3)
    assert len(stall.observe(rhythm, [34.0, 36.0], 36.0, policy=short).step_times_s) == 4


@given(
    period_s=st.floats(min_value=0.2, max_value=60.0),
    silent_periods=st.floats(min_value=1.0, max_value=20.0),
    min_silence_s=st.floats(min_value=1.0, max_value=300.0),
    check_every_s=st.floats(min_value=0.1, max_value=5.0),
)
def test_the_detection_delay_is_never_below_the_policys_silence_and_at_most_one_check_above_it(
    period_s, silent_periods, min_silence_s, check_every_s
):
    policy = stall.StallPolicy(silent_periods=silent_periods, min_silence_s=min_silence_s)
    delay_s = stall.detection_delay_s(period_s, policy, check_every_s)
    bound_s = max(min_silence_s, silent_periods * period_s)
    assert bound_s - 1e-6 <= delay_s <= bound_s + check_every_s + 1e-6


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("silent_periods", 0.0),
        ("min_silence_s", -1.0),
        ("min_steps", 2),
        ("history_steps", 1),
        ("busy_utilization_pct", 101),
        ("spin_power_pct", 0.0),
        ("busy_fraction", 0.0),
    ],
)
def test_a_policy_value_that_cannot_mean_anything_is_refused_naming_its_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}: "):
        stall.StallPolicy(**{field: value})


def test_a_node_fallen_silent_is_listed_never_named_and_its_stale_readings_count_neither_busy_nor_idle():
    """A dead host hangs the job too: its GPUs' last readings are old; the lost-node watch judges the node."""
    gpus = {gpu: dataclasses.replace(SPINNING, node_id=f"n{int(gpu[-2:]) // 8}") for gpu in BUSY}
    for index in range(8, 16):  # n1's agent fell silent; its last readings said idle
        gpus[f"GPU-{index:02d}"] = stall.GpuNow(0, 70.0, 700.0, node_id="n1", heard=False)
    _, verdict = stall.check(_stepped(), gpus, now_s=100.0, policy=POLICY)
    assert verdict is not None and verdict.silent_nodes == ("n1",) and verdict.idle_gpus == ()
    assert verdict.suspect_gpu == "GPU-00" and verdict.busy_gpus == 8
    assert verdict.reason.endswith(
        "8 of 16 GPUs still busy: a hung collective; node n1 fell silent: its host may be down"
    )


def test_stalls_with_no_rank_standing_out_name_the_jobs_gpus_in_turn_so_no_innocent_gpus_ladder_climbs():
    rhythm, first = stall.check(_stepped(), BUSY, now_s=100.0, policy=POLICY)
    rhythm = stall.observe(rhythm, [101.0 + 2 * k for k in range(12)], 124.0, policy=POLICY)  # restarted, steps
    rhythm, second = stall.check(rhythm, BUSY, now_s=160.0, policy=POLICY)
    assert first is not None and second is not None
    assert (first.suspect_gpu, second.suspect_gpu) == ("GPU-00", "GPU-01")
    idle = {**BUSY, "GPU-09": IDLE}  # a rank that fell idle is named whatever the turn
    rhythm = stall.observe(rhythm, [161.0 + 2 * k for k in range(12)], 184.0, policy=POLICY)
    assert stall.check(rhythm, idle, now_s=220.0, policy=POLICY)[1].suspect_gpu == "GPU-09"
