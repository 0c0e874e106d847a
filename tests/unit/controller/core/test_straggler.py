"""The straggler verdict: a persisting lag is named once, with its evidence; jitter and a uniform slowdown are not."""

from __future__ import annotations

import random

import pytest

from rasd.controller.core import straggler
from rasd.controller.core.fleet import PcieLink

POLICY = straggler.StragglerPolicy()


def _edges(lag_s: dict[str, float], *, gpus: int = 64, rng: random.Random, start_s: float = 0.0) -> dict[str, float]:
    """One step: every GPU's edge with 5-20 ms of jitter, plus the given extra lags."""
    return {f"GPU-{i}": start_s + 1.4 + rng.uniform(0.005, 0.020) + lag_s.get(f"GPU-{i}", 0.0) for i in range(gpus)}


def test_a_gpu_70ms_late_every_step_is_named_on_the_second_step_with_its_lag_and_evidence():
    rng = random.Random(1)
    state = straggler.StragglerState()
    named = []
    for step in range(5):
        state, verdicts = straggler.observe_step(
            state,
            _edges({"GPU-7": 0.070}, rng=rng, start_s=2.0 * step),
            policy=POLICY,
            signals={"GPU-7": ("clock event reason SW power cap",)},
        )
        named.append([v.gpu_uuid for v in verdicts])
    assert named == [[], ["GPU-7"], [], [], []]  # named once
    assert state.suspects == {"GPU-7"}
    _, (verdict,) = straggler.observe_step(
        straggler.StragglerState(), _edges({"GPU-7": 0.2}, rng=rng), policy=POLICY, signals={}
    )
    assert verdict.mean_lag_s == pytest.approx(0.2, abs=0.01)
    assert verdict.reason.endswith("no corroborating signal")


def test_the_evidence_given_is_named_in_the_reason():
    rng = random.Random(2)
    state = straggler.StragglerState()
    reasons = []
    for step in range(3):
        state, verdicts = straggler.observe_step(
            state,
            _edges({"GPU-3": 0.07}, rng=rng, start_s=2.0 * step),
            policy=POLICY,
            signals={"GPU-3": ("PCIe Gen4 x8 of x16",)},
        )
        reasons += [v.reason for v in verdicts]
    assert len(reasons) == 1 and "GPU-3 lags the job's median edge by" in reasons[0]
    assert reasons[0].endswith("PCIe Gen4 x8 of x16")


def test_jitter_alone_names_no_one_over_thousands_of_steps():
    rng = random.Random(3)
    state = straggler.StragglerState()
    for step in range(2000):
        state, verdicts = straggler.observe_step(state, _edges({}, rng=rng, start_s=2.0 * step), policy=POLICY)
        assert verdicts == ()


def test_a_whole_job_that_slows_down_is_never_a_straggler():
    rng = random.Random(4)
    state = straggler.StragglerState()
    for step in range(200):
        slow = {f"GPU-{i}": 0.1 for i in range(64)}  # every rank 100 ms later: the step is slower, no one lags
        state, verdicts = straggler.observe_step(state, _edges(slow, rng=rng, start_s=2.1 * step), policy=POLICY)
        assert verdicts == ()


def test_a_step_with_too_few_edges_is_not_judged():
    state, verdicts = straggler.observe_step(
        straggler.StragglerState(), {"GPU-0": 0.0, "GPU-1": 5.0, "GPU-2": 0.0}, policy=POLICY
    )
    assert verdicts == () and state.steps_judged == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("threshold", 0.0, "^threshold: must be > 0"), ("min_gpus", 2, "^min_gpus: must be >= 3")],
)
def test_bad_policy_values_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        straggler.StragglerPolicy(**{field: value})


def test_a_gpus_own_signals_name_thermal_reasons_with_its_temperature_and_a_link_below_its_best():
    assert straggler.gpu_signals(0x24, 88, PcieLink(16, 16, 5, 5)) == (
        "clock event: software thermal slowdown",
        "temperature 88 C",
    )
    assert straggler.gpu_signals(0x4, 88, PcieLink(4, 16, 3, 5)) == ("PCIe link x4 of x16", "PCIe link Gen3 of Gen5")
    assert straggler.gpu_signals(0x80, 70, None) == ("clock event: hardware power brake",)  # no heat named
    assert straggler.gpu_signals(None, None, None) == ()


def _climbing(node_lags: dict[str, float], steps: int = 3) -> straggler.StragglerState:
    rng, state = random.Random(4), straggler.StragglerState()
    for step in range(steps):
        state, _ = straggler.observe_step(state, _edges(node_lags, rng=rng, start_s=2.0 * step), policy=POLICY)
    return state


NODE = [f"GPU-{i}" for i in range(8, 16)]


def test_a_node_whose_gpus_all_climb_is_named_node_wide_and_one_clean_gpu_of_it_says_not():
    state = _climbing(dict.fromkeys(NODE, 0.07))
    (evidence,) = straggler.node_wide_signal("node-1", NODE, state, POLICY)
    assert evidence.startswith("node-wide: all 8 GPUs of node-1 lag")
    state = _climbing({gpu: 0.07 for gpu in NODE[1:]})
    assert straggler.node_wide_signal("node-1", NODE, state, POLICY) == ()
    assert straggler.node_wide_signal("node-1", NODE[:1], _climbing({NODE[0]: 0.07}), POLICY) == ()  # one GPU alone
    assert straggler.node_wide_signal("node-0", [f"GPU-{i}" for i in range(8)], state, POLICY) == ()  # clean node


def test_with_evidence_rewrites_only_the_reason():
    _, (verdict,) = straggler.observe_step(
        straggler.StragglerState(), _edges({"GPU-7": 0.2}, rng=random.Random(5)), policy=POLICY
    )
    corroborated = straggler.with_evidence(verdict, ("PCIe link x8 of x16", "node-wide: ..."))
    assert corroborated.reason == verdict.reason.replace(
        "no corroborating signal", "PCIe link x8 of x16; node-wide: ..."
    )
    assert (corroborated.score, corroborated.mean_lag_s, corroborated.steps) == (
        verdict.score,
        verdict.mean_lag_s,
        verdict.steps,
    )
