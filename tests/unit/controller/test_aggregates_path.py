"""The aggregates' path to the leader through the store: two replicas' ingests on one database.

A follower ships its aggregate (`replication.aggregates.Shipper`, one upsert); the leader reads it
(`FleetReader`, each row decoded once) and its power period then sees the follower's nodes as reachable, with
their draw; the leader asks for its windows and canaries, and the follower takes them up; a
follower whose aggregate grew too old leaves its nodes unreachable, their GPUs at their caps.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from rasd.controller import wiring
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import aggregates, fleet
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.remediation import policy
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.observability import metrics
from rasd.controller.power import loop as power_loop
from rasd.controller.replication import leader
from rasd.controller.store import repo

START_NS = 1_800_000_000 * 10**9
READS = aggregates.AggregateReads(interval_s=0.5, draw_window_s=5.0, detect_window_s=5.0)
POWER = {
    "tree": {
        "name": "cluster",
        "budget_w": 2400,
        "rows": [{"name": "row", "racks": [{"name": "rack", "nodes": [{"name": "node-a"}, {"name": "node-c"}]}]}],
    },
    "policy": {"control_period_s": 1.0, "command_ttl_s": 2.0},
    "detect_window_s": 5.0,
}


class Clock:
    """Both replicas' clock, moved by the test."""

    def __init__(self) -> None:
        self.now_ns = START_NS

    def __call__(self) -> int:
        return self.now_ns


def _replica(db_url: str, name: str, clock: Clock, ladder: wiring.Ladder | None = None) -> wiring.Wired:
    store = repo.Store.open(db_url)
    leadership = leader.Leadership(store.engine, leader.LeaderSettings(replica_id=name), election="lease")
    settings = ingest_mod.IngestSettings(mark_all_disconnected_at_start=False)
    return wiring.replicated(store, metrics.ControllerMetrics(CollectorRegistry()), leadership, ladder=ladder,
                             settings=settings, poll_s=0.05, aggregate_reads=READS, clock=clock)  # fmt: skip


async def _node(ingest: ingest_mod.Ingest, node_id: str, draw_w: float, clock: Clock) -> None:
    """A node connects and sends one second of telemetry: each GPU at draw_w under a 700 W limit."""
    gpus = tuple(fleet.GpuRecord(f"{node_id}-g{i}", "H100", "", 200, 700, 700, node_id=node_id) for i in range(2))
    hello = fleet.NodeHello(node_id, f"boot-{node_id}", "test", node_id, "simulated", {}, gpus, 0)
    session, _welcome = await ingest.open_session(hello)
    first_ns = clock.now_ns - 10**9
    reading = fleet.GpuLatest(power_w=draw_w, power_sample_unix_ns=clock.now_ns - 10**8, enforced_power_limit_w=700,
                              utilization_gpu_pct=90, counters_unix_ns=clock.now_ns - 10**8)  # fmt: skip
    ingest.on_telemetry(
        session,
        msgs.Telemetry(
            power=tuple(msgs.PowerSeries(g.uuid, first_ns, 100, [draw_w - 50] * 9 + [draw_w]) for g in gpus),
            latest={g.uuid: reading for g in gpus},
            newest_counters_unix_ns=clock.now_ns - 10**8,
        ),
    )


SWEEPS = policy.RemediationPolicy.from_mapping(
    {"sdc": {"sweep_enabled": True, "sweep_interval_s": 3600.0, "sweep_share_pct": 100.0, "sweep_max_concurrent": 4,
             "sweep_reserve_slots": 0}, "disruption": {"max_disrupted_nodes_pct": 100.0}}
)  # fmt: skip


@pytest.fixture
def replicas(tmp_path):
    clock = Clock()
    db_url = f"sqlite:///{tmp_path / 'rasd.db'}"
    leader_side = _replica(db_url, "ctl-a", clock, wiring.Ladder(policy=SWEEPS))
    follower = _replica(db_url, "ctl-b", clock)
    yield leader_side, follower, clock
    for wired in (leader_side, follower):
        wired.thread.close()
        wired.store.close()


def test_the_leaders_period_sees_the_followers_nodes_and_a_dead_follower_leaves_them_at_their_caps(replicas):
    leader_side, follower, clock = replicas
    seen: list = []
    formats: list[int] = []

    async def scenario():
        await _node(leader_side.ingest, "node-a", 400.0, clock)
        await _node(follower.ingest, "node-c", 600.0, clock)
        shipped = await follower.shipper.ship_once()
        loop = power_loop.PowerLoop(leader_side.ingest, power_loop.PowerSettings.from_mapping(POWER), clock=clock,
                                    remote=leader_side.fleet)  # fmt: skip
        loop.on_step = lambda _before, inputs, _now, result: seen.append((inputs, result))
        await loop.start()
        await loop.stop()  # its timer stops; the test runs each period by hand
        await loop.step()
        asked = await leader_side.ingest.store_calls.run_in_store(leader_side.fleet.store.asked)
        store = leader_side.fleet.store
        first_rows = await leader_side.ingest.store_calls.run_in_store(
            lambda: store.changed_aggregates(exclude="", built_since_unix_ns=0, known={})[1]
        )
        await follower.shipper.ship_once()  # takes up what the leader asked
        await follower.shipper.ship_once()  # ships as it asked
        rows = await leader_side.ingest.store_calls.run_in_store(
            lambda: store.changed_aggregates(exclude="", built_since_unix_ns=0, known={})[1]
        )
        formats.extend([first_rows[0][2], rows[0][2]])
        clock.now_ns += 10 * 10**9  # the follower stops shipping: its aggregate ages out
        await loop.step()
        return shipped, asked, loop.stats

    shipped, asked, stats = asyncio.run(scenario())
    assert stats.periods == len(stats.step_ms) == len(stats.step_phases_ms) == 2
    for total_ms, phases_ms in zip(stats.step_ms, stats.step_phases_ms, strict=True):
        assert len(phases_ms) == len(power_loop.STEP_PHASES) and min(phases_ms) >= 0
        assert sum(phases_ms) == pytest.approx(total_ms), "the phases are the whole period"
    assert set(shipped.nodes) == {"node-c"} and shipped.draw_peaks_w == {"node-c-g0": 600.0, "node-c-g1": 600.0}
    (live, _first), (stale, later) = seen
    assert set(live.fleet.sessions) == {"node-a", "node-c"}, "the follower's node is reachable from the leader"
    assert live.window.draw_peaks_w["node-c-g0"] == 600.0 and live.window.draw_peaks_w["node-a-g0"] == 400.0
    assert {row[2] for row in live.window.status_rows} == {4}, "both replicas' GPUs in every bucket"
    windows = {"interval_s": 0.5, "draw_window_s": 5.0, "detect_window_s": 5.0}
    assert asked == {**windows, "tracked": [], "formats": [1, 2, 3]}
    assert follower.shipper.reads == aggregates.AggregateReads.from_mapping(asked)
    assert formats == [1, 3], "format 1 until the leader listed the newest among those it reads, then that"
    # Ten seconds later the follower's aggregate is too old: its node is unreachable, counted at its caps.
    assert set(stale.fleet.sessions) == {"node-a"}
    state = later.state.apply
    assert {g.gpu_uuid for g in state.gpus} == {"node-a-g0", "node-a-g1", "node-c-g0", "node-c-g1"}
    bounds = dict(zip((g.gpu_uuid for g in state.gpus), power_apply.may_be_in_force_w(state), strict=True))
    assert bounds["node-c-g0"] == bounds["node-c-g1"] == 700.0, "its caps still count, at the most that may be in force"
    assert not [c for c in later.commands.cap_commands if c.node_id == "node-c"]


def test_the_follower_sums_the_canaries_the_leader_asks_for(replicas):
    leader_side, follower, clock = replicas
    canaries = frozenset({"node-c-g0"})

    async def scenario():
        await _node(follower.ingest, "node-c", 600.0, clock)
        await leader_side.fleet.ask(dataclasses.replace(READS, tracked=canaries))
        before = await follower.shipper.ship_once()  # learns of the canaries with this ship
        clock.now_ns += 10**9
        await _node(follower.ingest, "node-c", 500.0, clock)  # a second of telemetry since
        after = await follower.shipper.ship_once()
        merged = await leader_side.fleet.read(max_age_s=5.0, tracked=canaries)
        return before, after, merged

    before, after, merged = asyncio.run(scenario())
    assert before.tracked == frozenset() and after.tracked == canaries
    assert after.tracked_series and {gpus for _t, _w, gpus in after.tracked_series} == {1}
    assert merged.tracked_series == after.tracked_series


def test_a_replica_that_stops_withdraws_its_aggregate(replicas):
    leader_side, follower, clock = replicas

    async def scenario():
        await _node(follower.ingest, "node-c", 600.0, clock)
        await follower.shipper.ship_once()
        before = await leader_side.fleet.read(max_age_s=5.0)
        await follower.shipper.stop()
        after = await leader_side.fleet.read(max_age_s=5.0)
        return before, after

    before, after = asyncio.run(scenario())
    assert before.replicas == ("ctl-b",) and set(before.nodes) == {"node-c"}
    assert after.replicas == () and after.nodes == {}


def test_each_shipped_aggregate_is_decoded_once_and_as_it_lands_between_periods(replicas):
    """The leader decodes a row when it first sees it (between periods, `prefetch_forever`), and a
    period's read takes it decoded: six replicas' decodes were nearly half a 100,000-GPU period."""
    leader_side, follower, clock = replicas
    reader = leader_side.fleet

    async def scenario():
        await _node(follower.ingest, "node-c", 600.0, clock)
        await follower.shipper.ship_once()
        first = await reader.read(max_age_s=5.0)
        again = await reader.read(max_age_s=5.0)
        after_two_reads = reader.decodes
        clock.now_ns += 10**8
        await follower.shipper.ship_once()  # a newer aggregate lands
        prefetch = asyncio.create_task(
            reader.prefetch_forever(every_s=lambda: 0.01, max_age_s=lambda: 5.0, busy=lambda: False)
        )
        while reader.decodes == after_two_reads:
            await asyncio.sleep(0.01)
        prefetched = reader.decodes
        newer = await reader.read(max_age_s=5.0)
        prefetch.cancel()
        await asyncio.gather(prefetch, return_exceptions=True)
        return first, again, after_two_reads, prefetched, reader.decodes, newer

    first, again, after_two_reads, prefetched, decodes, newer = asyncio.run(scenario())
    assert after_two_reads == 1, "the same row is not decoded again"
    assert again.nodes.keys() == first.nodes.keys() == {"node-c"}
    assert prefetched == 2 and decodes == 2, "the newer row was decoded between reads, and only then"
    assert newer.replicas == ("ctl-b",) and newer.nodes.keys() == {"node-c"}


def test_a_damaged_aggregate_is_refused_and_the_others_still_count(replicas):
    leader_side, follower, clock = replicas
    store = leader_side.fleet.store

    async def scenario():
        await _node(follower.ingest, "node-c", 600.0, clock)
        await follower.shipper.ship_once()
        await leader_side.ingest.store_calls.run_in_store(
            lambda: store.publish("ctl-z", built_unix_ns=clock.now_ns, format_version=99, payload=b"\x00garbage")
        )
        return await leader_side.fleet.read(max_age_s=5.0)

    merged = asyncio.run(scenario())
    assert merged.replicas == ("ctl-b",) and set(merged.nodes) == {"node-c"}


def test_the_leaders_sweep_takes_an_idle_node_on_the_follower_and_leaves_a_busy_one(replicas):
    """Idleness from the follower's aggregate; the sweep's validation goes to the node through the outbox."""
    leader_side, follower, clock = replicas
    remediation = leader_side.remediation
    assert remediation is not None

    async def scenario():
        await _node(follower.ingest, "node-idle", 60.0, clock)  # under 30 % of its 700 W limit
        await _node(follower.ingest, "node-busy", 600.0, clock)
        await _node(leader_side.ingest, "node-here", 50.0, clock)
        await follower.shipper.ship_once()
        await remediation.start()
        try:
            swept = await remediation.sweep_once()
        finally:
            await remediation.stop()
        commands = await leader_side.ingest.store_calls.run_in_store(remediation.store.commands)
        return swept, commands

    swept, commands = asyncio.run(scenario())
    assert sorted(swept) == ["node-here", "node-idle"]
    assert {c.node_id for c in commands if c.kind == "run_validation"} == {"node-here", "node-idle"}


def test_a_replica_that_does_not_lead_says_where_the_power_loop_runs(replicas):
    """Not the "not started" of a lone controller, nor, once deposed, its last picture gone stale."""
    leader_side, _follower, clock = replicas

    async def scenario():
        loop = power_loop.PowerLoop(leader_side.ingest, power_loop.PowerSettings.from_mapping(POWER), clock=clock,
                                    remote=leader_side.fleet)  # fmt: skip
        following = loop.status.reason
        await loop.start()
        await loop.step()
        leading = loop.status.reason
        await loop.stop()
        return following, leading, loop.status.reason

    following, leading, deposed = asyncio.run(scenario())
    assert following == deposed == power_loop.NOT_LEADING
    assert leading != power_loop.NOT_LEADING


def test_a_cap_results_read_back_is_the_gpus_newest_limit_and_slew_target(replicas):
    """The agent's read-back after a SetPowerCap replaces the limit in the GPU's reading, the rest kept."""
    leader_side, _follower, clock = replicas
    ingest = leader_side.ingest

    async def scenario():
        await _node(ingest, "node-a", 400.0, clock)
        before = ingest.latest["node-a-g0"]
        read_back = msgs.EnforcedLimit("node-a-g0", 500, slew_target_w=600)
        result = msgs.AgentResult("cap-1", msgs.Outcome.SUCCEEDED, finished_unix_ns=clock.now_ns,
                                  enforced_limits=(read_back,))  # fmt: skip
        ingest.on_result(ingest.sessions["node-a"], result)
        await asyncio.gather(*ingest.result_tasks(), return_exceptions=True)
        return before, ingest.latest["node-a-g0"]

    before, after = asyncio.run(scenario())
    assert type(after) is fleet.GpuLatest
    assert after == before._replace(
        enforced_power_limit_w=500, power_limit_slew_target_w=600, counters_unix_ns=clock.now_ns
    )


def test_a_period_that_starts_waits_for_one_prefetched_decode_at_most_and_decodes_the_rest(replicas):
    """The prefetch decodes on the event loop a row at a time and stops once a period runs (busy):
    a period's read never waits behind a whole round of decodes, and decodes what is left itself."""
    leader_side, follower, clock = replicas
    reader = leader_side.fleet
    store = reader.store

    async def scenario():
        await _node(follower.ingest, "node-c", 600.0, clock)
        shipped = await follower.shipper.ship_once()
        other = aggregates.encode(dataclasses.replace(shipped, replica_id="ctl-z"))
        await leader_side.ingest.store_calls.run_in_store(
            lambda: store.publish("ctl-z", built_unix_ns=clock.now_ns, format_version=3, payload=other)
        )
        prefetch = asyncio.create_task(  # a period starts once the first row is decoded
            reader.prefetch_forever(every_s=lambda: 0.01, max_age_s=lambda: 5.0, busy=lambda: reader.decodes >= 1)
        )
        while reader.decodes == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # a few more rounds of the prefetch: it keeps out of the period's way
        prefetched = reader.decodes
        merged = await reader.read(max_age_s=5.0)
        prefetch.cancel()
        await asyncio.gather(prefetch, return_exceptions=True)
        return prefetched, reader.decodes, merged

    prefetched, decodes, merged = asyncio.run(scenario())
    assert prefetched == 1, "the prefetch stopped after the row it was decoding"
    assert decodes == 2 and merged.replicas == ("ctl-b", "ctl-z"), "the period's read decoded the other"


def test_the_prefetch_decodes_only_in_the_half_period_before_the_next(replicas):
    """A row landing earlier is superseded before a period reads it: decoding it was half the leader's decodes."""
    leader_side, follower, clock = replicas
    reader = leader_side.fleet
    due = [False]

    async def scenario():
        await _node(follower.ingest, "node-c", 600.0, clock)
        await follower.shipper.ship_once()
        prefetch = asyncio.create_task(
            reader.prefetch_forever(every_s=lambda: 0.01, max_age_s=lambda: 5.0, busy=lambda: False, due=lambda: due[0])
        )
        await asyncio.sleep(0.1)
        early = reader.decodes
        due[0] = True
        while reader.decodes == early:
            await asyncio.sleep(0.01)
        prefetch.cancel()
        await asyncio.gather(prefetch, return_exceptions=True)
        return early, reader.decodes

    early, due_decodes = asyncio.run(scenario())
    assert early == 0 and due_decodes == 1
