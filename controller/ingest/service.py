"""The controller's ingest service: agent sessions, telemetry, durable events, commands.

Owns the in-memory fleet view of this replica (latest telemetry per GPU, the power window, open
sessions) and every write to the store. Store calls run on one dedicated writer thread: SQL writes
are serialized, and the asyncio loop that serves thousands of streams never blocks on I/O.

Event durability (DESIGN.md invariant 3): a batch of health events is written to the store, and
only after the transaction commits is the ack queued to the agent. A resend is de-duplicated by
(node, spool epoch, seq) in the same transaction. Where this replica decides, a batch that is the
next of its stream's spool is written in the transaction of the decision on it (`arrivals_hook`):
one sync of the disk for both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import structlog

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.common import VERSION
from rasd.controller.core import fleet
from rasd.controller.observability import metrics
from rasd.controller.store import repo
from rasd.controller.wire import agent as wire

log = structlog.get_logger("rasd.controller")

Clock = Callable[[], int]

OutcomeT = TypeVar("OutcomeT")

MAX_HELLO_GROUP = 256
"""Hellos registered in one store transaction at most (a reconnect storm is cut into such groups)."""

MAX_EVENT_GROUP = 512
"""Event batches (one per stream message) stored in one store transaction at most."""


class LabelsByNode(dict[str, dict[str, str]]):
    """Node id → its labels from its last Hello, with a count of changes.

    The budget's fleet view is rebuilt from these labels only when they changed; comparing 2,000
    nodes' labels on every decision pass cost more than a small pass's own decisions (~0.3 ms a
    pass). `version` moves with every write, so that check is one integer compare. Labels are
    replaced, never edited in place (a node's new Hello brings a new dict).
    """

    version: int = 0

    def __setitem__(self, node_id: str, labels: dict[str, str]) -> None:
        self.version += 1
        super().__setitem__(node_id, labels)

    def __delitem__(self, node_id: str) -> None:
        self.version += 1
        super().__delitem__(node_id)

    def __ior__(self, other: Any) -> LabelsByNode:  # type: ignore[override,misc]
        self.update(other)
        return self

    def pop(self, *args: Any) -> Any:
        """`dict.pop`, counted."""
        self.version += 1
        return super().pop(*args)

    def popitem(self) -> tuple[str, dict[str, str]]:
        """`dict.popitem`, counted."""
        self.version += 1
        return super().popitem()

    def clear(self) -> None:
        """`dict.clear`, counted."""
        self.version += 1
        super().clear()

    def update(self, *args: Any, **kwargs: dict[str, str]) -> None:
        """`dict.update`, counted."""
        self.version += 1
        super().update(*args, **kwargs)

    def setdefault(self, node_id: str, default: dict[str, str]) -> dict[str, str]:  # type: ignore[override]
        """`dict.setdefault`, counted."""
        self.version += 1
        return super().setdefault(node_id, default)


@dataclasses.dataclass(frozen=True)
class IngestSettings:
    """Pacing of the ingest and what agents are told in Welcome."""

    flush_interval_s: float = 5.0
    """How often the latest telemetry is written to the store. That copy serves other replicas and
    a restarted controller; this replica's own reads overlay its in-memory view, so a longer period
    costs nothing here, while at 2,000 nodes a 1 s period kept the store thread busy most of the time
    (bench/RESULTS.md, "Scale")."""
    outbound_queue_size: int = 1000
    """Commands and acks waiting for one agent before the stream is considered stuck."""
    power_window_span_s: float = 600.0
    """How much fleet power history is kept in memory."""
    power_stale_after_s: float = 10.0
    """A GPU whose last power sample is older than this shows an unknown draw."""
    agent_config: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: {
            "power_sample_interval_ms": 100,
            "counter_interval_ms": 1000,
            "telemetry_send_interval_ms": 1000,
            "heartbeat_interval_ms": 5000,
        }
    )
    """AgentConfig fields sent in Welcome."""
    mark_all_disconnected_at_start: bool = True
    """False with several replicas: the other replicas' streams stay open while this one starts."""


@dataclasses.dataclass(frozen=True)
class _PendingCommand:
    """A command sent to an agent whose result someone awaits."""

    node_id: str
    action: str
    future: asyncio.Future[commands_pb.ActionResult]


@dataclasses.dataclass(eq=False)
class Session:
    """One open agent stream."""

    session_id: str
    node_id: str
    known_gpus: frozenset[str]
    outbound: asyncio.Queue[agent_pb.ControllerMessage | None]
    opened_unix_ns: int
    replaced: bool = False
    spool_epoch: int | None = None
    """The epoch of the node's spool this stream's seqs count in (its Hello's `HelloOutcome.spool_epoch`)."""
    acked_seq: int | None = None
    """The node's acked position as this stream last heard it from the store (its Hello's, then each
    stored batch's): the seq its next new event has, if the agent sends in order."""
    agent_ahead_ns: int | None = None
    """How far the agent's clock runs ahead of this controller's at least, ns (negative: behind by at
    least that much); None until a stamped message arrived. Each agent stamp (a heartbeat's send
    time, a result's finish, the newest counters of a batch) was taken before the message arrived,
    so the clock offset is at least the stamp minus the arrival time; the largest such difference
    seen on this stream is the bound (`to_controller_ns`)."""

    def note_stamp(self, agent_unix_ns: int, received_unix_ns: int) -> None:
        """Tighten `agent_ahead_ns` with an agent stamp that arrived at received_unix_ns (controller clock)."""
        if agent_unix_ns > 0:
            ahead = agent_unix_ns - received_unix_ns
            if self.agent_ahead_ns is None or ahead > self.agent_ahead_ns:
                self.agent_ahead_ns = ahead

    def to_controller_ns(self, agent_unix_ns: int, received_unix_ns: int) -> int:
        """An agent stamp that arrived at received_unix_ns, in controller time; never later than its arrival.

        Later than the truth by at most the shortest transit seen on the stream (unless the agent's
        clock stepped forward since; still never past the arrival). Taken as it was, a stamp of an
        agent clock running ahead (2 h in the chaos tests) made a read-back taken before a power
        command arrived look newer than the command's deadline, and the power loop settled the
        command as expired before it landed (invariant 1). Too early is the safe side there: a
        command is only settled later.
        """
        corrected = agent_unix_ns - self.agent_ahead_ns if self.agent_ahead_ns is not None else agent_unix_ns
        return min(corrected, received_unix_ns)

    def stamp_agent_deadline(self, command: commands_pb.Command) -> None:
        """Give command its deadline on the agent's clock (``deadline_agent_unix_ns``), once the offset is bounded.

        The deadline plus the least the agent runs ahead: in real time never later than the
        controller's deadline. A read-back the power loop dates after the deadline (`to_controller_ns`)
        was then taken after the agent's clock passed it too, so a command not run by then never
        runs. Counted from its arrival instead (`runtime.on_local_clock` without it), a command
        delivered late ran after the loop had settled it as expired and given its watts away.
        """
        if command.deadline_unix_ns and self.agent_ahead_ns is not None:
            command.deadline_agent_unix_ns = command.deadline_unix_ns + self.agent_ahead_ns
        else:
            command.deadline_agent_unix_ns = 0


class Ingest:
    """Everything the controller does with what agents send, and the commands it sends them."""

    def __init__(
        self,
        store: repo.Store,
        controller_metrics: metrics.ControllerMetrics,
        settings: IngestSettings | None = None,
        *,
        clock: Clock = time.time_ns,
    ) -> None:
        """Bind to the store and metrics; call `start()` inside the event loop before serving."""
        self.store = store
        self.metrics = controller_metrics
        self.settings = settings or IngestSettings()
        self._clock = clock
        self._writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rasd-store")
        self.sessions: dict[str, Session] = {}
        self.latest: dict[str, fleet.GpuLatest] = {}
        self.latest_controller_ns: dict[str, int] = {}
        """GPU uuid → when its `latest` counters were sampled, in controller time (`Session.to_controller_ns`):
        what the power loop compares with its own clock. `latest` keeps the agent's stamps."""
        self.gpu_nodes: dict[str, str] = {}
        self.power_window = fleet.PowerWindow(span_s=self.settings.power_window_span_s)
        self._dirty: dict[str, fleet.GpuLatest] = {}
        self._last_seen: dict[str, int] = {}
        self._pending_results: dict[str, _PendingCommand] = {}
        self._hook_tasks: set[asyncio.Task[None]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._hellos: _GroupCommit[repo.HelloOutcome] = _GroupCommit(
            "rasd-hello-registrar", self._store, store.register_hellos, store.register_hello, MAX_HELLO_GROUP
        )
        self._event_batches: _GroupCommit[tuple[int, list[int]]] = _GroupCommit(
            "rasd-event-appender", self._store, store.append_events_many, store.append_events, MAX_EVENT_GROUP
        )
        self.samples_ingested = 0
        self.events_stored = 0
        self.node_labels: LabelsByNode = LabelsByNode()
        self._node_gpus: dict[str, tuple[str, ...]] = {}
        self.gpu_records: dict[str, fleet.GpuRecord] = {}
        """Each GPU's inventory record (power-limit constraints) from its node's last Hello."""
        self.boot_ids: dict[str, str] = {}
        """Each node's boot id from its last Hello (a new one means caps reset to default)."""
        self.events_hook: Callable[[str, list[repo.StoredEvent], Mapping[str, str]], Awaitable[None]] | None = None
        """Called with a node's newly stored events (after they are durable and acked)."""
        self.arrivals_hook: (
            Callable[
                [str, list[repo.StoredEvent], Mapping[str, str], repo.ExpectedAppend, Callable[[], None]],
                Awaitable[None],
            ]
            | None
        ) = None
        """Where set, takes a batch of events not yet stored that the stream says are new, and stores them
        with the decision on them, in one transaction (`RemediationService.on_arrivals`), calling back
        once they are durable; raises when they could not be stored so, and then they are stored
        here and go to `events_hook`."""
        self.events_stored_with_decision = 0
        """Of `events_stored`, those stored in the transaction of the decision on them (`arrivals_hook`)."""
        self.command_result_hook: Callable[[str, commands_pb.ActionResult], Awaitable[None]] | None = None
        """Called with results of commands sent by `dispatch` (not by `send_command`)."""
        self.connected_hook: Callable[[str], Awaitable[None]] | None = None
        """Called when a node's stream opens."""

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Mark every node disconnected (no stream is open yet), warm the event path up, start the flush loop."""
        if self.settings.mark_all_disconnected_at_start:
            await self._store(self.store.mark_all_disconnected)
        try:  # so that the first fault's event is stored without compiling; worth no failed start
            await self._store(self.store.warm_up_events)
        except repo.STORE_UNAVAILABLE as exc:
            log.warning("ingest_warm_up_skipped", error=str(exc))
        self._flusher = asyncio.create_task(self._flush_forever(), name="rasd-telemetry-flush")

    def end_sessions(self) -> None:
        """End every open agent stream (its agent reconnects, to another replica if there is one)."""
        for session in list(self.sessions.values()):
            session.outbound.put_nowait(None)

    async def stop(self) -> None:
        """End every session, flush, and stop the writer thread.

        The store thread is gone afterwards: stop the gRPC server first, or a call it still takes
        would find no store (the Controller does).
        """
        self.end_sessions()
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self.flush()
        self._writer.shutdown(wait=True)

    async def register_hello(self, node_hello: fleet.NodeHello, now_unix_ns: int) -> repo.HelloOutcome:
        """Register a Hello on the store thread, together with every other Hello waiting then.

        After a controller restart or a failover every agent reconnects at once; Hellos registered
        in groups cost ~0.35 ms a node on the store thread against ~1.5 ms one by one (2,000 agents in
        tests/chaos/test_reconnect_storm.py: all back in 8.6 s instead of 18.8 s), so agents are
        welcomed before their Welcome timeouts make them retry.
        """
        return await self._hellos.submit(node_hello, now_unix_ns)

    async def store_events(self, node_id: str, events: list[repo.StoredEvent]) -> tuple[int, list[int]]:
        """`Store.append_events` on the store thread, together with every other stream's batch waiting then.

        In a burst each agent's stream brings its own small batch: one transaction (and one sync of
        the disk) each kept the store thread busy ~1.5 ms a batch. Grouped, a batch costs ~0.03 ms
        (`Store.append_events_many`). Each caller gets its own outcome once the group's commit
        returned, so an ack still covers only durable events.

        Raises:
            KeyError: the node never said Hello.
        """
        return await self._event_batches.submit(node_id, events)

    async def _store(self, fn, *args):  # type: ignore[no-untyped-def]
        return await asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)

    async def run_in_store(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking store call on the single store thread (serialised with every other write)."""
        return await self._store(fn, *args)

    def node_gpus(self, node_id: str) -> tuple[str, ...]:
        """The GPU UUIDs a node announced in its last Hello."""
        return self._node_gpus.get(node_id, ())

    def remember_remote_node(self, node_id: str, labels: Mapping[str, str], gpu_uuids: tuple[str, ...]) -> None:
        """Know a node whose stream another replica holds (its Hello, from the store): the leader's view."""
        if node_id not in self.sessions:
            self.node_labels[node_id] = dict(labels)
            self._node_gpus[node_id] = gpu_uuids

    def dispatch(self, node_id: str, command: commands_pb.Command) -> bool:
        """Queue a command on the node's stream without waiting; False when the node has no stream.

        The result arrives through `command_result_hook`.
        """
        session = self.sessions.get(node_id)
        if session is None:
            return False
        session.stamp_agent_deadline(command)
        try:
            session.outbound.put_nowait(agent_pb.ControllerMessage(command=command))
        except asyncio.QueueFull:
            return False
        return True

    # -- sessions ----------------------------------------------------------------------------------------
    async def open_session(self, hello: agent_pb.Hello) -> tuple[Session, agent_pb.ControllerMessage]:
        """Register a node from its Hello; returns its session and the Welcome to send.

        Raises:
            wire.WireError: a Hello field is malformed.
        """
        node_hello = wire.hello_from_wire(hello)
        now = self._clock()
        outcome = await self.register_hello(node_hello, now)
        previous = self.sessions.get(node_hello.node_id)
        if previous is not None:
            previous.replaced = True
            previous.outbound.put_nowait(None)
        session = Session(
            session_id=uuid.uuid4().hex,
            node_id=node_hello.node_id,
            known_gpus=frozenset(g.uuid for g in node_hello.gpus),
            outbound=asyncio.Queue(maxsize=self.settings.outbound_queue_size),
            opened_unix_ns=now,
            spool_epoch=outcome.spool_epoch,
            acked_seq=outcome.acked_seq,
        )
        session.note_stamp(hello.sent_unix_ns, now)
        self.sessions[session.node_id] = session
        for gpu in node_hello.gpus:
            self.gpu_nodes[gpu.uuid] = gpu.node_id
        self.node_labels[session.node_id] = dict(node_hello.labels)
        self._node_gpus[session.node_id] = tuple(g.uuid for g in node_hello.gpus)
        self.gpu_records.update({g.uuid: g for g in node_hello.gpus})
        self.boot_ids[session.node_id] = node_hello.boot_id
        self.metrics.agent_streams.set(len(self.sessions))
        if self.connected_hook is not None:
            await self.connected_hook(session.node_id)
        log.info(
            "agent_connected",
            node=session.node_id,
            session=session.session_id,
            gpus=len(node_hello.gpus),
            boot_id=node_hello.boot_id,
            rebooted=outcome.rebooted,
            spool_reset=outcome.spool_reset,
            acked_seq=outcome.acked_seq,
            replaced_previous=previous is not None,
        )
        if outcome.lost_seqs is not None:
            first, last = outcome.lost_seqs
            log.error(
                "events_lost_by_store",
                node=session.node_id,
                first_seq=first,
                last_seq=last,
                reason="the agent had these acked and dropped them; the store no longer holds them "
                "(restored from a backup, or failed over to a standby behind the primary)",
            )
            self.metrics.events_lost_by_store.inc(last - first + 1)
        welcome = agent_pb.ControllerMessage(
            welcome=agent_pb.Welcome(
                controller_version=VERSION,
                acked_seq=outcome.acked_seq,
                session_id=session.session_id,
                config=agent_pb.AgentConfig(**self.settings.agent_config),
            )
        )
        return session, welcome

    async def close_session(self, session: Session) -> None:
        """Forget a stream; the node shows as disconnected unless a newer stream replaced it."""
        if self.sessions.get(session.node_id) is session:
            del self.sessions[session.node_id]
            await self._store(self.store.mark_disconnected, session.node_id, self._clock())
            log.info("agent_disconnected", node=session.node_id, session=session.session_id)
        self.metrics.agent_streams.set(len(self.sessions))
        for command_id, pending in list(self._pending_results.items()):
            if pending.node_id == session.node_id:
                if not pending.future.done():
                    pending.future.set_exception(
                        ConnectionError(f"stream to {session.node_id} closed before the result came back")
                    )
                del self._pending_results[command_id]

    # -- inbound -------------------------------------------------------------------------------------------
    def on_telemetry(self, session: Session, batch: health_pb.TelemetryBatch) -> None:
        """Validate and absorb a telemetry batch into the in-memory view (flushed to SQL later).

        Raises:
            wire.WireError: a field is malformed; nothing from this batch is applied.
        """
        wire.check_telemetry(batch, session.known_gpus)
        for series in batch.power:
            self.samples_ingested += self.power_window.add(
                series.gpu_uuid, series.first_sample_unix_ns, series.sample_interval_ms, series.power_w
            )
            self.metrics.power_samples.inc(len(series.power_w))
        now = self._clock()
        if batch.counters:
            session.note_stamp(max(c.sample_unix_ns for c in batch.counters), now)
        for gpu_uuid, update in wire.latest_from_telemetry(batch).items():
            merged = fleet.merge_latest(self.latest.get(gpu_uuid), update)
            self.latest[gpu_uuid] = merged
            self._dirty[gpu_uuid] = merged
            if merged.counters_unix_ns:
                self.latest_controller_ns[gpu_uuid] = session.to_controller_ns(merged.counters_unix_ns, now)
        self._last_seen[session.node_id] = now

    async def on_events(self, session: Session, batch: agent_pb.HealthEventBatch) -> None:
        """Persist a batch of health events, then ack them to the agent.

        Raises:
            wire.WireError: a field is malformed; no event of this batch is stored or acked, and
                everything stored before stays stored.
            repo.SpoolEpochChanged: the node's spool started another epoch since this stream's Hello;
                nothing of the batch is stored or acked.
        """
        started = time.perf_counter()
        now = self._clock()
        events = wire.events_from_wire(batch, session.known_gpus, now, session.node_id, spool_epoch=session.spool_epoch)
        await self.take_events(session, events, started=started)

    async def take_events(self, session: Session, events: list[repo.StoredEvent], *, started: float) -> None:
        """`on_events` after wire validation: store the events, ack them, and return once they are decided.

        started: `time.perf_counter()` when the batch arrived (``rasd_event_persist_seconds``).

        Raises:
            repo.SpoolEpochChanged: as `on_events`.
        """
        now = self._clock()
        # At debug: every event is stored (``rasctl events``), and the decision an event leads to is
        # logged at info with its node and seq. A line per event at info is 2,000 lines/s in a storm
        # (bench/remediation.py's burst): past journald's default rate limit (10,000 per 30 s) within
        # 5 s, which then drops the decisions' lines with them; and 14 µs of the decider's time per
        # event (4 µs at debug, filtered). As they arrive: before the decision on them is logged.
        for event in events:
            log.debug(
                "health_event_received",
                node=session.node_id,
                seq=event.seq,
                kind=health_pb.EventKind.Name(event.kind),
                gpu_uuid=event.gpu_uuid,
                xid=event.xid,
                message=event.message[:200],
            )
        # Shielded: the stream may end (agent killed, a newer stream of the node) while the batch
        # commits. The commit lands anyway and a resend is then a duplicate, so the hand-over to
        # remediation must not depend on this caller still waiting: cancelled there, the events were
        # stored and acked but never decided (and the node's next decision moved the replay watermark
        # past them).
        try:
            acked_seq, decided, ack_queued_at = await asyncio.shield(
                asyncio.ensure_future(self._store_and_hand_over(session, events))
            )
        except repo.SpoolEpochChanged as exc:
            # The node came back with a new spool (a newer Hello, here or at another replica) while
            # this older stream still sent: nothing of it is stored or acked, and the stream ends.
            log.warning("events_of_a_left_spool", node=session.node_id, seqs=[e.seq for e in events], error=str(exc))
            raise
        self._last_seen[session.node_id] = now
        if ack_queued_at is None:
            await session.outbound.put(_ack(acked_seq))
        self.metrics.event_persist_seconds.observe((ack_queued_at or time.perf_counter()) - started)
        if decided is not None:
            await decided  # the stream reads on once they are decided: a storm waits in the agents' spools

    async def _store_and_hand_over(
        self, session: Session, events: Sequence[repo.StoredEvent]
    ) -> tuple[int, asyncio.Task[None] | None, float | None]:
        """Store events, then hand the new ones to remediation.

        Returns (acked seq, the task deciding them or None, when their ack was queued (`time.perf_counter`)
        or None: not yet).
        The hand-over is a task of its own, started before this returns: it runs whether or not
        anyone still waits for this call (`on_events`). Events the stream says are new go to
        `arrivals_hook` instead, to be stored with their decision (no task then: decided already),
        and their ack is queued once that commit is done, ahead of the commands it dispatched.
        """
        append = self._expected_append(session, events) if self.arrivals_hook is not None else None
        if append is not None and self.arrivals_hook is not None:
            labels = self.node_labels.get(session.node_id, {})
            queued: list[float] = []

            def ack_stored() -> None:
                # The agent may drop them from its spool before it runs a reboot they led to. A full
                # queue (a stuck stream) gets its ack after the decision, from `on_events`.
                with contextlib.suppress(asyncio.QueueFull):
                    session.outbound.put_nowait(_ack(append.acked_seq))
                    queued.append(time.perf_counter())

            try:
                await self.arrivals_hook(session.node_id, list(events), labels, append, ack_stored)
            except Exception as exc:
                # Not stored with a decision (or not known to be): stored on their own below, which
                # keeps only what is new, and what is new is handed over as any stored event is.
                log.info("events_stored_apart", node=session.node_id, seqs=[e.seq for e in events], error=str(exc))
                how = "refused"
            else:
                session.acked_seq = max(session.acked_seq or 0, append.acked_seq)
                self._count_stored(events)
                self.events_stored += len(events)
                self.events_stored_with_decision += len(events)
                self.metrics.event_batches_stored_with_decision.inc()
                return append.acked_seq, None, queued[0] if queued else None
        else:
            how = "apart"
        acked_seq, stored = await self.store_events(session.node_id, events)
        self.metrics.event_batches_stored.labels(how=how).inc()
        # The largest: calls of one stream can finish out of order (the store's position only grows).
        session.acked_seq = max(session.acked_seq or 0, acked_seq)
        self.events_stored += len(stored)
        new_seqs = set(stored)
        fresh = sorted({e.seq: e for e in events if e.seq in new_seqs}.values(), key=lambda e: e.seq)
        self._count_stored(fresh)
        if not fresh or self.events_hook is None:
            return acked_seq, None, None
        decided = asyncio.ensure_future(
            self.events_hook(session.node_id, fresh, self.node_labels.get(session.node_id, {}))
        )
        self._hook_tasks.add(decided)
        decided.add_done_callback(functools.partial(self._events_hook_done, session.node_id, [e.seq for e in fresh]))
        return acked_seq, decided, None

    def _count_stored(self, events: Sequence[repo.StoredEvent]) -> None:
        """``rasd_health_events``: events newly stored (a resend's duplicates are not), by kind."""
        self.metrics.events_stored(event.kind for event in events)

    def _expected_append(self, session: Session, events: Sequence[repo.StoredEvent]) -> repo.ExpectedAppend | None:
        """What storing events must do if they are what an agent sending in order sends next; else None.

        The next seqs after the stream's acked position, each once, of the stream's spool epoch:
        anything else (a resend after a lost ack, a gap) is stored first and sorted out by the store.
        """
        if session.acked_seq is None or not events:
            return None
        first = session.acked_seq + 1
        if sorted(e.seq for e in events) != list(range(first, first + len(events))):
            return None
        if any(e.spool_epoch != session.spool_epoch for e in events):
            return None
        return repo.ExpectedAppend(session.node_id, tuple(events), first + len(events) - 1)

    def _events_hook_done(self, node_id: str, seqs: list[int], task: asyncio.Task[None]) -> None:
        """Log a hand-over that failed (its stream may be gone, with no one left to hear of it)."""
        self._hook_tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        log.warning("events_not_decided", node=node_id, seqs=seqs, error=f"{type(error).__name__}: {error}")

    def on_heartbeat(self, session: Session, heartbeat: agent_pb.Heartbeat) -> None:
        """Note liveness, and the agent's clock against ours."""
        now = self._clock()
        session.note_stamp(heartbeat.sent_unix_ns, now)
        self._last_seen[session.node_id] = now

    def to_controller_ns(self, node_id: str, agent_unix_ns: int) -> int:
        """A stamp from node_id's agent that arrives now, in controller time (`Session.to_controller_ns`)."""
        now = self._clock()
        session = self.sessions.get(node_id)
        return session.to_controller_ns(agent_unix_ns, now) if session is not None else min(agent_unix_ns, now)

    def on_result(self, session: Session, result: commands_pb.ActionResult) -> None:
        """Deliver a command result to whoever awaits it and count it."""
        pending = self._pending_results.pop(result.command_id, None)
        action = pending.action if pending is not None else "unknown"
        self.metrics.commands.labels(action=action, outcome=commands_pb.ActionOutcome.Name(result.outcome)).inc()
        log.info(
            "command_result",
            node=session.node_id,
            command_id=result.command_id,
            outcome=commands_pb.ActionOutcome.Name(result.outcome),
            replayed=result.replayed,
            message=result.message,
        )
        received = self._clock()
        session.note_stamp(result.finished_unix_ns, received)
        for limit in result.enforced_limits:
            if limit.gpu_uuid in session.known_gpus:
                previous = self.latest.get(limit.gpu_uuid) or fleet.GpuLatest()
                # The agent's read-back is the newest word on the enforced limit, and on the target
                # of a raise it is still moving there (0: none).
                confirmed = dataclasses.replace(
                    previous,
                    enforced_power_limit_w=limit.power_limit_w,
                    power_limit_slew_target_w=limit.slew_target_w or None,
                    counters_unix_ns=max(previous.counters_unix_ns, result.finished_unix_ns),
                )
                self.latest[limit.gpu_uuid] = confirmed
                self._dirty[limit.gpu_uuid] = confirmed
                self.latest_controller_ns[limit.gpu_uuid] = max(
                    self.latest_controller_ns.get(limit.gpu_uuid, 0),
                    session.to_controller_ns(result.finished_unix_ns, received),
                )
        if pending is not None:
            if not pending.future.done():
                pending.future.set_result(result)
        elif self.command_result_hook is not None:
            task = asyncio.get_running_loop().create_task(self.command_result_hook(session.node_id, result))
            self._hook_tasks.add(task)
            task.add_done_callback(functools.partial(self._result_hook_done, session.node_id, result.command_id))

    def _result_hook_done(self, node_id: str, command_id: str, task: asyncio.Task[None]) -> None:
        """Log a result the hook could not take (a replica that lost the lead, a store shut down at stop).

        Without this its error was only asyncio's "Task exception was never retrieved", unstructured
        and at garbage collection.
        """
        self._hook_tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        log.warning(
            "command_result_not_applied", node=node_id, command_id=command_id, error=f"{type(error).__name__}: {error}"
        )

    # -- outbound ------------------------------------------------------------------------------------------
    async def send_command(
        self, node_id: str, command: commands_pb.Command, *, timeout_s: float = 30.0
    ) -> commands_pb.ActionResult:
        """Send a command to a connected node and wait for its result.

        Raises:
            LookupError: the node has no open stream on this replica.
            TimeoutError: no result within timeout_s.
            ConnectionError: the stream closed before the result came back.
        """
        session = self.sessions.get(node_id)
        if session is None:
            raise LookupError(f"node {node_id!r} has no open stream on this replica")
        if not command.command_id:
            command.command_id = uuid.uuid4().hex
        future: asyncio.Future[commands_pb.ActionResult] = asyncio.get_running_loop().create_future()
        self._pending_results[command.command_id] = _PendingCommand(
            node_id=node_id, action=command.WhichOneof("action") or "unknown", future=future
        )
        session.stamp_agent_deadline(command)
        await session.outbound.put(agent_pb.ControllerMessage(command=command))
        try:
            return await asyncio.wait_for(future, timeout=timeout_s)
        finally:
            self._pending_results.pop(command.command_id, None)

    # -- reads and flushing -------------------------------------------------------------------------------
    async def list_nodes(self, selector: Mapping[str, str] | None = None) -> list[fleet.NodeStatus]:
        """The fleet from the store, overlaid with this replica's fresher in-memory telemetry.

        No flush first: the overlay already shows this replica's latest values, and a read (the
        simulator's live table, a dashboard's poll) must not cost a write of every GPU's telemetry.
        """
        nodes = await self._store(self.store.list_nodes)
        result = []
        for node in nodes:
            if selector and not fleet.matches_selector(node.labels, selector):
                continue
            connected = node.node_id in self.sessions or node.connected
            now = self._clock()
            gpus = tuple(
                dataclasses.replace(
                    gpu,
                    latest=fleet.drop_stale_power(
                        fleet.merge_latest(gpu.latest, self.latest.get(gpu.record.uuid) or gpu.latest),
                        now_s=now / 1e9,
                        stale_after_s=self.settings.power_stale_after_s,
                    ),
                )
                for gpu in node.gpus
            )
            result.append(
                dataclasses.replace(
                    node,
                    connected=connected,
                    state=fleet.effective_node_state(node.state, connected=connected),
                    last_seen_unix_ns=max(node.last_seen_unix_ns, self._last_seen.get(node.node_id, 0)),
                    gpus=gpus,
                )
            )
        return result

    async def list_events(self, *, node_id: str, since_unix_ns: int, limit: int) -> list[repo.StoredEvent]:
        """Stored events, newest first."""
        return await self._store(
            lambda: self.store.list_events(node_id=node_id, since_unix_ns=since_unix_ns, limit=limit)
        )

    def node_states(self) -> dict[str, fleet.ComponentState]:
        """The nodes whose stream this replica holds, in their effective state (for metrics).

        Read from the store on each scrape (one query), so a quarantined or repairing node shows as
        such, not as healthy; nodes with no stream on any replica are the store's business.
        """
        connected = list(self.sessions)
        stored = self.store.node_component_states(connected)
        return {
            node_id: fleet.effective_node_state(stored.get(node_id, fleet.ComponentState.HEALTHY), connected=True)
            for node_id in connected
        }

    async def flush(self) -> None:
        """Write dirty latest telemetry and last-seen times to the store."""
        dirty, self._dirty = self._dirty, {}
        last_seen, self._last_seen = self._last_seen, {}
        if not dirty and not last_seen:
            return
        started = time.perf_counter()
        try:
            await self._store(self.store.save_latest, dirty)
            await self._store(self.store.touch_nodes, last_seen)
        except Exception:
            # Keep what could not be written; newer values that arrived meanwhile win.
            for uuid_, value in dirty.items():
                self._dirty.setdefault(uuid_, value)
            for node_id, ts in last_seen.items():
                self._last_seen.setdefault(node_id, ts)
            raise
        self.metrics.store_flush_seconds.observe(time.perf_counter() - started)

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.flush_interval_s)
            try:
                await self.flush()
            except Exception as exc:  # the store may be briefly unavailable; retry next period
                log.error("telemetry_flush_failed", error=str(exc), error_type=type(exc).__name__)


class _GroupCommit(Generic[OutcomeT]):
    """Like store calls that wait at the same time, made as one call on the store thread (a group commit).

    ``many`` takes the waiting calls' argument tuples, in arrival order, and returns one outcome for
    each (an exception instance: that call alone failed); ``one`` takes one call's arguments. When
    ``many`` itself raises, each call of the group is made alone with ``one``, so that one refused
    call fails only its own caller (a store that is down fails each of them alike).
    """

    def __init__(
        self,
        name: str,
        run_in_store: Callable[..., Awaitable[Any]],
        many: Callable[[list[tuple[Any, ...]]], Sequence[OutcomeT | BaseException]],
        one: Callable[..., OutcomeT],
        max_group: int,
    ) -> None:
        self._name = name
        self._run_in_store = run_in_store
        self._many = many
        self._one = one
        self._max_group = max_group
        self._inbox: list[tuple[tuple[Any, ...], asyncio.Future[OutcomeT]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, *args: Any) -> OutcomeT:
        """The outcome of ``one(*args)``, made together with every call waiting then."""
        future: asyncio.Future[OutcomeT] = asyncio.get_running_loop().create_future()
        self._inbox.append((args, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name=self._name)
        return await future

    async def _drain(self) -> None:
        while self._inbox:
            group, self._inbox = self._inbox[: self._max_group], self._inbox[self._max_group :]
            try:
                outcomes = await self._run_in_store(self._many, [args for args, _future in group])
            except Exception as exc:
                if len(group) == 1:
                    _settle(group[0][1], exc)
                    continue
                for args, future in group:
                    try:
                        _settle(future, await self._run_in_store(self._one, *args))
                    except Exception as one_exc:
                        _settle(future, one_exc)
                continue
            except BaseException:  # cancelled (shutdown): nobody waits for ever
                for _args, future in [*group, *self._inbox]:
                    future.cancel()
                self._inbox = []
                raise
            for (_args, future), outcome in zip(group, outcomes, strict=True):
                _settle(future, outcome)


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    """Give a waiting caller its result or exception, unless it stopped waiting (its stream ended)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _ack(acked_seq: int) -> agent_pb.ControllerMessage:
    return agent_pb.ControllerMessage(ack=agent_pb.EventAck(acked_seq=acked_seq))
