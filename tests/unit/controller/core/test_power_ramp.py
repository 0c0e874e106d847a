"""The job-start cap ramp (`core.power.ramp`): parking, a ramp shared across GPUs, never above a target."""

from __future__ import annotations

import numpy as np
import pytest

from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import ramp as power_ramp

N = 4
UUIDS = [f"GPU-{i}" for i in range(N)]
MIN_W = np.full(N, 200.0)
MAX_W = np.full(N, 1000.0)


def _policy(**changes) -> power_policy.PowerPolicy:
    base = {"job_start_ramp_enabled": True, "ramp_limit_w_per_s": 400.0, "raise_jitter_pct": 0.0}
    return power_policy.PowerPolicy.from_mapping({**base, **changes})


def _step(state, idle, targets, now_s, policy, rng=None):
    return power_ramp.job_start_ramp(
        state,
        gpu_uuids=UUIDS,
        idle=np.asarray(idle, dtype=bool),
        targets_w=np.asarray(targets, dtype=np.int64),
        min_w=MIN_W,
        max_w=MAX_W,
        now_s=now_s,
        policy=policy,
        rng=rng or np.random.default_rng(0),
    )


def _parked(policy, *, idle_s=10.0):
    """Idle GPUs at their boot limit (1,000 W) until they are parked."""
    state = power_ramp.RampState()
    for now in np.arange(0.0, idle_s + 1.0, 1.0):
        decision = _step(state, [True] * N, [1000] * N, float(now), policy)
        state = decision.state
    return state, decision


def test_disabled_leaves_the_targets_alone():
    policy = power_policy.PowerPolicy()
    assert policy.job_start_ramp_enabled is False
    decision = _step(power_ramp.RampState(), [True] * N, [900] * N, 100.0, policy)
    assert decision.targets_w.tolist() == [900] * N and decision.parked == 0


def test_idle_gpus_are_parked_at_their_minimum_only_after_the_idle_time():
    policy = _policy()
    state = power_ramp.RampState()
    decision = _step(state, [True] * N, [1000] * N, 0.0, policy)
    assert decision.targets_w.tolist() == [1000] * N, "not idle long enough yet"
    decision = _step(decision.state, [True] * N, [1000] * N, 9.0, policy)
    assert decision.parked == 0
    decision = _step(decision.state, [True] * N, [1000] * N, 10.0, policy)
    assert decision.targets_w.tolist() == [200] * N and decision.parked == N


def test_a_busy_reading_restarts_the_idle_time():
    policy = _policy()
    state = _step(power_ramp.RampState(), [True] * N, [1000] * N, 0.0, policy).state
    state = _step(state, [False] * N, [1000] * N, 5.0, policy).state
    decision = _step(state, [True] * N, [1000] * N, 12.0, policy)
    assert decision.parked == 0, "idle since 12 s, not since 0 s"


def test_the_start_cap_is_configurable_but_never_below_the_minimum():
    _, decision = _parked(_policy(job_start_cap_w=350.0))
    assert decision.targets_w.tolist() == [350] * N
    _, decision = _parked(_policy(job_start_cap_w=50.0))
    assert decision.targets_w.tolist() == [200] * N


def test_the_ramp_shares_the_aggregate_limit_across_the_gpus_starting_together():
    policy = _policy()  # 400 W/s over 4 GPUs: 100 W/s each
    state, _ = _parked(policy)
    # The period that first sees the job holds the start cap (the draw just jumped to it).
    decision = _step(state, [False] * N, [1000] * N, 11.5, policy)
    assert decision.targets_w.tolist() == [200] * N and decision.rise_w == 0
    assert decision.starting == N and decision.ramping == 0
    state = decision.state
    caps = []
    now = 11.5
    for _ in range(5):
        now += 1.0
        decision = _step(state, [False] * N, [1000] * N, now, policy)
        state = decision.state
        caps.append(decision.targets_w.tolist())
        assert decision.rise_w == pytest.approx(400.0)
    # Ceilings 300, 400 ... W; each command aims RAMP_LEAD_S (0.5 s x 100 W/s) past its ceiling, and
    # the agent slews at 100 W/s until the next command replaces it.
    assert power_ramp.RAMP_LEAD_S == 0.5
    assert [c[0] for c in caps] == [350, 450, 550, 650, 750]
    assert state.ceiling_w["GPU-0"] == pytest.approx(700.0)
    # Two GPUs start alone: they share the same 400 W/s, 200 W/s each.
    state, _ = _parked(policy)
    state = _step(state, [False, False, True, True], [1000] * N, 11.5, policy).state
    decision = _step(state, [False, False, True, True], [1000] * N, 12.5, policy)
    assert decision.targets_w.tolist() == [500, 500, 200, 200]
    assert decision.state.ramping_gpus() == {"GPU-0", "GPU-1"}, "parked GPUs are not ramping"


def _started(policy):
    state, _ = _parked(policy)
    return _step(state, [False] * N, [1000] * N, 11.0, policy).state


def test_a_long_period_adds_no_more_than_one_window_of_ramp():
    policy = _policy()
    decision = _step(_started(policy), [False] * N, [1000] * N, 11.0 + 3.0, policy)
    assert decision.rise_w == pytest.approx(400.0 * power_ramp.RAMP_WINDOW_S)


def test_early_periods_rise_by_their_time_at_the_same_rate():
    # The loop wakes early (acks, budget changes): each period's rise is its own time at the rate,
    # and the rate (what the agents slew at) never sums above the limit, however often it runs.
    policy = _policy()
    state = _step(_started(policy), [False] * N, [1000] * N, 13.0, policy).state  # 300 W at 13.0
    for now in (13.2, 13.4, 13.6, 13.8, 14.0):
        decision = _step(state, [False] * N, [1000] * N, now, policy)
        state = decision.state
        assert decision.rise_w == pytest.approx(400.0 * 0.2)
        assert decision.raise_rates_w_per_s.tolist() == pytest.approx([100.0] * N)
    assert decision.state.ceiling_w["GPU-0"] == pytest.approx(400.0), "1 s of ramp at 100 W/s each from 300 W"
    assert decision.targets_w.tolist() == [450] * N, "aiming 0.5 s ahead"


def test_the_rates_go_with_the_ramping_gpus_only():
    policy = _policy()
    state, decision = _parked(policy)
    assert decision.raise_rates_w_per_s.tolist() == [0.0] * N, "parked: no raise"
    state = _step(state, [False, False, True, True], [1000] * N, 11.5, policy).state
    decision = _step(state, [False, False, True, True], [1000] * N, 12.5, policy)
    assert decision.raise_rates_w_per_s.tolist() == [200.0, 200.0, 0.0, 0.0]


def test_a_gpu_whose_ramp_just_ended_keeps_its_share_a_while():
    # GPU-0's last raise may still be moving at 100 W/s (for up to 1 s + the lead): the other three
    # do not take its share yet.
    policy = _policy()
    state = _step(_started(policy), [False] * N, [1000] * N, 12.0, policy).state  # 300 W delivered
    decision = _step(state, [False] * N, [300, 1000, 1000, 1000], 13.0, policy)
    assert decision.state.finishing_since_s == {"GPU-0": 13.0}
    decision = _step(decision.state, [False] * N, [300, 1000, 1000, 1000], 14.0, policy)
    assert decision.raise_rates_w_per_s.tolist() == [0.0, 100.0, 100.0, 100.0]
    decision = _step(decision.state, [False] * N, [300, 1000, 1000, 1000], 15.0, policy)
    assert decision.raise_rates_w_per_s.tolist() == pytest.approx([0.0] + [400.0 / 3] * 3)


def test_never_above_the_target_and_never_below_the_minimum():
    policy = _policy(ramp_limit_w_per_s=100_000.0)
    targets = [250, 600, 150, 1000]  # 150 W: a target under the minimum stays the allocator's word
    decision = _step(_started(policy), [False] * N, targets, 12.0, policy)
    assert (decision.targets_w <= np.array(targets)).all()
    state, _ = _parked(policy)
    decision = _step(state, [True] * N, [1000] * N, 12.0, policy)
    assert (decision.targets_w >= MIN_W).all()


def test_the_ramp_ends_at_the_maximum_limit_and_the_allocator_decides_again():
    policy = _policy(ramp_limit_w_per_s=4000.0)  # 1,000 W/s each: 200 -> 1000 W in one second
    decision = _step(_started(policy), [False] * N, [1000] * N, 12.0, policy)
    assert decision.state.ceiling_w == {}
    decision = _step(decision.state, [False] * N, [1000] * N, 13.0, policy)
    assert decision.targets_w.tolist() == [1000] * N and decision.ramping == 0


def test_jitter_spreads_the_rises_and_keeps_the_sum_within_the_limit():
    policy = _policy(raise_jitter_pct=20.0, ramp_limit_w_per_s=4000.0)
    n = 64
    uuids = [f"GPU-{i}" for i in range(n)]
    rng = np.random.default_rng(7)
    kw = {"gpu_uuids": uuids, "min_w": np.full(n, 200.0), "max_w": np.full(n, 1000.0), "policy": policy, "rng": rng}
    state = power_ramp.RampState()
    for now, idle in ((0.0, True), (10.0, True), (11.0, False)):
        state = power_ramp.job_start_ramp(
            state, idle=np.full(n, idle), targets_w=np.full(n, 1000), now_s=now, **kw
        ).state
    decision = power_ramp.job_start_ramp(
        state, idle=np.zeros(n, dtype=bool), targets_w=np.full(n, 1000), now_s=12.0, **kw
    )
    rises = np.array([decision.state.ceiling_w[u] for u in uuids]) - 200.0
    per_gpu = 4000.0 / n
    assert rises.max() <= per_gpu + 1e-9 and rises.min() >= 0.8 * per_gpu - 1e-9
    assert len(np.unique(np.round(rises, 6))) > n // 2, "no lock-step: the rises differ"
    assert 0.8 * 4000.0 <= decision.rise_w <= 4000.0
    assert decision.raise_rates_w_per_s.sum() <= 4000.0 + 1e-9, "the agents' slews sum to at most the limit"


def test_policy_fields_are_validated_by_name():
    with pytest.raises(power_policy.PolicyError, match="job_start_cap_w"):
        power_policy.PowerPolicy.from_mapping({"job_start_cap_w": 0})
    with pytest.raises(power_policy.PolicyError, match="job_start_idle_s"):
        power_policy.PowerPolicy.from_mapping({"job_start_idle_s": -1})
    with pytest.raises(power_policy.PolicyError, match="job_start_ramp_enabled"):
        power_policy.PowerPolicy.from_mapping({"job_start_ramp_enabled": 1})
    policy = power_policy.PowerPolicy.from_mapping({"job_start_ramp_enabled": True, "job_start_cap_w": 300})
    assert power_policy.PowerPolicy.from_mapping(policy.to_mapping()) == policy


def test_a_ceiling_rises_from_the_delivered_target_when_the_allocator_trails():
    policy = _policy()  # 100 W/s each
    state = _step(_started(policy), [False] * N, [1000] * N, 12.0, policy).state  # ceilings 300 W
    # The allocator raised GPU-0 only to 350 W this time (its own slew limit): 350 is delivered.
    decision = _step(state, [False] * N, [350, 1000, 1000, 1000], 13.0, policy)
    assert decision.targets_w.tolist() == [350, 450, 450, 450], "ceilings 400 W, aiming 50 W ahead"
    decision = _step(decision.state, [False] * N, [1000] * N, 14.0, policy)
    assert decision.state.ceiling_w["GPU-0"] == pytest.approx(450.0), "100 W from 350, not 150 W at once"
    assert decision.targets_w.tolist() == [500, 550, 550, 550]


def test_the_ramp_ends_when_the_allocator_asks_no_more():
    policy = _policy()
    state = _step(_started(policy), [False] * N, [1000] * N, 12.0, policy).state  # 300 W delivered
    decision = _step(state, [False] * N, [300, 1000, 1000, 1000], 13.0, policy)
    assert "GPU-0" not in decision.state.ceiling_w and decision.targets_w[0] == 300
    decision = _step(decision.state, [False] * N, [900, 1000, 1000, 1000], 14.0, policy)
    assert decision.targets_w[0] == 900, "the allocator alone decides for GPU-0 now"


def test_the_start_jump_counts_in_the_window():
    # 4 GPUs parked at 200 W start: their draw jumps by up to 800 W, counted against the 1 s window.
    policy = _policy(ramp_limit_w_per_s=1000.0)
    state, _ = _parked(policy)
    state = _step(state, [False] * N, [1000] * N, 11.0, policy).state
    decision = _step(state, [False] * N, [1000] * N, 11.5, policy)
    assert decision.raise_rates_w_per_s.sum() == pytest.approx(200.0), "1,000 W/s less 800 W of jump per 1 s"
    assert decision.rise_w == pytest.approx(100.0), "0.5 s at 200 W/s"
    decision = _step(decision.state, [False] * N, [1000] * N, 12.0, policy)
    assert decision.raise_rates_w_per_s.sum() == pytest.approx(1000.0), "the jump left the window"


def test_a_jump_above_the_limit_holds_the_ramp_for_one_window():
    policy = _policy(ramp_limit_w_per_s=400.0)  # the 800 W jump alone is over 400 W per 1 s
    state, _ = _parked(policy)
    state = _step(state, [False] * N, [1000] * N, 11.0, policy).state
    decision = _step(state, [False] * N, [1000] * N, 11.9, policy)
    assert decision.raise_rates_w_per_s.tolist() == [0.0] * N and decision.targets_w.tolist() == [200] * N
    decision = _step(decision.state, [False] * N, [1000] * N, 12.0, policy)
    assert decision.raise_rates_w_per_s.tolist() == [100.0] * N


def test_a_reserve_leaves_part_of_the_limit_and_the_masks_say_who_started():
    policy = _policy()  # 400 W/s
    state, parked = _parked(policy)
    assert parked.parked_mask.tolist() == [True] * N and not parked.started.any()
    started = _step(state, [False] * N, [1000] * N, 11.0, policy)
    assert started.started.tolist() == [True] * N and started.under_ceiling.all()
    # 2 s later the start jump is out of the window: 400 - 200 reserved over 4 GPUs.
    decision = power_ramp.job_start_ramp(
        started.state,
        gpu_uuids=UUIDS,
        idle=np.zeros(N, dtype=bool),
        targets_w=np.full(N, 1000, dtype=np.int64),
        min_w=MIN_W,
        max_w=MAX_W,
        now_s=13.0,
        policy=policy,
        rng=np.random.default_rng(0),
        reserved_w_per_s=200.0,
    )
    assert decision.raise_rates_w_per_s.tolist() == [50.0] * N
    assert not decision.started.any() and not decision.parked_mask.any()
