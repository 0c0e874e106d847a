"""Straggler actions by policy: notify, raise the cap within the budget, validate, quarantine, clear (issue #40)."""

from __future__ import annotations

import pytest

from rasd.controller.core import straggler
from rasd.controller.core import straggler_actions as sa

POLICY = sa.ActionPolicy(steps_per_rung=3, clear_after_quiet_steps=4)
ALLOWANCE_S = 0.014
BRAKED = straggler.Verdict(
    "GPU-7",
    20.0,
    0.07,
    4,
    "GPU-7 lags the job's median edge by 70 ms over 4 steps (score 20); clock event: hardware power brake",
)
PLAIN = straggler.Verdict("GPU-7", 20.0, 0.07, 4, "GPU-7 lags ... (score 20); no corroborating signal")


def _steps(cases, lag_s: float, n: int, *, policy: sa.ActionPolicy = POLICY, t0: float = 100.0):
    """n steps in which GPU-7 lags by lag_s; every effect, in order."""
    effects = []
    for k in range(n):
        cases, out = sa.on_step(
            cases, {"GPU-7": lag_s, "GPU-1": 0.0}, now_s=t0 + 2 * k, policy=policy, allowance_s=ALLOWANCE_S
        )
        effects.extend(out)
    return cases, effects


def test_a_new_suspect_is_always_notified_and_its_cap_raised_when_power_braked_and_the_budget_allows():
    room = sa.PowerRoom(cap_w=600.0, max_w=700.0, headroom_w=30.0)
    cases, effects = sa.open_case({}, BRAKED, "n3", now_s=10.0, policy=POLICY, power=room)
    assert [e.kind for e in effects] == ["notify", "raise_cap"]
    assert effects[1].to_w == 630.0 and effects[1].node_id == "n3"
    assert cases["GPU-7"].rung is sa.Rung.CAP_RAISED
    # Named again (it cannot be, but a replay must not act twice): nothing.
    assert sa.open_case(cases, BRAKED, "n3", now_s=11.0, policy=POLICY, power=room) == (cases, ())


def test_the_budget_refuses_a_raise_it_has_no_headroom_for_and_the_notice_says_so():
    room = sa.PowerRoom(cap_w=600.0, max_w=700.0, headroom_w=5.0)
    cases, effects = sa.open_case({}, BRAKED, "n3", now_s=10.0, policy=POLICY, power=room)
    assert [e.kind for e in effects] == ["notify"]
    assert "cap not raised: the budget allows 5 W" in effects[0].reason
    assert cases["GPU-7"].rung is sa.Rung.NOTIFIED
    at_max = sa.PowerRoom(cap_w=700.0, max_w=700.0, headroom_w=500.0)
    _, effects = sa.open_case({}, BRAKED, "n3", now_s=10.0, policy=POLICY, power=at_max)
    assert [e.kind for e in effects] == ["notify"]
    _, effects = sa.open_case({}, BRAKED, "n3", now_s=10.0, policy=POLICY, power=None)
    assert "headroom for this GPU is not known" in effects[0].reason


def test_no_raise_without_power_evidence_or_with_the_rung_off():
    room = sa.PowerRoom(cap_w=600.0, max_w=700.0, headroom_w=100.0)
    _, effects = sa.open_case({}, PLAIN, "n3", now_s=10.0, policy=POLICY, power=room)
    assert [e.kind for e in effects] == ["notify"]
    capped = sa.PowerRoom(cap_w=600.0, max_w=700.0, headroom_w=100.0, capped=True)
    _, effects = sa.open_case({}, PLAIN, "n3", now_s=10.0, policy=POLICY, power=capped)
    assert [e.kind for e in effects] == ["notify", "raise_cap"] and effects[1].to_w == 650.0
    off = sa.ActionPolicy(raise_cap=False)
    _, effects = sa.open_case({}, BRAKED, "n3", now_s=10.0, policy=off, power=room)
    assert [e.kind for e in effects] == ["notify"]


def test_a_straggler_that_keeps_lagging_climbs_to_validation_then_quarantine_k_steps_apart():
    cases, _ = sa.open_case({}, PLAIN, "n3", now_s=10.0, policy=POLICY)
    cases, effects = _steps(cases, 0.07, 2)
    assert effects == [] and cases["GPU-7"].rung is sa.Rung.NOTIFIED
    cases, effects = _steps(cases, 0.07, 1)
    assert [(e.kind, e.gpu_uuid, e.node_id) for e in effects] == [("validate", "GPU-7", "n3")]
    assert "still lags 70 ms over 3 steps after naming" in effects[0].reason
    assert cases["GPU-7"].rung is sa.Rung.VALIDATING
    # Held for validation: it takes part in no step, and its case waits.
    cases, effects = sa.on_step(cases, {"GPU-1": 0.0}, now_s=200.0, policy=POLICY, allowance_s=ALLOWANCE_S)
    assert effects == () and cases["GPU-7"].steps_on_rung == 0
    cases, effects = _steps(cases, 0.07, 3)
    assert [e.kind for e in effects] == ["quarantine"] and "after its validation" in effects[0].reason
    cases, effects = _steps(cases, 0.07, 10)
    assert effects == [] and cases["GPU-7"].rung is sa.Rung.QUARANTINED


def test_rungs_turned_off_are_skipped_and_with_none_left_nothing_more_happens():
    no_validation = sa.ActionPolicy(steps_per_rung=3, validate=False)
    cases, _ = sa.open_case({}, PLAIN, "n3", now_s=10.0, policy=no_validation)
    cases, effects = _steps(cases, 0.07, 3, policy=no_validation)
    assert [e.kind for e in effects] == ["quarantine"]
    notify_only = sa.ActionPolicy(steps_per_rung=3, validate=False, quarantine=False)
    cases, _ = sa.open_case({}, PLAIN, "n3", now_s=10.0, policy=notify_only)
    cases, effects = _steps(cases, 0.07, 20, policy=notify_only)
    assert effects == [] and cases["GPU-7"].rung is sa.Rung.NOTIFIED


def test_a_lag_that_vanishes_clears_the_case_and_a_mean_under_the_allowance_never_climbs():
    cases, _ = sa.open_case({}, PLAIN, "n3", now_s=10.0, policy=POLICY)
    cases, effects = _steps(cases, 0.0, 4)
    assert [e.kind for e in effects] == ["clear"] and cases == {}
    # Lagging every other step by 20 ms: a mean of 10 ms, under the allowance: it waits, never acts.
    cases, _ = sa.open_case(
        {}, PLAIN, "n3", now_s=10.0, policy=sa.ActionPolicy(steps_per_rung=3, clear_after_quiet_steps=50)
    )
    effects = []
    for k in range(12):
        cases, out = sa.on_step(
            cases, {"GPU-7": 0.02 if k % 2 else 0.0}, now_s=k, policy=POLICY, allowance_s=ALLOWANCE_S
        )
        effects.extend(out)
    assert effects == [] and cases["GPU-7"].rung is sa.Rung.NOTIFIED


def test_a_release_by_the_ladder_clears_the_case():
    cases, _ = sa.open_case({}, PLAIN, "n3", now_s=10.0, policy=POLICY)
    cases, effects = sa.on_released(cases, "GPU-7", why="validation passed")
    assert [(e.kind, e.reason) for e in effects] == [("clear", "validation passed")] and cases == {}
    assert sa.on_released(cases, "GPU-7", why="again") == ({}, ())


def test_a_uniform_slowdown_names_nobody_so_nothing_acts():
    state, cases, effects = straggler.StragglerState(), {}, []
    policy = straggler.StragglerPolicy()
    for k in range(50):
        step = {f"GPU-{i}": 2.0 * k + 1.4 * 1.05 + 0.001 * i for i in range(16)}  # the whole job 5 % slower
        state, verdicts = straggler.observe_step(state, step, policy=policy)
        for verdict in verdicts:
            cases, out = sa.open_case(cases, verdict, "n0", now_s=k, policy=POLICY)
            effects.extend(out)
        cases, out = sa.on_step(cases, straggler.step_lags(step), now_s=k, policy=POLICY, allowance_s=ALLOWANCE_S)
        effects.extend(out)
    assert effects == [] and cases == {}


def test_forget_resets_the_score_so_the_gpu_can_be_named_again():
    state = straggler.StragglerState({"GPU-7": straggler.Track(30.0, 1.0, 10)}, frozenset({"GPU-7"}), 12)
    forgotten = straggler.forget(state, "GPU-7")
    assert "GPU-7" not in forgotten.tracks and forgotten.suspects == frozenset() and forgotten.steps_judged == 12


@pytest.mark.parametrize("field", ["steps_per_rung", "clear_after_quiet_steps", "raise_cap_w", "min_raise_w"])
def test_a_policy_that_cannot_mean_anything_is_refused_naming_the_field(field):
    with pytest.raises(ValueError, match=f"^{field}: must be"):
        sa.ActionPolicy(**{field: 0})
