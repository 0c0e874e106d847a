"""Ingest.register_hello and take_events: calls that arrive together are written in one store transaction."""

from __future__ import annotations

import asyncio
import time

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy import event as sa_event

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller.core import fleet
from rasd.controller.ingest import consumer as consumer_mod
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.ingest import streams as streams_mod
from rasd.controller.observability import metrics
from rasd.controller.store import repo
from rasd.controller.store import thread as store_thread
from rasd.controller.wire import agent as wire


def _hello(n: int, *, gpu_node: str | None = None) -> fleet.NodeHello:
    node_id = f"node-{n}"
    gpu = fleet.GpuRecord(
        f"GPU-00000000-0000-4000-8000-{n:012d}", "H100", "00000000:18:00.0", 200, 700, 700, node_id=gpu_node or node_id
    )
    return fleet.NodeHello(node_id, "boot-1", "0.1.0", node_id, "simulated", {"rack": "r1"}, (gpu,), 0)


class _HandedOver(consumer_mod.StoreOnly):
    """The consumer of a replica without remediation, noting what it would hand on to be decided (the new events)."""

    def __init__(self, event_log: consumer_mod.EventLog) -> None:
        super().__init__(event_log)
        self.fresh: list[tuple[str, list[int]]] = []

    async def events(self, batch: consumer_mod.EventBatch) -> consumer_mod.TakenEvents:
        taken = await super().events(batch)
        if taken.fresh:
            self.fresh.append((batch.node_id, [e.seq for e in taken.fresh]))
        return taken


@pytest.fixture
def rig(tmp_path):
    store = repo.Store.open(f"sqlite:///{tmp_path / 'rasd.db'}")
    commits: list[int] = []
    sa_event.listen(store.engine, "commit", lambda _conn: commits.append(1))
    thread = store_thread.StoreThread()
    controller_metrics = metrics.ControllerMetrics(CollectorRegistry())
    consumer = _HandedOver(consumer_mod.EventLog(store, thread, controller_metrics))
    ingest = ingest_mod.Ingest(
        store, thread, streams_mod.AgentStreams(clock=time.time_ns), controller_metrics, consumer
    )
    yield store, ingest, commits
    thread.close()
    store.close()


async def _take(ingest: ingest_mod.Ingest, session: ingest_mod.Session, batch: agent_pb.HealthEventBatch) -> None:
    """A batch as the stream hands it over (`rpc.agent_service.deliver`)."""
    events = wire.events_from_wire(
        batch, session.known_gpus, ingest.clock(), session.node_id, spool_epoch=session.spool_epoch
    )
    await ingest.take_events(session, events, started=time.perf_counter())


def test_a_storm_of_hellos_is_registered_in_few_transactions(rig):
    store, ingest, commits = rig

    async def storm():
        return await asyncio.gather(*(ingest.register_hello(_hello(n), 1_000 + n) for n in range(200)))

    outcomes = asyncio.run(storm())
    assert outcomes == [repo.HelloOutcome(acked_seq=0, spool_reset=False, rebooted=False)] * 200
    assert len(store.list_nodes()) == 200
    assert len(commits) <= 3  # the first Hello alone, then the rest together (at most 256 a group)


def test_a_hello_the_store_refuses_fails_alone(rig):
    store, ingest, _commits = rig
    # A GPU row naming a node that does not exist: the foreign key refuses it, and with it the group.
    ghost = _hello(7, gpu_node="node-that-never-said-hello")

    async def storm():
        return await asyncio.gather(
            *(ingest.register_hello(h, 1_000) for h in [_hello(1), _hello(2), ghost, _hello(3)]),
            return_exceptions=True,
        )

    first, second, refused, fourth = asyncio.run(storm())
    assert isinstance(refused, sa.exc.IntegrityError)
    assert all(isinstance(o, repo.HelloOutcome) for o in (first, second, fourth))
    assert sorted(n.node_id for n in store.list_nodes()) == ["node-1", "node-2", "node-3"]


def _events(*seqs: int) -> agent_pb.HealthEventBatch:
    return agent_pb.HealthEventBatch(
        events=[
            health_pb.HealthEvent(seq=seq, observed_unix_ns=1_000 + seq, kind=health_pb.EVENT_KIND_XID, xid=13)
            for seq in seqs
        ]
    )


def _acks(session: ingest_mod.Session) -> list[int]:
    acks = []
    while not session.outbound.empty():
        message = session.outbound.get_nowait()
        if message is not None and message.HasField("ack"):
            acks.append(message.ack.acked_seq)
    return acks


def test_a_burst_of_event_batches_is_stored_in_few_transactions_and_each_acked(rig):
    """One batch per stream, all at once (a burst): grouped into few commits, each stream acked its own."""
    store, ingest, commits = rig
    hooked = ingest.consumer.fresh

    async def burst():
        sessions = []
        for n in range(300):
            hello = wire.hello_from_wire(agent_pb.Hello(node_id=f"node-{n}", boot_id="boot-1", gpus=[_gpu_info(n)]))
            session, _welcome = await ingest.open_session(hello)
            sessions.append(session)
        commits.clear()
        await asyncio.gather(*(_take(ingest, s, _events(1, 2)) for s in sessions))
        # A resend of what was acked stores nothing and is acked again at the same position.
        await asyncio.gather(*(_take(ingest, s, _events(2)) for s in sessions[:10]))
        return sessions

    sessions = asyncio.run(burst())
    assert len(commits) <= 4  # the first batch alone, the rest at most 512 a group, then the resends
    assert [_acks(s) for s in sessions] == [[2, 2]] * 10 + [[2]] * 290
    assert store.count_events() == 600
    assert ingest.events_stored == 600
    assert sorted(hooked) == sorted((f"node-{n}", [1, 2]) for n in range(300))


def _gpu_info(n: int) -> health_pb.GpuInfo:
    return health_pb.GpuInfo(
        uuid=f"GPU-00000000-0000-4000-8000-{n:012d}", model="H100", power_limit_min_w=200, power_limit_max_w=700
    )


def test_a_stream_of_a_spool_the_node_has_left_stores_nothing_and_the_new_spools_events_are_kept(rig):
    """The node's agent came back with a new spool (another spool id) while its old stream still sent."""
    store, ingest, _commits = rig

    async def scenario():
        hello = agent_pb.Hello(node_id="node-1", boot_id="boot-1", gpus=[_gpu_info(1)], spool_id="spool-a")
        old, _welcome = await ingest.open_session(wire.hello_from_wire(hello))
        await _take(ingest, old, _events(1, 2))
        hello.spool_id = "spool-b"
        new, _welcome = await ingest.open_session(wire.hello_from_wire(hello))
        assert (old.spool_epoch, new.spool_epoch) == (0, 1)
        with pytest.raises(repo.SpoolEpochChanged):
            await _take(ingest, old, _events(3))
        await _take(ingest, new, _events(1, 2, 3))
        return _acks(old), _acks(new)

    old_acks, new_acks = asyncio.run(scenario())
    assert old_acks == [2], "the old stream's late batch was not acked"
    assert new_acks == [3]
    assert store.count_events() == 5, "the old spool's 1-2 and the new spool's 1-3; nothing of the late batch"


def test_the_latest_telemetry_is_flushed_in_chunks_that_an_event_batch_can_pass(rig, monkeypatch):
    """Every dirty GPU is written, a chunk a store call; an event batch that arrives meanwhile waits one chunk.

    At 2,048 nodes one transaction of every GPU's row held the store thread (and every ack behind
    it) for about 0.9 s.
    """
    store, ingest, _commits = rig
    monkeypatch.setattr(ingest_mod, "FLUSH_CHUNK", 2)
    statements: list[str] = []
    sa_event.listen(
        store.engine, "before_cursor_execute", lambda _c, _cur, sql, *_rest: statements.append(sql.split()[0:3])
    )

    async def scenario():
        sessions = []
        for n in range(6):
            hello = wire.hello_from_wire(agent_pb.Hello(node_id=f"node-{n}", boot_id="boot-1", gpus=[_gpu_info(n)]))
            session, _welcome = await ingest.open_session(hello)
            sessions.append(session)
            ingest._dirty[_gpu_info(n).uuid] = fleet.GpuLatest(power_w=100.0 + n, power_sample_unix_ns=5)
        statements.clear()
        flushing = asyncio.create_task(ingest.flush())
        await asyncio.sleep(0)  # the first chunk is on the store thread
        await _take(ingest, sessions[0], _events(1))
        await flushing
        return sessions

    asyncio.run(scenario())
    gpu_writes = [i for i, words in enumerate(statements) if words[:2] == ["UPDATE", "gpus"]]
    event_writes = [i for i, words in enumerate(statements) if words[:2] == ["INSERT", "INTO"] and "events" in words[2]]
    assert len(gpu_writes) == 3, statements  # 6 GPUs, 2 a chunk
    assert event_writes and gpu_writes[0] < event_writes[0] < gpu_writes[-1], statements
    stored = {g.record.uuid: g.latest.power_w for node in store.list_nodes() for g in node.gpus}
    assert stored == {_gpu_info(n).uuid: 100.0 + n for n in range(6)}
