"""The pure SDC rules: accusation verdicts (2 of 3, hot retest), suspicion scores, rolling sweeps."""

from __future__ import annotations

import dataclasses

import pytest

from rasd.controller.core.remediation import actions, blast_radius, policy, sdc

Step = sdc.AccusationStep
RULES = sdc.AccusationRules(confirm_runs=3, confirm_fails=2, retries=1)
DAY_S = 86400.0
T0 = 1_780_000_000.0


@pytest.mark.parametrize(
    ("verdicts", "step"),
    [
        ([], Step.RERUN),
        (["fail"], Step.RERUN),
        (["suspect"], Step.RERUN),
        (["pass"], Step.CLEARED),
        (["fail", "fail"], Step.REPRODUCIBLE),
        (["fail", "pass"], Step.RERUN),
        (["fail", "pass", "fail"], Step.REPRODUCIBLE),
        (["fail", "pass", "pass"], Step.HOT_RETEST),
        (["suspect", "pass"], Step.HOT_RETEST),
        (["suspect", "suspect", "suspect"], Step.HOT_RETEST),
        (["fail", "pass", "pass", "hot:fail"], Step.REPRODUCIBLE),
        (["fail", "pass", "pass", "hot:pass"], Step.CLEARED),
        (["fail", "pass", "pass", "hot:suspect"], Step.OPERATOR),  # deviated again: held for a person
        (["suspect", "pass", "hot:suspect"], Step.OPERATOR),
        (["fail", "pass", "pass", "hot:error"], Step.HOT_RETEST),
        (["error"], Step.RERUN),
        (["error", "fail"], Step.RERUN),
        (["error", "error"], Step.OPERATOR),
        (["software_drift"], Step.DRIFT),
        (["fail", "software_drift"], Step.DRIFT),
    ],
)
def test_judge_accusation_follows_the_table(verdicts, step):
    got, why = sdc.judge_accusation(verdicts, RULES)
    assert got is step, why
    assert why and "\n" not in why


def test_reproducible_needs_the_configured_quorum():
    strict = sdc.AccusationRules(confirm_runs=5, confirm_fails=3, retries=1)
    assert sdc.judge_accusation(["fail", "fail"], strict)[0] is Step.RERUN
    assert sdc.judge_accusation(["fail", "fail", "fail"], strict)[0] is Step.REPRODUCIBLE
    assert sdc.judge_accusation(["fail", "pass", "pass", "pass"], strict)[0] is Step.HOT_RETEST


def test_an_unknown_verdict_is_named():
    with pytest.raises(ValueError, match="unknown validation verdict 'maybe'"):
        sdc.judge_accusation(["maybe"], RULES)


def test_suspicion_decays_with_its_half_life_and_never_goes_negative():
    marks = [sdc.SdcMark("accusation", T0), sdc.SdcMark("fail", T0)]
    assert sdc.suspicion_score(marks, now_s=T0, half_life_s=30 * DAY_S) == 4.0
    assert sdc.suspicion_score(marks, now_s=T0 + 30 * DAY_S, half_life_s=30 * DAY_S) == 2.0
    assert sdc.suspicion_score([sdc.SdcMark("pass", T0)], now_s=T0, half_life_s=DAY_S) == 0.0
    # A pass lowers suspicion: accusation (1) + pass (-0.5).
    both = [sdc.SdcMark("accusation", T0), sdc.SdcMark("pass", T0)]
    assert sdc.suspicion_score(both, now_s=T0, half_life_s=DAY_S) == 0.5
    with pytest.raises(ValueError, match="half_life_s"):
        sdc.suspicion_score(marks, now_s=T0, half_life_s=0)


def test_gpu_record_counts_and_scores():
    marks = [sdc.SdcMark("accusation", T0), sdc.SdcMark("fail", T0 + 10), sdc.SdcMark("pass", T0 + 20)]
    record = sdc.gpu_record(marks, now_s=T0 + 20, half_life_s=30 * DAY_S, watch_until=T0 + 99)
    assert {k: record[k] for k in ("accusations", "runs", "fails", "passes", "last_verdict", "watch_until")} == {
        "accusations": 1,
        "runs": 2,
        "fails": 1,
        "passes": 1,
        "last_verdict": "pass",
        "watch_until": T0 + 99,
    }
    assert record["suspicion"] == pytest.approx(3.5, abs=1e-3)


def test_watched_until_ignores_expired_watches():
    watch = {"GPU-1": T0 + 100}
    assert sdc.watched_until(watch, "GPU-1", now_s=T0) == T0 + 100
    assert sdc.watched_until(watch, "GPU-1", now_s=T0 + 100) is None
    assert sdc.watched_until(watch, "GPU-2", now_s=T0) is None


# ---- sweeps ------------------------------------------------------------------------------------

SWEEPS = policy.SdcPolicy(sweep_enabled=True, sweep_share_pct=2.0, sweep_max_concurrent=2, sweep_reserve_slots=1)


def candidates(count: int, *, idle: bool = True, last: float | None = None) -> list[sdc.SweepCandidate]:
    return [sdc.SweepCandidate(f"n{i:03d}", idle, last) for i in range(count)]


def test_plan_sweep_takes_the_share_of_idle_nodes_least_recently_swept_first():
    nodes = candidates(100, last=T0 - 30 * DAY_S)
    nodes[57] = sdc.SweepCandidate("n057", True, None)  # never swept: first
    picks = sdc.plan_sweep(nodes, now_s=T0, policy=SWEEPS, in_flight=0, free_disruption_slots=8)
    assert [p.node_id for p in picks] == ["n057", "n000"]
    assert all(p.suite == "quick" and p.sweep_id.startswith(f"sweep/{p.node_id}/") for p in picks)


def test_plan_sweep_leaves_room_for_repairs_and_respects_concurrency():
    nodes = candidates(1000)
    assert len(sdc.plan_sweep(nodes, now_s=T0, policy=SWEEPS, in_flight=0, free_disruption_slots=8)) == 2
    assert len(sdc.plan_sweep(nodes, now_s=T0, policy=SWEEPS, in_flight=1, free_disruption_slots=8)) == 1
    assert sdc.plan_sweep(nodes, now_s=T0, policy=SWEEPS, in_flight=0, free_disruption_slots=1) == ()
    assert sdc.plan_sweep(nodes, now_s=T0, policy=SWEEPS, in_flight=2, free_disruption_slots=8) == ()


def test_plan_sweep_skips_busy_and_recently_swept_nodes_and_can_be_off():
    busy = candidates(10, idle=False)
    assert sdc.plan_sweep(busy, now_s=T0, policy=SWEEPS, in_flight=0, free_disruption_slots=8) == ()
    recent = candidates(10, last=T0 - DAY_S)
    assert sdc.plan_sweep(recent, now_s=T0, policy=SWEEPS, in_flight=0, free_disruption_slots=8) == ()
    off = policy.SdcPolicy()
    assert sdc.plan_sweep(candidates(10), now_s=T0, policy=off, in_flight=0, free_disruption_slots=8) == ()


def test_sweep_seeds_rotate_by_epoch_and_are_stable():
    day1 = sdc.plan_sweep(candidates(1), now_s=T0, policy=SWEEPS, in_flight=0, free_disruption_slots=8)
    again = sdc.plan_sweep(candidates(1), now_s=T0 + 1, policy=SWEEPS, in_flight=0, free_disruption_slots=8)
    day2 = sdc.plan_sweep(candidates(1), now_s=T0 + DAY_S, policy=SWEEPS, in_flight=0, free_disruption_slots=8)
    assert day1[0].seed == again[0].seed
    assert day1[0].seed != day2[0].seed
    assert day1[0].sweep_id != day2[0].sweep_id
    assert 0 <= day1[0].seed < 2**31


def test_node_is_idle_needs_every_gpu_seen_and_under_the_threshold():
    assert sdc.node_is_idle([(80.0, 700.0), (100.0, 700.0)], idle_power_pct=30)
    assert not sdc.node_is_idle([(80.0, 700.0), (650.0, 700.0)], idle_power_pct=30)
    assert not sdc.node_is_idle([(80.0, 700.0), (None, 700.0)], idle_power_pct=30)
    assert not sdc.node_is_idle([], idle_power_pct=30)


def test_sdc_policy_names_a_bad_value():
    with pytest.raises(policy.PolicyError, match=r"sdc\.sweep_share_pct: must be in \(0, 100\], got 0"):
        policy.RemediationPolicy.from_mapping({"sdc": {"sweep_share_pct": 0}})
    with pytest.raises(policy.PolicyError, match=r"escalation\.sdc_confirm_runs: must be >= sdc_confirm_fails"):
        policy.RemediationPolicy.from_mapping({"escalation": {"sdc_confirm_runs": 1}})


def test_planned_sweep_quarantines_take_budget_but_never_trip_the_breaker():
    nodes = {f"n{i:02d}": {} for i in range(20)}
    fleet = blast_radius.FleetView(nodes)
    pol = policy.DisruptionPolicy(max_disrupted_nodes=8, max_disrupted_nodes_pct=50.0, breaker_min_nodes=3)
    proposed = [
        actions.QuarantineNode(
            ticket_id=f"sweep/n{i:02d}/1@1", step=0, node_id=f"n{i:02d}", reason="sweep", planned=True
        )
        for i in range(6)
    ]
    admission = blast_radius.admit(blast_radius.BudgetState(), proposed, fleet, now_s=T0, policy=pol)
    assert len(admission.admitted) == 6
    assert admission.state.breaker_tripped_at is None, "6 of 20 nodes is over 10 %, but sweeps are not breakage"
    assert len(admission.state.quarantined_nodes) == 6
    unplanned = [dataclasses.replace(a, planned=False) for a in proposed]
    tripped = blast_radius.admit(blast_radius.BudgetState(), unplanned, fleet, now_s=T0, policy=pol)
    assert tripped.state.breaker_tripped_at == T0
