"""Job-start smoothing (`core.power.start_smoothing`): a profile from the start, shared rates, hand-over, release."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import start_smoothing

N = 32
UUIDS = [f"GPU-{i:02d}" for i in range(N)]
MAX_W = np.full(N, 1000.0)
LIMIT = 20_000.0


def _policy(**changes) -> power_policy.PowerPolicy:
    base = {
        "job_start_ramp_enabled": True,
        "ramp_limit_w_per_s": LIMIT,
        "job_start_canary_gpus": 4,
        "job_start_smoothing_release_s": 10.0,
    }
    return power_policy.PowerPolicy.from_mapping({**base, **changes})


def _mask(indices=(), n=N) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[list(indices)] = True
    return out


def _decide(state, now_s, policy, *, started=(), starting=(), parked=(), supported=None, detected=False, p2p=None):
    return start_smoothing.decide(
        state,
        gpu_uuids=UUIDS,
        supported=np.ones(N, dtype=bool) if supported is None else supported,
        started=_mask(started),
        starting=_mask(starting),
        parked=_mask(parked),
        max_w=MAX_W,
        detected_active=detected,
        unmanaged_p2p_w=p2p,
        now_s=now_s,
        policy=policy,
    )


def _all_started(policy, now_s=0.0):
    everyone = range(N)
    return _decide(start_smoothing.StartState(), now_s, policy, started=everyone, starting=everyone)


def test_gpus_that_start_get_a_profile_at_once_with_the_shared_rate():
    decision = _all_started(_policy())
    state = decision.state
    # 4 canaries (one in every 8, spread over the order) reserve their maximum limits.
    assert len(state.canaries) == 4 and state.canary_reserve_w_per_s == 4000.0
    assert sorted(state.canaries) == ["GPU-04", "GPU-12", "GPU-20", "GPU-28"]
    assert set(decision.apply_w_per_s) == set(UUIDS) - state.canaries
    rates = set(decision.apply_w_per_s.values())
    assert rates == {(LIMIT - 4000.0) / 28}
    assert decision.release == ()


def test_no_canaries_when_the_knob_is_zero_and_never_more_than_half_the_limit():
    decision = _all_started(_policy(job_start_canary_gpus=0))
    assert decision.state.canaries == frozenset() and len(decision.apply_w_per_s) == N
    assert set(decision.apply_w_per_s.values()) == {LIMIT / N}
    decision = _all_started(_policy(job_start_canary_gpus=16, ramp_limit_w_per_s=5000.0))
    assert decision.state.canary_reserve_w_per_s <= 2500.0 and len(decision.state.canaries) == 2


def test_gpus_without_smoothing_hardware_get_no_profile():
    supported = _mask(range(8))
    decision = _decide(start_smoothing.StartState(), 0.0, _policy(job_start_canary_gpus=0), started=range(N),
                       starting=range(N), supported=supported)  # fmt: skip
    assert set(decision.apply_w_per_s) == set(UUIDS[:8])


def test_disabled_sends_nothing_and_switches_held_profiles_off():
    assert _decide(start_smoothing.StartState(), 0.0, _policy(job_start_smoothing_enabled=False),
                   started=range(N)).apply_w_per_s == {}  # fmt: skip
    assert _decide(start_smoothing.StartState(), 0.0, _policy(job_start_ramp_enabled=False),
                   started=range(N)).apply_w_per_s == {}  # fmt: skip
    held = _all_started(_policy()).state
    off = _decide(held, 1.0, _policy(job_start_smoothing_enabled=False))
    assert set(off.release) == set(held.rate_w_per_s) and not off.state.active()


def test_the_swing_plan_takes_over_without_a_command_and_without_a_gap():
    state = _all_started(_policy()).state
    decision = _decide(state, 5.0, _policy(), detected=True)
    # Nothing is switched off: the plan's own profile replaces the start profile on the GPU.
    assert decision.release == () and decision.apply_w_per_s == {}
    assert decision.handed_over == N - 4 and not decision.state.active()
    assert decision.state.canaries == frozenset()


def test_released_after_the_timeout_counted_from_the_end_of_the_cap_ramp():
    policy = _policy()
    state = _all_started(policy).state
    # Still ramping at 20 s: no timer yet.
    decision = _decide(state, 20.0, policy, starting=range(N))
    assert decision.release == () and decision.state.settled_since_s == {}
    # The ramp ended at 21 s: released 10 s later, not before.
    decision = _decide(decision.state, 21.0, policy)
    decision = _decide(decision.state, 30.9, policy)
    assert decision.release == ()
    decision = _decide(decision.state, 31.0, policy)
    assert set(decision.release) == set(UUIDS) - state.canaries
    assert not decision.state.active() and decision.state.canaries == frozenset()


def test_a_swing_the_limit_cannot_take_keeps_the_profile_past_the_timeout():
    policy = _policy()
    state = _decide(_all_started(policy).state, 1.0, policy).state
    held = _decide(state, 100.0, policy, p2p=1.5 * LIMIT)
    assert held.release == () and held.state.active()
    gone = _decide(state, 100.0, policy, p2p=0.5 * LIMIT)
    assert len(gone.release) == N - 4


def test_a_gpu_parked_again_is_released_and_a_parked_canary_frees_its_reserve():
    policy = _policy()
    state = _all_started(policy).state
    canary = sorted(state.canaries)[0]
    decision = _decide(state, 2.0, policy, parked=[0, UUIDS.index(canary)], starting=range(1, N))
    assert decision.release == ("GPU-00",)
    assert canary not in decision.state.canaries and decision.state.canary_reserve_w_per_s == 3000.0
    # One GPU less and 1,000 W/s more to share: the share grew by more than a tenth, so it goes out.
    assert set(decision.apply_w_per_s.values()) == {17_000.0 / 27}
    # A crumb more (one more GPU released) is not worth a command: the GPUs keep the rate they have.
    later = _decide(decision.state, 3.0, policy, parked=[0, 1], starting=range(2, N))
    assert later.release == ("GPU-01",) and later.apply_w_per_s == {}
    assert sum(later.state.rate_w_per_s.values()) <= LIMIT - later.state.canary_reserve_w_per_s


def test_a_second_start_lowers_every_rate_before_it_adds_gpus():
    policy = _policy(job_start_canary_gpus=0)
    first = _decide(start_smoothing.StartState(), 0.0, policy, started=range(16), starting=range(16))
    assert set(first.apply_w_per_s.values()) == {LIMIT / 16}
    second = _decide(first.state, 3.0, policy, started=range(16, N), starting=range(N))
    assert set(second.apply_w_per_s) == set(UUIDS), "the first GPUs are sent their lower rate again"
    assert set(second.apply_w_per_s.values()) == {LIMIT / N}


def test_the_cap_ramp_leaves_the_canaries_and_the_settled_profiles_their_part():
    policy = _policy()
    state = _all_started(policy).state
    ramping = frozenset(UUIDS)
    assert start_smoothing.reserved_w_per_s(state, ramping) == 4000.0
    rate = next(iter(state.rate_w_per_s.values()))
    half = frozenset(UUIDS[:16])
    settled = sum(1 for g in state.rate_w_per_s if g not in half)
    assert start_smoothing.reserved_w_per_s(state, half) == 4000.0 + settled * rate


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sets(st.integers(0, N - 1), max_size=N),  # started
            st.sets(st.integers(0, N - 1), max_size=N),  # parked
            st.sets(st.integers(0, N - 1), max_size=N),  # still ramping
            st.booleans(),  # the swing plan in force
            st.floats(0.0, 3.0),  # seconds since the previous period
        ),
        min_size=1,
        max_size=12,
    ),
    st.integers(0, 12),
)
def test_rates_in_force_never_sum_above_the_limit_and_the_handover_leaves_no_gap(periods, canaries):
    policy = _policy(job_start_canary_gpus=canaries)
    state = start_smoothing.StartState()
    in_force: dict[str, float] = {}  # what the GPUs carry, as the commands leave them
    now = 0.0
    for started, parked, ramping, detected, dt in periods:
        now += dt
        parked = parked - started
        decision = _decide(state, now, policy, started=sorted(started), parked=sorted(parked),
                           starting=sorted(ramping | started), detected=detected)  # fmt: skip
        for gpu in decision.release:
            in_force.pop(gpu, None)
        in_force.update(decision.apply_w_per_s)
        if detected:
            # The plan's profile replaced every start profile, none was switched off first.
            assert decision.release == () and not decision.state.active()
            in_force.clear()
        state = decision.state
        assert in_force == dict(state.rate_w_per_s)
        assert sum(in_force.values()) + state.canary_reserve_w_per_s <= LIMIT * (1 + 1e-9)
        assert state.canary_reserve_w_per_s <= 0.5 * LIMIT
        assert not state.canaries & set(in_force), "a canary carries no profile"
        assert all(g not in in_force for g in np.asarray(UUIDS)[sorted(parked)])


def test_the_state_survives_a_round_trip_through_its_stored_form():
    state = start_smoothing.StartState(
        rate_w_per_s={"GPU-a": 139.8, "GPU-b": 139.8},
        settled_since_s={"GPU-a": 1_000.5},
        canaries=frozenset({"GPU-c"}),
        canary_reserve_w_per_s=1_000.0,
    )
    assert start_smoothing.StartState.from_mapping(state.to_mapping()) == state
    assert start_smoothing.StartState.from_mapping({}) == start_smoothing.StartState()


@pytest.mark.parametrize(
    ("stored", "field"),
    [
        ({"rate_w_per_s": ["GPU-a"]}, "rate_w_per_s"),
        ({"settled_since_s": {"GPU-a": "soon"}}, "settled_since_s"),
        ({"canaries": "GPU-c"}, "canaries"),
        ({"canary_reserve_w_per_s": None}, "canary_reserve_w_per_s"),
    ],
)
def test_a_damaged_stored_state_is_refused_naming_the_field(stored, field):
    with pytest.raises(ValueError, match=field):
        start_smoothing.StartState.from_mapping(stored)
