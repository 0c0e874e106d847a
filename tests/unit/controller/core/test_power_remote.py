"""The power period over a fleet split between replicas (`core.power.remote`): the same decisions as
over the fleet held whole, and a replica gone counts its GPUs at their caps."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.controller.core import aggregates, fleet
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import inputs as period_inputs
from rasd.controller.core.power import period, remote, views
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import tree as power_tree

NOW = 1_800_000_000.0
POLICY = power_policy.PowerPolicy(control_period_s=1.0, command_ttl_s=2.0)
NODES = ("node-a", "node-b", "node-c", "node-d")
HERE = ("node-a", "node-b")
"""The leader's own streams; node-c and node-d stream to the other replica."""
TREE = power_tree.PowerTree.from_mapping(
    {
        "name": "cluster",
        "budget_w": 4000,
        "rows": [{"name": "row", "racks": [{"name": "rack", "budget_w": 3000, "nodes": [{"name": n} for n in NODES]}]}],
    }
)
GPUS = {f"{n}-g{i}": n for n in NODES for i in range(2)}
RECORDS = {g: fleet.GpuRecord(g, "H100", "", 200, 700, 700, node_id=n) for g, n in GPUS.items()}
DRAW_W = {g: 350.0 + 40 * i for i, g in enumerate(GPUS)}


LIMITS_W = dict.fromkeys(GPUS, 700)
"""What the GPUs enforce (boot default), as the commands left them."""


def _reading(gpu: str, at_s: float) -> fleet.GpuLatest:
    sample_ns = int((at_s - 0.5) * 1e9)
    limit = LIMITS_W[gpu]
    return fleet.GpuLatest(
        power_w=min(DRAW_W[gpu], limit) - 20,
        power_sample_unix_ns=sample_ns,
        enforced_power_limit_w=limit,
        utilization_gpu_pct=90,
        clock_event_reasons=4 if DRAW_W[gpu] >= limit else 0,
        counters_unix_ns=sample_ns,
    )


def _rows(gpus, at_s: float) -> tuple[tuple[int, float, int], ...]:
    start = int((at_s - 4.0) * 10) * 100_000_000
    return tuple((start + k * 100_000_000, sum(DRAW_W[g] - 20 * (k % 3) for g in gpus), len(gpus)) for k in range(40))


def _view(nodes, at_s: float) -> period_inputs.FleetView:
    gpus = [g for g, n in GPUS.items() if n in nodes]
    return period_inputs.FleetView(
        records={g: RECORDS[g] for g in gpus},
        known_records={},
        gpu_nodes={g: GPUS[g] for g in gpus},
        node_gpus={n: tuple(g for g in gpus if GPUS[g] == n) for n in nodes},
        boot_ids={n: f"boot-{n}" for n in nodes},
        sessions={n: f"session-{n}" for n in nodes},
        node_labels={n: {} for n in nodes},
        latest={g: _reading(g, at_s) for g in gpus},
        latest_controller_ns={g: int((at_s - 0.5) * 1e9) for g in gpus},
    )


def _window(gpus, at_s: float) -> period_inputs.WindowView:
    rows = _rows(gpus, at_s)
    return period_inputs.WindowView(sample_hz=10.0, draw_peaks_w={g: DRAW_W[g] for g in gpus}, status_rows=rows,
                                    swing_rows=rows, straggler_peaks_w={g: DRAW_W[g] for g in gpus})  # fmt: skip


def _elsewhere(at_s: float) -> aggregates.ReplicaAggregate:
    """What the other replica ships for node-c and node-d."""
    there = [n for n in NODES if n not in HERE]
    view, window = _view(there, at_s), _window([g for g, n in GPUS.items() if n in there], at_s)
    return aggregates.ReplicaAggregate(
        replica_id="ctl-b",
        built_unix_ns=int(at_s * 1e9),
        interval_s=0.5,
        nodes={
            n: aggregates.NodeStream(n, view.sessions[n], 1, view.boot_ids[n], {}, view.node_gpus[n], None)
            for n in there
        },
        records=dict(view.records),
        latest=dict(view.latest),
        latest_controller_ns=dict(view.latest_controller_ns),
        draw_window_s=5.0,
        draw_peaks_w=dict(window.draw_peaks_w),
        detect_window_s=5.0,
        detect_peaks_w=dict(window.straggler_peaks_w or {}),
        series=window.status_rows,
    )


def _inputs_whole(at_s: float, acks=()) -> period_inputs.PeriodInputs:
    return period_inputs.PeriodInputs(fleet=_view(NODES, at_s), window=_window(list(GPUS), at_s), acks=acks)


def _inputs_split(state: period.PeriodState, at_s: float, *, others=None, acks=()) -> period_inputs.PeriodInputs:
    here_gpus = [g for g, n in GPUS.items() if n in HERE]
    others = [_elsewhere(at_s)] if others is None else others
    others = [aggregates.decode(aggregates.encode(a)) for a in others]  # as the leader reads them: with a block
    fresh = aggregates.fresh(others, now_unix_ns=int(at_s * 1e9), max_age_s=5.0, exclude="ctl-a")
    merged = aggregates.merge(fresh)
    view = remote.fleet_view(_view(HERE, at_s), merged)
    reads = period.window_reads(state, view, at_s)
    window = remote.window_view(_window(here_gpus, at_s), merged, reads)
    return period_inputs.PeriodInputs(fleet=view, window=window, acks=acks)


def _state() -> period.PeriodState:
    apply = power_apply.ApplyState.unknown((), now_s=NOW - 100, policy=POLICY, epoch="e")
    config = period_inputs.PeriodConfig(draw_window_s=5.0, detect_window_s=5.0)
    return period.initial_state(config, TREE, POLICY, apply, seed=3)


def test_a_fleet_split_between_two_replicas_gets_the_same_caps_as_the_fleet_held_whole(monkeypatch):
    monkeypatch.setattr(f"{__name__}.LIMITS_W", dict.fromkeys(GPUS, 700))
    whole, split = _state(), _state()
    sent_whole, sent_split, acks = [], [], ()
    for k in range(8):  # unknown → read back → decreases, acked → raises into the confirmed slack
        at = NOW + k * (POLICY.command_ttl_s + POLICY.clock_skew_margin_s + 1.0)
        one = period.step(whole, _inputs_whole(at, acks), at)
        two = period.step(split, _inputs_split(split, at, acks=acks), at)
        whole, split = one.state, two.state
        sent_whole.append(one.commands.cap_commands)
        sent_split.append(two.commands.cap_commands)
        assert one.status.power is not None and two.status.power is not None
        assert two.status.power.root.allocated_w == one.status.power.root.allocated_w
        assert two.status.power.swing == one.status.power.swing
        # The GPUs do as told and answer at once.
        limits = [limit for command in one.commands.cap_commands for limit in command.limits]
        LIMITS_W.update({c.gpu_uuid: c.limit_w for c in limits})
        acks = tuple(power_apply.CapAck(c.command_id, c.gpu_uuid, c.limit_w, at + 0.1) for c in limits)
    assert sent_split == sent_whole
    raised = [c for cmds in sent_split for command in cmds for c in command.limits if c.phase == 2]
    assert raised, "raises went out once the decreases were confirmed"
    assert {c.node_id for cmds in sent_split for c in cmds} == set(NODES), "caps go to the other replica's nodes too"
    assert sum(LIMITS_W.values()) <= 3000, "the rack's budget, over both replicas' nodes"


def test_the_other_replicas_nodes_are_reachable_and_a_dead_replicas_count_at_their_caps():
    state = _state()
    at = NOW + 10.0
    live = _inputs_split(state, at)
    gone = _inputs_split(state, at, others=[_elsewhere(at - 30.0)])  # its last aggregate, 30 s old
    gpus = views.inventory(frozenset(NODES), live.fleet, ())
    apply = power_apply.ApplyState.unknown(gpus, now_s=at, policy=POLICY, epoch="e")
    apply = power_apply.record(apply, readbacks=views.readbacks(apply.gpus, live.fleet, at), policy=POLICY)
    ctx = views.ViewContext(at, state.config, POLICY, None, frozenset(), {}, {})
    seen = views.gpu_views(apply, TREE, live, ctx).views
    blind = views.gpu_views(apply, TREE, gone, ctx).views
    there = np.array([GPUS[g] not in HERE for g in seen.gpu_uuids])
    assert seen.reachable.all() and np.array_equal(seen.draw_w, [DRAW_W[g] for g in seen.gpu_uuids])
    assert not blind.reachable[there].any() and blind.reachable[~there].all()
    assert np.array_equal(blind.draw_w[there], blind.cap_w[there]), "a stale view draws at its cap"
    assert np.array_equal(blind.draw_w[~there], seen.draw_w[~there])


def test_the_summed_series_stops_where_the_other_replicas_aggregate_ends():
    state = _state()
    at = NOW + 10.0
    late = _elsewhere(at)
    late = aggregates.ReplicaAggregate(**{**late.__dict__, "built_unix_ns": int((at - 1.0) * 1e9)})
    inputs = _inputs_split(state, at, others=[late])
    assert inputs.window.status_rows, "the rows before the other replica's aggregate are kept"
    assert max(r[0] for r in inputs.window.status_rows) < late.built_unix_ns
    assert {r[2] for r in inputs.window.status_rows} == {len(GPUS)}, "every kept bucket holds every GPU"


_READINGS = st.builds(
    fleet.GpuLatest,
    power_w=st.none() | st.floats(0, 2000) | st.just(math.nan),
    power_sample_unix_ns=st.integers(0, 2**62),
    enforced_power_limit_w=st.none() | st.integers(0, 2000),
    utilization_gpu_pct=st.none() | st.integers(0, 100),
    clock_event_reasons=st.none() | st.integers(0, 2**20),
    counters_unix_ns=st.integers(0, 2**62),
    power_limit_slew_target_w=st.none() | st.integers(0, 2000),
)
_CONTROLLER_NS = st.none() | st.integers(-(2**40), 2**62)
_HOLDERS = st.sampled_from(["leader", "ctl-b", "ctl-c", "leader and ctl-b", "ctl-b and ctl-c"])


def _shipped(replica: str, nodes: dict[str, tuple[str, ...]], readings, controller_ns, opened_ns: int):
    """What replica ships for nodes, through the encoding the leader reads (which builds the block)."""
    gpus = [g for gs in nodes.values() for g in gs]
    shipped = aggregates.ReplicaAggregate(
        replica_id=replica,
        built_unix_ns=int(NOW * 1e9),
        interval_s=0.5,
        nodes={
            n: aggregates.NodeStream(n, f"s-{replica}-{n}", opened_ns, "boot", {}, gs, None) for n, gs in nodes.items()
        },
        records={g: _any_record(g, n) for n, gs in nodes.items() for g in gs},
        latest={g: readings[g] for g in gpus if g in readings},
        latest_controller_ns={g: controller_ns[g] for g in gpus if g in readings and controller_ns[g] is not None},
        draw_window_s=5.0,
        draw_peaks_w={},
        detect_window_s=5.0,
        detect_peaks_w={},
    )
    return aggregates.decode(aggregates.encode(shipped))


def _any_record(gpu: str, node: str) -> fleet.GpuRecord:
    return fleet.GpuRecord(gpu, "H100", "", 200, 700, 700, node_id=node)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_view_laid_over_whole_and_its_block_equal_the_gpu_by_gpu_lay_over(data):
    """Whoever holds each node, and whatever the leader knows of the other replicas' GPUs itself: the
    view's mappings are the GPU-by-GPU lay-over's, and the columns the period reads from the block
    are the ones the view's readings give."""
    nodes = {f"n{i}": (f"n{i}-g0", f"n{i}-g1") for i in range(5)}
    holders = {n: data.draw(_HOLDERS, label=n) for n in nodes}
    gpus = [g for gs in nodes.values() for g in gs]
    remote_readings = {g: data.draw(_READINGS, label=g) for g in gpus if data.draw(st.booleans(), label=f"{g} read")}
    remote_ns = {g: data.draw(_CONTROLLER_NS, label=f"{g} ns") for g in gpus}
    local_readings = {g: data.draw(_READINGS) for g in gpus if data.draw(st.booleans(), label=f"{g} known here")}
    shipped = [
        _shipped(replica, {n: gs for n, gs in nodes.items() if replica in holders[n]}, remote_readings, remote_ns,
                 opened_ns=10**9 if replica == "ctl-b" else 2 * 10**9)
        for replica in ("ctl-b", "ctl-c")
    ]  # fmt: skip
    here = [n for n in nodes if "leader" in holders[n]]
    local = period_inputs.FleetView(
        records={g: _any_record(g, n) for n in here for g in nodes[n]},
        known_records={},
        gpu_nodes={g: n for n in here for g in nodes[n]},
        node_gpus={n: nodes[n] for n in here},
        boot_ids=dict.fromkeys(here, "boot"),
        sessions={n: f"s-{n}" for n in here},
        node_labels={n: {} for n in here},
        latest=local_readings,
        latest_controller_ns={g: int(NOW * 1e9) for g in local_readings},
    )
    view = remote.fleet_view(local, aggregates.merge(shipped))
    limits = [power_apply.GpuLimits(g, g.split("-")[0], 200, 700) for g in [*gpus, "nowhere-g0"]]

    got = views.latest_columns(limits, view)
    want = views.latest_columns(limits, dataclasses.replace(view, latest_block=None))

    for name in ("present", *aggregates.BLOCK_COLUMNS):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert _plain(view) == _plain(_laid_over_gpu_by_gpu(local, aggregates.merge(shipped)))


def _laid_over_gpu_by_gpu(local: period_inputs.FleetView, merged: aggregates.FleetAggregate):
    """The lay-over as the module docstring states it, one remote GPU at a time."""
    records, gpu_nodes = dict(local.records), dict(local.gpu_nodes)
    latest, controller_ns = dict(local.latest), dict(local.latest_controller_ns)
    for node_id, stream in merged.nodes.items():
        if node_id in local.sessions:
            continue  # the leader's own stream: its view as it is
        for g in stream.gpu_uuids:
            if g in merged.records:
                records[g] = merged.records[g]
            gpu_nodes[g] = node_id
            if g in merged.latest:
                latest[g] = fleet.merge_latest(local.latest.get(g), merged.latest[g])
            if g in merged.latest_controller_ns:
                controller_ns[g] = max(merged.latest_controller_ns[g], local.latest_controller_ns.get(g, 0))
    return dataclasses.replace(
        local, records=records, gpu_nodes=gpu_nodes, latest=latest, latest_controller_ns=controller_ns
    )


def _plain(view: period_inputs.FleetView):
    """The view's per-GPU mappings, comparable (a NaN reads as its repr)."""
    return [
        dict(view.records),
        dict(view.gpu_nodes),
        {g: repr(reading) for g, reading in view.latest.items()},
        dict(view.latest_controller_ns),
    ]


def test_the_other_replicas_readings_reach_the_period_as_a_block():
    shipped = [_shipped("ctl-b", {"n1": ("n1-g0", "n1-g1")}, {"n1-g0": fleet.GpuLatest(power_w=300.0)},
                        {"n1-g0": -5}, opened_ns=1)]  # fmt: skip
    view = remote.fleet_view(_view(HERE, NOW), aggregates.merge(shipped))
    assert view.latest_block is not None
    assert view.latest_block.gpu_uuids == ["n1-g0"] and view.latest_block.controller_ns.tolist() == [0]
