"""Health events ahead of telemetry (`rasd.controller.ingest.priority`): a fault's batch never waits behind summaries.

At 2,048 nodes a second's summaries and the latest view's flush sat in front of every step of a
fault's batch on the one event loop and the one store thread (receive → ack 264 ms on average).
"""

from __future__ import annotations

import array
import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import event as sa_event

from rasd.agent import wire as agent_wire
from rasd.agent.core import model
from rasd.agent.core import summary as core_summary
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller.core import fleet
from rasd.controller.ingest import consumer as consumer_mod
from rasd.controller.ingest import priority
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.ingest import streams as streams_mod
from rasd.controller.observability import metrics
from rasd.controller.rpc import agent_service, validate_input
from rasd.controller.store import repo
from rasd.controller.store import thread as store_thread
from rasd.controller.wire import agent as wire

T0 = 1_800_000_000 * 10**9
MS = 1_000_000


def _gpu(n: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{n:012d}"


@pytest.fixture
def rig(tmp_path):
    store = repo.Store.open(f"sqlite:///{tmp_path / 'rasd.db'}")
    thread = store_thread.StoreThread()
    controller_metrics = metrics.ControllerMetrics(CollectorRegistry())
    consumer = consumer_mod.StoreOnly(consumer_mod.EventLog(store, thread, controller_metrics))
    ingest = ingest_mod.Ingest(
        store, thread, streams_mod.AgentStreams(clock=time.time_ns), controller_metrics, consumer
    )
    yield store, ingest
    thread.close()
    store.close()


async def _open(ingest: ingest_mod.Ingest, n: int) -> ingest_mod.Session:
    gpu = health_pb.GpuInfo(uuid=_gpu(n), model="H100", power_limit_min_w=200, power_limit_max_w=700)
    hello = agent_pb.Hello(node_id=f"node-{n}", boot_id="boot-1", gpus=[gpu])
    session, _welcome = await ingest.open_session(wire.hello_from_wire(hello))
    return session


def _summary(n: int, second: int) -> agent_pb.AgentMessage:
    """Node n's summary of its one GPU's second `second` (draw 300 + second W)."""
    start = T0 + second * 1000 * MS
    times = array.array("q", [start + (50 + 100 * i) * MS for i in range(10)])
    samples = model.PowerSamples(_gpu(n), times, array.array("d", [300.0 + second] * 10))
    power = core_summary.summarize(
        [samples], carry=core_summary.GridCarry(), interval_ms=100, until_unix_ns=start + 1000 * MS
    )
    counters = model.GpuCounters(gpu_uuid=_gpu(n), sample_unix_ns=start + 900 * MS, enforced_power_limit_w=500)
    return agent_wire.summary(power, {_gpu(n): counters}, [counters], (_gpu(n),))


async def _deliver(ingest: ingest_mod.Ingest, session: ingest_mod.Session, message: agent_pb.AgentMessage) -> None:
    """A message as its stream hands it over (`rpc.agent_service.deliver`)."""
    identity = validate_input.StreamIdentity(node_id=None, gpu_owners=ingest.gpu_nodes)
    await agent_service.deliver(ingest, session, message, identity, validate_input.InputLimits())


def _fault(seq: int) -> agent_pb.AgentMessage:
    event = health_pb.HealthEvent(seq=seq, observed_unix_ns=T0, kind=health_pb.EVENT_KIND_XID, xid=79)
    return agent_pb.AgentMessage(events=agent_pb.HealthEventBatch(events=[event]))


class _SeesAcks(asyncio.Queue):
    """A stream's outbound queue that notes, as each ack is queued, which GPUs the latest view holds."""

    def __init__(self, latest: dict[str, fleet.GpuLatest]) -> None:
        super().__init__()
        self.latest = latest
        self.at_ack: list[set[str]] = []

    def _put(self, item):  # asyncio.Queue's one place every put lands
        if item is not None and item.HasField("ack"):
            self.at_ack.append(set(self.latest))
        super()._put(item)


def test_a_fault_batch_overtakes_the_summaries_read_before_it(rig):
    """Summaries of 50 nodes are read, then a fault's batch: it is acked before any of them is absorbed.

    Before, each summary was absorbed as its stream read it, so they all went ahead of the batch.
    """
    _store, ingest = rig

    async def scenario():
        await ingest.start()
        faulty = await _open(ingest, 0)
        others = [await _open(ingest, n) for n in range(1, 51)]
        faulty.outbound = outbound = _SeesAcks(ingest.latest)
        for session in others:
            await _deliver(ingest, session, _summary(int(session.node_id.split("-")[1]), 0))
        await _deliver(ingest, faulty, _fault(1))
        await asyncio.sleep(0.05)  # the absorber's turn, now that no batch is in flight
        absorbed = set(ingest.latest)
        await ingest.stop()
        return outbound.at_ack, absorbed

    at_ack, absorbed = asyncio.run(scenario())
    assert at_ack == [set()], "a summary read before the fault's batch was absorbed ahead of it"
    assert absorbed == {_gpu(n) for n in range(1, 51)}, "every summary is absorbed once the batch is through"


def test_the_flush_starts_no_chunk_while_a_fault_batch_is_in_flight(rig, monkeypatch):
    """The latest view's flush waits for the batch in flight; the batch's insert goes first."""
    store, ingest = rig
    monkeypatch.setattr(ingest_mod, "FLUSH_CHUNK", 2)
    statements: list[list[str]] = []
    sa_event.listen(
        store.engine, "before_cursor_execute", lambda _c, _cur, sql, *_r: statements.append(sql.split()[:3])
    )

    async def scenario():
        sessions = [await _open(ingest, n) for n in range(6)]
        for n in range(6):
            ingest._dirty[_gpu(n)] = fleet.GpuLatest(power_w=100.0 + n, power_sample_unix_ns=5)
        statements.clear()
        taking = asyncio.create_task(_deliver(ingest, sessions[0], _fault(1)))
        await asyncio.sleep(0)  # the batch is in flight
        await asyncio.gather(ingest.flush(), taking)

    asyncio.run(scenario())
    gpu_writes = [i for i, words in enumerate(statements) if words[:2] == ["UPDATE", "gpus"]]
    event_writes = [i for i, words in enumerate(statements) if words[:2] == ["INSERT", "INTO"] and "events" in words[2]]
    assert gpu_writes and event_writes
    assert max(event_writes) < min(gpu_writes), "a flush chunk went to the store thread ahead of the fault's batch"


def test_a_node_with_four_summaries_waiting_has_its_oldest_absorbed_at_once_and_none_is_lost(rig):
    """Under pressure a node's summaries are not dropped: the fifth pushes the oldest in, counted."""
    _store, ingest = rig

    async def scenario():
        await ingest.start()
        session = await _open(ingest, 0)
        with ingest.events_first.event_batch():  # a batch in flight all along: nothing is absorbed on its turn
            for second in range(6):
                await _deliver(ingest, session, _summary(0, second))
            at_once = ingest.latest[_gpu(0)].power_w
        await ingest.stop()
        return at_once, ingest.latest[_gpu(0)]

    at_once, final = asyncio.run(scenario())
    assert at_once == 301.0, "the fifth and sixth summaries pushed seconds 0 and 1 in, in order"
    assert ingest.metrics.summaries_absorbed_at_once._value.get() == 2
    assert final.power_w == 305.0 and final.power_sample_unix_ns > T0 + 5000 * MS
    assert ingest.samples_ingested == 60, "every summary's samples were absorbed"


def test_telemetry_waits_for_event_batches_a_bounded_time():
    """A storm of batches cannot starve the power loop's view: the turn comes after max_wait_s."""
    first = priority.EventsFirst(max_wait_s=0.05)

    async def scenario():
        with first.event_batch():
            started = time.perf_counter()
            await first.telemetry_turn()
            waited_s = time.perf_counter() - started
        await first.telemetry_turn()  # none in flight: at once
        return waited_s

    waited_s = asyncio.run(scenario())
    assert 0.04 <= waited_s < 1.0
    assert first.overdue_turns == 1 and first.in_flight == 0


def test_pending_summaries_keep_each_nodes_order_and_refuse_a_zero_bound():
    pending: priority.PendingSummaries[int] = priority.PendingSummaries(per_node=2)
    assert [pending.put("a", 1), pending.put("b", 10), pending.put("a", 2), pending.put("a", 3)] == [
        None,
        None,
        None,
        1,
    ]
    assert len(pending) == 3 and pending.ready.is_set()
    assert pending.take(1) == [2, 3]
    assert pending.take(5) == [10] and len(pending) == 0 and not pending.ready.is_set()
    with pytest.raises(ValueError, match="per_node"):
        priority.PendingSummaries(per_node=0)


def test_a_flush_that_fails_midway_keeps_every_row_not_written_for_the_next(rig, monkeypatch):
    """Chunks are cut as their turn comes; a refused chunk and those after it wait for the next flush."""
    store, ingest = rig
    monkeypatch.setattr(ingest_mod, "FLUSH_CHUNK", 2)
    written: list[list[str]] = []
    save_latest = store.save_latest

    def refuses_the_second(latest):
        if len(written) == 1:
            written.append([])
            raise OSError("store gone")
        written.append(sorted(latest))
        save_latest(latest)

    monkeypatch.setattr(store, "save_latest", refuses_the_second)

    async def scenario():
        for n in range(5):
            await _open(ingest, n)
            ingest._dirty[_gpu(n)] = fleet.GpuLatest(power_w=100.0 + n, power_sample_unix_ns=5)
        with pytest.raises(OSError, match="store gone"):
            await ingest.flush()
        kept = sorted(ingest._dirty)
        await ingest.flush()
        return kept

    kept = asyncio.run(scenario())
    assert written[0] == [_gpu(0), _gpu(1)]
    assert kept == [_gpu(n) for n in range(2, 5)], "the refused chunk and the one after it were dropped"
    assert sorted(uuid for chunk in written[2:] for uuid in chunk) == kept
    assert {gpu.record.uuid: gpu.latest.power_w for node in store.list_nodes() for gpu in node.gpus} == {
        _gpu(n): 100.0 + n for n in range(5)
    }
