"""New events are stored in the transaction of the decision on them (`EventBatch.append`, one hand-over).

One sync of the disk for both instead of one each. The stream's acked position says which events
are new before any store has said so; the transaction checks it, and whatever it got wrong (a
resend, an event another stream stored first, a spool the node has left) is refused whole and
stored the old way, so no event is lost, decided twice, or acked before it is durable.
"""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
import structlog
from prometheus_client import CollectorRegistry
from sqlalchemy import event as sa_event

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller import wiring
from rasd.controller.core.remediation import actions
from rasd.controller.core.remediation import events as health
from rasd.controller.ingest import service as ingest_mod
from rasd.controller.observability import metrics
from rasd.controller.remediation import service as remediation_mod
from rasd.controller.store import repo
from rasd.controller.store import writer as store_writer
from rasd.controller.wire import agent as wire

NOW_NS = 1_800_000_000 * 10**9
GPUS = [f"GPU-00000000-0000-4000-8000-00000000000{i}" for i in range(4)]


class _Sent:
    """Where the ladder's agent commands go: the test keeps their ids (every node counts as reachable)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def send(self, action: actions.Action, *, deadline_unix_ns: int | None = None) -> bool:
        self.ids.append(action.command_id)
        return True

    async def validate(self, node_id, run, *, timeout_s):
        raise LookupError(node_id)

    async def reachable(self, node_id: str) -> bool:
        return True


class _Rig:
    """A store, an ingest and a remediation service wired as rasd-controller wires them (one replica)."""

    def __init__(self, url: str, *, writer: bool = False) -> None:
        self.url = url
        self.store = repo.Store.open(url)
        self.commits = 0
        sa_event.listen(self.store.engine, "commit", self._count)
        self.writer = store_writer.CommitProcess(url) if writer else None
        self.outlet = _Sent()
        self.wired = wiring.single_replica(
            self.store,
            metrics.ControllerMetrics(CollectorRegistry()),
            ladder=wiring.Ladder(writer=self.writer, outlet=self.outlet),
            clock=lambda: NOW_NS,
        )
        self.ingest = self.wired.ingest
        self.service = self.wired.remediation
        self.sent = self.outlet.ids

    def _count(self, _conn: sa.Connection) -> None:
        self.commits += 1

    async def start(self) -> None:
        await self.ingest.start()
        await self.service.start()

    async def stop(self) -> None:
        await self.wired.stop()
        if self.writer is not None:
            self.writer.close()
        self.store.close()

    async def connect(self, node_id: str, *, spool_id: str = "spool-a") -> ingest_mod.Session:
        hello = agent_pb.Hello(
            node_id=node_id,
            boot_id="boot-1",
            spool_id=spool_id,
            gpus=[health_pb.GpuInfo(uuid=g, model="H100", power_limit_min_w=200, power_limit_max_w=700) for g in GPUS],
        )
        session, _welcome = await self.ingest.open_session(wire.hello_from_wire(hello))
        return session

    async def take(self, session: ingest_mod.Session, batch: agent_pb.HealthEventBatch) -> None:
        """The batch as the stream hands it over (`rpc.agent_service.deliver`)."""
        events = wire.events_from_wire(
            batch, session.known_gpus, NOW_NS, session.node_id, spool_epoch=session.spool_epoch
        )
        await self.ingest.take_events(session, events, started=0.0)

    def decided_seqs(self, node_id: str) -> list[int]:
        """The events of node_id that led to a command, by the GPU each command names (one Xid 13 per GPU)."""
        commands = self.service.store.commands(limit=10_000)
        return sorted(GPUS.index(c.gpu_uuid) + 1 for c in commands if c.node_id == node_id and c.gpu_uuid)

    def stored_seqs(self, node_id: str) -> list[int]:
        return sorted(e.seq for e in self.store.list_events(node_id=node_id, limit=10_000))


def _xids(*seqs: int) -> agent_pb.HealthEventBatch:
    """Xid 13 (a process restart) on GPU seq-1: each event is its own fault, so each is decided once or not."""
    return agent_pb.HealthEventBatch(
        events=[
            health_pb.HealthEvent(
                seq=seq,
                observed_unix_ns=NOW_NS - 10**6,
                kind=health_pb.EVENT_KIND_XID,
                severity=health_pb.SEVERITY_ERROR,
                gpu_uuid=GPUS[seq - 1],
                xid=13,
                message="NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception",
            )
            for seq in seqs
        ]
    )


def _stored(node_id: str, seq: int) -> repo.StoredEvent:
    return repo.StoredEvent(
        node_id=node_id, seq=seq, observed_unix_ns=NOW_NS - 10**6, received_unix_ns=NOW_NS,
        kind=int(health.EventKind.XID), severity=int(health.Severity.ERROR), gpu_uuid=GPUS[seq - 1], xid=13,
        message="NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception", source="kmsg", attributes={}, spool_epoch=0,
    )  # fmt: skip


def _acks(session: ingest_mod.Session) -> list[int]:
    acks = []
    while not session.outbound.empty():
        message = session.outbound.get_nowait()
        if message is not None and message.HasField("ack"):
            acks.append(message.ack.acked_seq)
    return acks


@pytest.fixture
def rig(store_url):
    return _Rig(store_url)


def test_events_in_order_are_stored_and_decided_in_one_transaction_then_acked(rig):
    async def run() -> None:
        await rig.start()
        try:
            session = await rig.connect("node-1")
            before = rig.commits
            await rig.take(session, _xids(1, 2))
            assert rig.commits - before == 1, "the events and the decision on them: one commit"
            assert rig.stored_seqs("node-1") == [1, 2]
            assert rig.decided_seqs("node-1") == [1, 2]
            assert _acks(session) == [2]
            assert len(rig.sent) == 2, "each restart dispatched once its decision was durable"
            assert (rig.ingest.events_stored, rig.ingest.events_stored_with_decision) == (2, 2)
            assert rig.service.store.unprocessed_events() == {}, "the replay watermark moved in the same commit"
            # The next batch of the same stream goes the same way.
            await rig.take(session, _xids(3))
            assert rig.commits - before == 2
            assert rig.decided_seqs("node-1") == [1, 2, 3]
            assert _acks(session) == [3]
        finally:
            await rig.stop()

    asyncio.run(run())


def test_a_resend_of_acked_events_is_neither_stored_nor_decided_again(rig):
    """The agent lost the ack and sends again: the stream's position says they are not new."""

    async def run() -> None:
        await rig.start()
        try:
            session = await rig.connect("node-1")
            await rig.take(session, _xids(1, 2))
            commands = rig.service.store.commands()
            await rig.take(session, _xids(2))
            assert _acks(session) == [2, 2]
            assert rig.service.store.commands() == commands, "nothing decided again"
            assert rig.stored_seqs("node-1") == [1, 2]
            assert rig.ingest.events_stored_with_decision == 2
        finally:
            await rig.stop()

    asyncio.run(run())


def test_events_another_stream_stored_first_refuse_the_decision_which_is_taken_again_on_the_new_ones(rig):
    """The stream takes 1 and 2 for new, but 1 is stored already (by the node's other stream, to another
    replica): the transaction that would have decided both is refused whole, then 2 alone is stored and
    decided; 1 is decided by whoever stored it, never twice."""

    async def run() -> None:
        await rig.start()
        try:
            session = await rig.connect("node-1")
            assert rig.store.append_events("node-1", [_stored("node-1", 1)]) == (1, [1])
            before = rig.commits
            await rig.take(session, _xids(1, 2))
            assert rig.decided_seqs("node-1") == [2], "only the event that was new is decided here"
            assert rig.stored_seqs("node-1") == [1, 2]
            assert _acks(session) == [2]
            assert rig.ingest.events_stored_with_decision == 0
            assert rig.commits - before == 2, "refused, nothing committed; then the events, then the decision"
            # The stream's position is the store's again: the next event goes with its decision.
            await rig.take(session, _xids(3))
            assert rig.decided_seqs("node-1") == [2, 3]
            assert rig.ingest.events_stored_with_decision == 1
        finally:
            await rig.stop()

    asyncio.run(run())


def test_a_stream_of_a_spool_the_node_has_left_stores_and_decides_nothing(rig):
    async def run() -> None:
        await rig.start()
        try:
            old = await rig.connect("node-1", spool_id="spool-a")
            await rig.take(old, _xids(1))
            new = await rig.connect("node-1", spool_id="spool-b")
            with pytest.raises(repo.SpoolEpochChanged):
                await rig.take(old, _xids(2))
            assert rig.decided_seqs("node-1") == [1]
            await rig.take(new, _xids(1, 2, 3))
            assert _acks(new) == [3]
            # The new spool's 1 is a new event on GPU 0 again: its Xid 13 repeats within the window.
            assert sorted(e.seq for e in rig.store.list_events(node_id="node-1", limit=100)) == [1, 1, 2, 3]
            assert rig.service.store.unprocessed_events() == {}
        finally:
            await rig.stop()

    asyncio.run(run())


def test_a_burst_of_streams_is_stored_with_its_decisions_in_few_transactions(rig):
    async def run() -> None:
        await rig.start()
        try:
            sessions = [await rig.connect(f"node-{n}") for n in range(100)]
            before = rig.commits
            await asyncio.gather(*(rig.take(s, _xids(1, 2)) for s in sessions))
            assert rig.commits - before <= 4, "grouped: the first call's pass, then the rest together"
            assert [_acks(s) for s in sessions] == [[2]] * 100
            assert rig.ingest.events_stored_with_decision == 200
            assert rig.store.count_events() == 200
            assert len(rig.sent) == 200
            assert rig.service.store.unprocessed_events() == {}
        finally:
            await rig.stop()

    asyncio.run(run())


def test_events_are_stored_with_their_decision_by_the_writer_process(tmp_path):
    """rasd-controller's default: the commit runs in a child process, which stores the events too."""
    rig = _Rig(f"sqlite:///{tmp_path / 'rasd.db'}", writer=True)

    async def run() -> None:
        await rig.start()
        try:
            session = await rig.connect("node-1")
            await rig.take(session, _xids(1, 2))
            assert rig.stored_seqs("node-1") == [1, 2]
            assert rig.decided_seqs("node-1") == [1, 2]
            assert _acks(session) == [2]
            assert rig.ingest.events_stored_with_decision == 2
            # Refused in the child (1 stored first elsewhere): nothing of it written, 2 decided once.
            other = await rig.connect("node-2")
            rig.store.append_events("node-2", [_stored("node-2", 1)])
            await rig.take(other, _xids(1, 2))
            assert rig.decided_seqs("node-2") == [2]
            assert rig.stored_seqs("node-2") == [1, 2]
        finally:
            await rig.stop()

    asyncio.run(run())


def test_events_that_arrive_after_the_term_ended_are_stored_acked_and_decided_by_the_next_term(rig):
    async def run() -> None:
        await rig.start()
        try:
            session = await rig.connect("node-1")
            await rig.service.stop()
            with pytest.raises(remediation_mod.TermEnded):
                await rig.take(session, _xids(1))
            assert rig.stored_seqs("node-1") == [1], "stored apart, not lost"
            assert _acks(session) == [1]
            assert rig.decided_seqs("node-1") == [], "no decision on an ended term's state"
            await rig.service.start()  # the next term replays what was stored and not decided
            assert rig.decided_seqs("node-1") == [1]
        finally:
            await rig.stop()

    asyncio.run(run())


def test_an_event_is_logged_as_received_before_the_decision_on_it_and_counted_once_stored(rig, debug_logs):
    """The log reads in causal order (the event at debug, then its decision at info), and a resend is not
    counted again."""

    async def run() -> list[tuple[str, str]]:
        await rig.start()
        try:
            session = await rig.connect("node-1")
            with structlog.testing.capture_logs() as logs:
                await rig.take(session, _xids(1))
                await rig.take(session, _xids(1))  # a resend
            return [
                (entry["event"], entry["log_level"])
                for entry in logs
                if entry["event"] in ("health_event_received", "remediation_decided")
            ]
        finally:
            await rig.stop()

    order = asyncio.run(run())
    assert order == [
        ("health_event_received", "debug"),
        ("remediation_decided", "info"),
        ("health_event_received", "debug"),
    ]
    counted = rig.ingest.metrics.registry.get_sample_value("rasd_health_events_total", {"kind": "EVENT_KIND_XID"})
    assert counted == 1.0
