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


# --- a repair returns a GPU to its default limit (issue #37 item 8) ------------------------------------

TIGHT = power_tree.PowerTree.from_mapping(
    {"name": "cluster", "budget_w": 2400, "rows": [{"name": "row", "racks": [{"name": "rack", "nodes": NODES}]}]}
)


def _capped_fleet(at_s: float, limits_w: dict[str, int]) -> period_inputs.FleetView:
    """Every GPU busy and held by its cap (SW power cap), its limit read back 0.5 s before at_s."""
    sample_ns = int((at_s - 0.5) * 1e9)
    view = _fleet(at_s=at_s)
    latest = {
        g: fleet.GpuLatest(
            power_w=limits_w[g] - 5.0,
            power_sample_unix_ns=sample_ns,
            enforced_power_limit_w=limits_w[g],
            utilization_gpu_pct=100,
            clock_event_reasons=0x4,
            counters_unix_ns=sample_ns,
        )
        for g in GPUS
    }
    return period_inputs.FleetView(
        **{**view.__dict__, "latest": latest, "latest_controller_ns": dict.fromkeys(GPUS, sample_ns)}
    )


def _steady(at_s: float) -> period.PeriodState:
    """All three GPUs confirmed at 800 W under the 2,400 W cluster budget, nothing in flight."""
    gpus = [
        power_apply.GpuLimits(g, r.node_id, 200, 1000)
        for g, r in sorted(GPUS.items(), key=lambda x: (x[1].node_id, x[0]))
    ]
    apply = power_apply.ApplyState.unknown(gpus, now_s=at_s - 60, policy=POLICY, epoch="e")
    apply = power_apply.record(
        apply, readbacks=[power_apply.CapReadback(g.gpu_uuid, 800.0, at_s - 1) for g in gpus], policy=POLICY
    )
    state = period.initial_state(period_inputs.PeriodConfig(), TIGHT, POLICY, apply, seed=0)
    return period.dataclasses.replace(state, boot_ids={"node-a": "boot-a", "node-b": "boot-b"})


def _caps_in_force(state: period.PeriodState) -> dict[str, float]:
    bound = power_apply.may_be_in_force_w(state.apply)
    return {g.gpu_uuid: float(w) for g, w in zip(state.apply.gpus, bound, strict=True)}


def test_a_gpu_under_a_repair_counts_at_its_default_limit_and_the_others_make_room_first():
    """A reset (or a reboot) returns the GPU to its default limit without a cap command: until its outcome
    is known the GPU counts at its maximum, it gets no command, the others come down, and only once their
    decreases are confirmed does the budget hold with it (so the repair may leave)."""
    limits = {"a0": 800, "a1": 800, "b0": 800}
    first = period.step(_steady(NOW), _inputs(_capped_fleet(NOW, limits), repairing_gpus=frozenset({"b0"})), NOW)
    plan = first.commands.caps
    assert plan is not None
    assert _caps_in_force(first.state)["b0"] == 1000.0
    assert plan.over_budget == ("cluster",), "the default limit does not fit before the others come down"
    assert not plan.increases and {c.gpu_uuid for c in plan.decreases} == {"a0", "a1"}
    assert sum(c.limit_w for c in plan.decreases) <= 2400 - 1000
    # The agent confirms the decreases; the budget now holds with b0 at its default limit.
    acks = tuple(power_apply.CapAck(c.command_id, c.gpu_uuid, float(c.limit_w), NOW + 0.3) for c in plan.decreases)
    lowered = {**limits, **{c.gpu_uuid: c.limit_w for c in plan.decreases}}
    later = NOW + 1.0
    second = period.step(
        first.state, _inputs(_capped_fleet(later, lowered), repairing_gpus=frozenset({"b0"}), acks=acks), later
    )
    assert second.commands.caps is not None and second.commands.caps.over_budget == ()
    assert not second.commands.caps.increases and not second.commands.caps.decreases
    assert sum(_caps_in_force(second.state).values()) <= 2400


def test_after_the_repair_the_gpu_counts_at_its_default_limit_for_one_command_lifetime():
    """A read-back taken right after the repair's outcome may predate the limit the repair left: the GPU
    is known again only from one taken more than a command lifetime after the last period that counted it."""
    limits = {"a0": 700, "a1": 700, "b0": 800}
    state = period.step(_steady(NOW), _inputs(_capped_fleet(NOW, limits), repairing_gpus=frozenset({"b0"})), NOW).state
    soon = NOW + 1.0
    after = period.step(state, _inputs(_capped_fleet(soon, limits)), soon)
    assert _caps_in_force(after.state)["b0"] == 1000.0
    late = NOW + POLICY.command_ttl_s + POLICY.clock_skew_margin_s + 1.0
    settled = period.step(after.state, _inputs(_capped_fleet(late, limits)), late)
    assert _caps_in_force(settled.state)["b0"] < 1000.0, (
        "known again from the read-back: 800 W, and any raise from there"
    )


def test_a_floor_in_the_inputs_is_served_and_the_room_left_is_published():
    first = period.step(_state(), _inputs(_fleet()), NOW)
    later = NOW + POLICY.command_ttl_s + POLICY.clock_skew_margin_s + 1.0
    plain = period.step(first.state, _inputs(_fleet(at_s=later)), later)
    floored = period.step(first.state, _inputs(_fleet(at_s=later), floors_w={"a0": 950.0}), later)
    gpus = [g.gpu_uuid for g in floored.state.apply.gpus]
    a0 = gpus.index("a0")
    assert plain.state.targets_w[a0] < 950 <= floored.state.targets_w[a0]
    assert floored.state.targets_w.sum() <= 3000
    room = floored.room
    assert room is not None and room.gpu_uuids == tuple(gpus) and room.index()["a0"] == a0
    # The room is under the higher of target and may-be-in-force cap (1,000 W, the boot limit, until confirmed).
    assert list(room.cap_w) == [1000.0] * 3 and list(room.headroom_w) == [0.0] * 3
