"""The power period's own rules: what it does with nothing to manage, a policy change, the BMC fallback,
and what came back from commands sent earlier. The decisions inside (allocate, apply, ramp, smoothing)
have their own tests; a whole recorded run replays in test_power_period_replay.py."""

from __future__ import annotations

import numpy as np

from rasd.controller.core import fleet
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import commands, fallback, period, smoothing, swing
from rasd.controller.core.power import inputs as period_inputs
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import tree as power_tree

NOW = 1_800_000_000.0
POLICY = power_policy.PowerPolicy(control_period_s=1.0, command_ttl_s=2.0)
NODES = [{"name": "node-a"}, {"name": "node-b"}]
TREE = power_tree.PowerTree.from_mapping(
    {"name": "cluster", "budget_w": 3000, "rows": [{"name": "row", "racks": [{"name": "rack", "nodes": NODES}]}]}
)


def _record(gpu: str, node: str) -> fleet.GpuRecord:
    return fleet.GpuRecord(gpu, "B200", "", 200, 1000, 1000, power_smoothing_supported=True, node_id=node)


GPUS = {"a0": _record("a0", "node-a"), "a1": _record("a1", "node-a"), "b0": _record("b0", "node-b")}


def _fleet(*, at_s: float = NOW, sessions=("node-a", "node-b")) -> period_inputs.FleetView:
    """Every GPU busy at 600 W under the 1,000 W limit it booted with, sampled 0.5 s before `at_s`."""
    sample_ns = int((at_s - 0.5) * 1e9)
    reading = fleet.GpuLatest(
        power_w=600.0,
        power_sample_unix_ns=sample_ns,
        enforced_power_limit_w=1000,
        utilization_gpu_pct=100,
        counters_unix_ns=sample_ns,
    )
    return period_inputs.FleetView(
        records=GPUS,
        known_records={},
        gpu_nodes={g: r.node_id for g, r in GPUS.items()},
        node_gpus={"node-a": ("a0", "a1"), "node-b": ("b0",)},
        boot_ids={"node-a": "boot-a", "node-b": "boot-b"},
        sessions={n: f"session-{n}" for n in sessions},
        node_labels={},
        latest=dict.fromkeys(GPUS, reading),
        latest_controller_ns=dict.fromkeys(GPUS, sample_ns),
    )


def _inputs(view: period_inputs.FleetView, **changes) -> period_inputs.PeriodInputs:
    window = period_inputs.WindowView(sample_hz=10.0, draw_peaks_w={g: 650.0 for g in GPUS}, status_rows=())
    return period_inputs.PeriodInputs(fleet=view, window=window, **changes)


def _state(tree: power_tree.PowerTree = TREE) -> period.PeriodState:
    apply = power_apply.ApplyState.unknown((), now_s=NOW - 100, policy=POLICY, epoch="e")
    return period.initial_state(period_inputs.PeriodConfig(bmc_fallback_after_s=5.0), tree, POLICY, apply, seed=0)


def test_with_no_gpu_in_the_tree_a_period_sends_nothing_and_says_why():
    view = _fleet()
    empty = period_inputs.FleetView(**{**view.__dict__, "records": {}, "gpu_nodes": {}})
    result = period.step(_state(), _inputs(empty), NOW)
    assert result.status.power is None and result.status.reason == "no GPUs in the power tree yet"
    assert result.commands == commands.Commands()


def test_boot_default_caps_come_under_the_budget_once_read_back_decreases_first():
    first = period.step(_state(), _inputs(_fleet()), NOW)
    assert first.state.periods == 1 and first.status.power is not None
    assert first.commands.cap_commands == (), "new GPUs wait for a read-back newer than any command's lifetime"
    later = NOW + POLICY.command_ttl_s + POLICY.clock_skew_margin_s + 1.0
    result = period.step(first.state, _inputs(_fleet(at_s=later)), later)
    plan = result.commands.caps
    assert plan is not None and plan.decreases and not plan.increases
    assert sum(c.limit_w for c in plan.decreases) <= 3000
    assert {c.node_id for c in result.commands.cap_commands} == {"node-a", "node-b"}


def test_a_policy_change_switches_the_plan_off_on_the_nodes_that_carry_it():
    plan = swing.SmoothingPlan(
        active=True,
        mode="firmware",
        floor_w=600.0,
        floor_pct=60.0,
        ramp_up_w_per_s=900.0,
        ramp_down_w_per_s=900.0,
        ramp_down_hysteresis_ms=100.0,
        job_ramp_w_per_s=10.0,
        trough_filler_w=None,
        peak_cap_w=None,
        expected_p2p_w=1.0,
        expected_attenuation_db=12.0,
        expected_energy_overhead_pct=20.0,
        reason="GPU power-smoothing profile",
    )
    state = _state()
    state = period.dataclasses.replace(
        state, smoothing=smoothing.SmoothingState(plan=plan, nodes={"node-a": f"{plan.reason}/session-node-a"})
    )
    new, out = period.change_policy(state, power_policy.PowerPolicy(command_ttl_s=3.0), _fleet(), NOW)
    assert new.smoothing.plan is None and new.smoothing.off_since_s == NOW and new.policy.command_ttl_s == 3.0
    (off,) = out.smoothing
    assert off == commands.SetSmoothing("node-a", ("a0", "a1"), False, reason="policy changed", deadline_s=NOW + 3.0)
    assert [n.event for n in out.notes] == ["power_smoothing_off"]


def test_a_plan_command_that_went_unanswered_goes_again():
    state = smoothing.SmoothingState(nodes={"node-a": "k", "node-b": "k"})
    folded = smoothing.fold_outcomes(
        state, period_inputs.SendOutcomes(smoothing_unanswered_nodes=frozenset({"node-a"}))
    )
    assert folded.nodes == {"node-b": "k"}


def test_an_unreachable_node_whose_caps_must_come_down_gets_a_bmc_limit_only_after_the_wait():
    gpus = [power_apply.GpuLimits("a0", "node-a", 200, 1000), power_apply.GpuLimits("a1", "node-a", 200, 1000)]
    apply = power_apply.ApplyState.unknown(gpus, now_s=NOW, policy=POLICY, epoch="e")
    read = [power_apply.CapReadback(g.gpu_uuid, 1000.0, NOW + 10) for g in gpus]
    apply = power_apply.record(apply, readbacks=read, policy=POLICY)
    # The decreases to 500 W cannot land (the agent is away): they count at 1,000 W each.
    apply, _plan = power_apply.plan(apply, np.array([500, 500]), TREE, now_s=NOW + 10, policy=POLICY)
    targets = np.array([500, 500])
    kwargs = {"sessions": (), "bmc_nodes": {"node-a"}, "after_s": 5.0}
    state, asked = fallback.requests(fallback.FallbackState(), apply, targets, now_s=NOW + 10, **kwargs)
    assert asked == () and state.unreachable_since_s == {"node-a": NOW + 10}
    state, asked = fallback.requests(state, apply, targets, now_s=NOW + 15, **kwargs)
    assert asked == (commands.SetNodeLimit("node-a", 1000, {"a0": 500, "a1": 500}),)
    assert state.in_flight == {"node-a"}
    again, none = fallback.requests(state, apply, targets, now_s=NOW + 16, **kwargs)
    assert none == (), "one request at a time"
    answer = period_inputs.NodeLimitResult("node-a", 1000, 1000, NOW + 16, {"a0": 500, "a1": 500})
    assert fallback.confirmed(answer)
    confirmed = fallback.fold_results(again, [answer])
    assert confirmed.limits_w == {"node-a": 1000} and not confirmed.in_flight
    counted = fallback.count_confirmed_limits(apply, confirmed, (), POLICY)
    assert power_apply.may_be_in_force_w(counted).tolist() == [500.0, 500.0]
    assert (counted.pending_seq != power_apply.NO_COMMAND).all(), "the decreases stay pending"
    assert fallback.count_confirmed_limits(apply, confirmed, ("node-a",), POLICY) is apply, "the agent is back"


def test_a_bmc_that_reads_back_no_limit_does_not_count():
    answer = period_inputs.NodeLimitResult("node-a", 1000, None, NOW, {})
    assert not fallback.confirmed(answer)
    state = fallback.fold_results(fallback.FallbackState(in_flight=frozenset({"node-a"})), [answer])
    assert state.limits_w == {} and state.in_flight == frozenset()
