"""The controller's ingest service: agent sessions, telemetry, durable events, command results.

Takes what an agent stream brings, as domain values (`rasd.controller.wire` converts at the edge),
and keeps this replica's in-memory view of the fleet: the sessions and the nodes' inventory
(`streams.AgentStreams`), the latest telemetry per GPU and the power window. Store calls run on the
replica's store thread (`rasd.controller.store.thread`): SQL writes are serialized, and the asyncio
loop that serves thousands of streams never blocks on I/O.

Event durability (DESIGN.md invariant 3): a batch of health events is handed to the consumer
(`consumer.IngestConsumer`) once, and acked only once it is durable. A batch that is the next of its
stream's spool goes with what storing it must do (`repo.ExpectedAppend`): where this replica
decides, it is stored in the transaction of the decision on it and acked once that commits,
before its commands leave (one sync of the disk for both); anything else is stored apart first,
acked, then decided. A resend is de-duplicated by (node, spool epoch, seq) in the same transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from rasd.common import VERSION
from rasd.controller import stragglers
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import fleet
from rasd.controller.ingest import consumer as consumer_mod
from rasd.controller.ingest import group_commit, priority, store_calls, streams
from rasd.controller.observability import metrics
from rasd.controller.store import repo
from rasd.controller.store import thread as store_thread
from rasd.controller.wire import commands as wire_commands
from rasd.controller.wire import stream as wire_stream

log = structlog.get_logger("rasd.controller")

Clock = Callable[[], int]

MAX_HELLO_GROUP = 256
"""Hellos registered in one store transaction at most (a reconnect storm is cut into such groups)."""

FLUSH_CHUNK = 512
"""Rows of latest telemetry (GPUs) or last-seen times (nodes) written in one store call by `Ingest.flush`."""

Session = streams.Session
"""One open agent stream (`streams.Session`)."""


@dataclasses.dataclass(frozen=True)
class IngestSettings:
    """Pacing of the ingest and what agents are told in Welcome."""

    flush_interval_s: float = 5.0
    """How often the latest telemetry is written to the store. That copy serves other replicas and
    a restarted controller; this replica's own reads overlay its in-memory view, so a longer period
    costs nothing here, while a short period keeps the store thread busy at fleet scale
    (bench/scale.py reports the store thread's share)."""
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
    telemetry_summaries: bool = True
    """Take telemetry summaries from agents that offer them (TELEMETRY_FORMAT_SUMMARY); False: every
    sample, as from agents before summaries."""
    stragglers: stragglers.StragglerSettings = dataclasses.field(default_factory=stragglers.StragglerSettings)
    """controller.toml's ``[stragglers]``: the straggler watch's detection, step grouping and actions."""


class Ingest:
    """Everything the controller does with what agents send; commands go out through `streams`."""

    def __init__(
        self,
        store: repo.Store,
        thread: store_thread.StoreThread,
        agent_streams: streams.AgentStreams,
        controller_metrics: metrics.ControllerMetrics,
        consumer: consumer_mod.IngestConsumer,
        settings: IngestSettings | None = None,
        *,
        clock: Clock = time.time_ns,
    ) -> None:
        """Bind to the store and its thread, the streams, metrics and the consumer; call `start()` in the loop.

        consumer: who makes events durable and acts on them and on results (`consumer`). Other
        services run their store calls through `store_calls` (its read threads closed by `stop`).
        """
        self.store = store
        self.thread = thread
        self.store_calls = store_calls.StoreCalls(store, thread)
        self.streams = agent_streams
        self.metrics = controller_metrics
        self.consumer = consumer
        self.settings = settings or IngestSettings()
        self.clock = clock
        """The controller's clock (unix ns): events are stamped received by it (`wire.agent.events_from_wire`)."""
        self.power_window = fleet.PowerWindow(span_s=self.settings.power_window_span_s)
        self.stragglers = stragglers.StragglerWatch.of(controller_metrics, self.settings.stragglers)  # (#40)
        self._full_rate_for: frozenset[str] = self.power_window.tracked
        """The tracked set the streams were last asked about (`_follow_tracked`)."""
        self._dirty: dict[str, fleet.GpuLatest] = {}
        self._last_seen: dict[str, int] = {}
        self._result_tasks: set[asyncio.Task[None]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self.events_first = priority.EventsFirst()  # absorbing summaries and flushing wait behind event batches
        absorbed_at_once = self.metrics.summaries_absorbed_at_once.inc
        self._summaries: priority.Absorber[tuple[Session, Callable[[], msgs.TelemetrySummary]]] = priority.Absorber(
            lambda item: self.on_summary(item[0], item[1]()), self.events_first, pushed_out=absorbed_at_once
        )
        self._hellos: group_commit.GroupCommit[repo.HelloOutcome] = group_commit.GroupCommit(
            "rasd-hello-registrar", thread.run, store.register_hellos, store.register_hello, MAX_HELLO_GROUP
        )
        self.samples_ingested = 0
        self.events_stored = 0
        self.events_stored_with_decision = 0
        """Of `events_stored`, those stored in the transaction of the decision on them (`TakenEvents.with_decision`)."""

    # -- this replica's view, from its streams ---------------------------------------------------------------
    @property
    def sessions(self) -> dict[str, Session]:
        """Node → its open stream on this replica."""
        return self.streams.sessions

    @property
    def node_labels(self) -> streams.LabelsByNode:
        """Node → its labels from its last Hello (or the store's, for another replica's node)."""
        return self.streams.node_labels

    @property
    def latest(self) -> dict[str, fleet.GpuLatest]:
        """GPU uuid → its freshest telemetry (`AgentStreams.latest`)."""
        return self.streams.latest

    @property
    def latest_controller_ns(self) -> dict[str, int]:
        """GPU uuid → when its `latest` counters were sampled, in controller time (`AgentStreams`)."""
        return self.streams.latest_controller_ns

    @property
    def gpu_nodes(self) -> dict[str, str]:
        """GPU uuid → its node."""
        return self.streams.gpu_nodes

    @property
    def gpu_records(self) -> dict[str, fleet.GpuRecord]:
        """Each GPU's inventory record from its node's last Hello."""
        return self.streams.gpu_records

    @property
    def boot_ids(self) -> dict[str, str]:
        """Each node's boot id from its last Hello."""
        return self.streams.boot_ids

    def node_gpus(self, node_id: str) -> tuple[str, ...]:
        """The GPU UUIDs a node announced in its last Hello."""
        return self.streams.node_gpus(node_id)

    async def forget_gpu_owner(self, node_id: str, gpu_uuid: str) -> None:
        """An operator says node_id's GPU left it: the next node whose Hello lists it owns it (the store's record).

        Raises:
            LookupError: the GPU is not node_id's.
            ValueError: node_id is connected here and its Hello lists the GPU.
        """
        session = self.sessions.get(node_id)
        if session is not None and gpu_uuid in session.known_gpus:
            raise ValueError(f"node {node_id} is connected and its Hello lists {gpu_uuid}")
        if not await self.thread.run(self.store.forget_gpu_owner, gpu_uuid, node_id):
            raise LookupError(f"GPU {gpu_uuid} is not node {node_id}'s")
        self.streams.forget_gpu_owner(gpu_uuid, node_id)

    def remember_remote_node(self, node_id: str, labels: Mapping[str, str], gpu_uuids: tuple[str, ...]) -> None:
        """Know a node whose stream another replica holds (`AgentStreams.remember_remote_node`)."""
        self.streams.remember_remote_node(node_id, labels, gpu_uuids)

    def to_controller_ns(self, node_id: str, agent_unix_ns: int) -> int:
        """A stamp from node_id's agent that arrives now, in controller time (`Session.to_controller_ns`)."""
        return self.streams.to_controller_ns(node_id, agent_unix_ns)

    def dispatch(self, node_id: str, command: wire_commands.Command) -> bool:
        """Queue a command on the node's stream without waiting (`AgentStreams.dispatch`)."""
        return self.streams.dispatch(node_id, command)

    async def send_command(
        self, node_id: str, command: wire_commands.Command, *, timeout_s: float = 30.0
    ) -> msgs.AgentResult:
        """Send a command to a node on this replica and wait for its result (`AgentStreams.send_command`)."""
        return await self.streams.send_command(node_id, command, timeout_s=timeout_s)

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Mark every node disconnected (no stream is open yet), warm the event path up, start the flush loop."""
        if self.settings.mark_all_disconnected_at_start:
            await self.thread.run(self.store.mark_all_disconnected)
        try:  # so that the first fault's event is stored without compiling; worth no failed start
            await self.thread.run(self.store.warm_up_events)
        except repo.STORE_UNAVAILABLE as exc:
            log.warning("ingest_warm_up_skipped", error=str(exc))
        self._flusher = asyncio.create_task(self._flush_forever(), name="rasd-telemetry-flush")
        self._summaries.start()

    def end_sessions(self) -> None:
        """End every open agent stream (its agent reconnects, to another replica if there is one)."""
        self.streams.end_all()

    async def stop(self) -> None:
        """End every session and flush what is dirty.

        The store thread runs on for whoever built it to close: stop the gRPC server first, or a
        call it still takes would find no store (the Controller does).
        """
        self.end_sessions()
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self._summaries.stop()  # what waited goes into the final flush
        try:
            await self.flush()
        except repo.STORE_UNAVAILABLE as exc:  # latest telemetry and last-seen times only: no event is lost
            log.error("final_flush_failed", error=str(exc).splitlines()[0][:300], error_type=type(exc).__name__)
        await self.store_calls.close()

    # -- sessions ----------------------------------------------------------------------------------------
    async def register_hello(
        self, node_hello: fleet.NodeHello, now_unix_ns: int, *, certified: bool = False
    ) -> repo.HelloOutcome:
        """Register a Hello on the store thread, together with every other Hello waiting then.

        certified: its stream's certificate names its node (`repo.Store.register_hello`).

        After a controller restart or a failover every agent reconnects at once; registering Hellos
        in groups costs the store thread a fraction of one by one (tests/chaos/test_reconnect_storm.py
        reconnects 2,000 agents), so agents are welcomed before their Welcome timeouts make them retry.
        """
        return await self._hellos.submit(node_hello, now_unix_ns, certified)

    async def open_session(
        self, node_hello: fleet.NodeHello, *, sent_unix_ns: int = 0, certified: bool = False
    ) -> tuple[Session, msgs.Welcome]:
        """Register a node from its (validated) Hello; returns its session and the Welcome to send.

        sent_unix_ns: when the agent sent the Hello, on its clock (0: not stamped). certified: its
        stream's certificate names its node, so another node's GPU it lists is refused
        (`repo.GpuClaimRefused`).
        """
        now = self.clock()
        outcome = await self.register_hello(node_hello, now, certified=certified)
        session = Session(
            session_id=uuid.uuid4().hex,
            node_id=node_hello.node_id,
            known_gpus=frozenset(g.uuid for g in node_hello.gpus),
            outbound=asyncio.Queue(maxsize=self.settings.outbound_queue_size),
            opened_unix_ns=now,
            spool_epoch=outcome.spool_epoch,
            acked_seq=outcome.acked_seq,
            summaries=node_hello.summaries_offered and self.settings.telemetry_summaries,
        )
        session.note_stamp(sent_unix_ns, now)
        previous = self.streams.open(node_hello, session)
        self.metrics.agent_streams.set(len(self.sessions))
        try:
            await self.consumer.connected(session.node_id)
        except BaseException:
            # No stream will serve it (the caller gets no session to close): left open, the node
            # showed as connected for ever and its commands went nowhere.
            await self.close_session(session)
            raise
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
            self._note_lost(session.node_id, outcome.lost_seqs)
        welcome = msgs.Welcome(
            session_id=session.session_id,
            acked_seq=outcome.acked_seq,
            controller_version=VERSION,
            agent_config=self.settings.agent_config,
            summaries=session.summaries,
        )
        self._ask_full_rate(session)  # queued behind the Welcome
        return session, welcome

    def _note_lost(self, node_id: str, lost_seqs: tuple[int, int]) -> None:
        first, last = lost_seqs
        log.error(
            "events_lost_by_store",
            node=node_id,
            first_seq=first,
            last_seq=last,
            reason="the agent had these acked and dropped them; the store no longer holds them "
            "(restored from a backup, or failed over to a standby behind the primary)",
        )
        self.metrics.events_lost_by_store.inc(last - first + 1)

    async def close_session(self, session: Session) -> None:
        """Forget a stream; the node shows as disconnected unless a newer stream replaced it."""
        if self.streams.close(session):
            await self.thread.run(self.store.mark_disconnected, session.node_id, self.clock())
            log.info("agent_disconnected", node=session.node_id, session=session.session_id)
        self.metrics.agent_streams.set(len(self.sessions))

    # -- inbound -------------------------------------------------------------------------------------------
    def on_telemetry(self, session: Session, telemetry: msgs.Telemetry) -> None:
        """Absorb a validated telemetry batch (`wire.stream.telemetry_from_wire`) into the in-memory view."""
        for series in telemetry.power:
            self.samples_ingested += self.power_window.add(
                series.gpu_uuid, series.first_sample_unix_ns, series.sample_interval_ms, series.power_w
            )
            self.metrics.power_samples.inc(len(series.power_w))
        now = self.clock()
        if telemetry.newest_counters_unix_ns is not None:
            session.note_stamp(telemetry.newest_counters_unix_ns, now)
        for gpu_uuid, update in telemetry.latest.items():
            merged = fleet.merge_latest(self.latest.get(gpu_uuid), update)
            self.latest[gpu_uuid] = merged
            self._dirty[gpu_uuid] = merged
            if merged.counters_unix_ns:
                self.latest_controller_ns[gpu_uuid] = session.to_controller_ns(merged.counters_unix_ns, now)
        self._last_seen[session.node_id] = now

    def queue_summary(self, session: Session, convert: Callable[[], msgs.TelemetrySummary]) -> None:
        """Convert and absorb a checked telemetry summary once no health-event batch is in flight (`priority`).

        convert: the summary's conversion (`wire.stream.summary_from_wire` on a message the edge
        checked: it cannot fail). Converting and absorbing a stream's summary costs the event loop
        tens of µs (`on_summary`); at 2,048 nodes a second's worth sat in front of every step of a
        fault's batch. So it waits, per node in order (none is dropped: a node's fifth waiting pushes
        its oldest in at once, counted); at once too while the ingest does not run (`start`, `stop`).
        """
        self._summaries.put(session.node_id, (session, convert))

    def on_summary(self, session: Session, summary: msgs.TelemetrySummary) -> None:
        """Absorb a validated telemetry summary (`wire.stream.summary_from_wire`) into the in-memory view.

        Into the power window go the node's summed draw per bucket, each GPU's peak, and the full
        series of the GPUs the power loop tracks; into the latest view, each GPU's last sample and
        its power-loop counters.
        """
        window = self.power_window
        if window.tracked is not self._full_rate_for:
            self._follow_tracked()
        for peak in summary.peaks:
            window.add_peak(peak.gpu_uuid, peak.last_sample_unix_ns, peak.max_w)
        node = summary.node_power
        if node is not None:
            window.add_node(node.node_id, node.first_sample_unix_ns, node.sample_interval_ms, node.power_w, node.gpus)
        for series in summary.full_rate:
            window.add_tracked(series.gpu_uuid, series.first_sample_unix_ns, series.sample_interval_ms, series.power_w)
        self.samples_ingested += summary.samples
        self.metrics.power_samples.inc(summary.samples)
        now = self.clock()
        if summary.newest_counters_unix_ns is not None:
            session.note_stamp(summary.newest_counters_unix_ns, now)
        latest, controller_ns = self.latest, self.latest_controller_ns
        for gpu_uuid, update in summary.latest.items():
            merged = fleet.merge_summary(latest.get(gpu_uuid), update)
            latest[gpu_uuid] = merged
            self._dirty[gpu_uuid] = merged
            if merged.counters_unix_ns:
                controller_ns[gpu_uuid] = session.to_controller_ns(merged.counters_unix_ns, now)
        self.stragglers.add_edges(session.node_id, summary.edges, now, latest)
        self._last_seen[session.node_id] = now

    def _follow_tracked(self) -> None:
        """Ask every summaries stream for the full series of its tracked GPUs, now that the tracked set changed.

        The power loop names its canaries to the power window (`PowerWindow.track`); their own swing
        shows only in their full series, which a summary carries only when asked.
        """
        self._full_rate_for = self.power_window.tracked
        for session in self.sessions.values():
            self._ask_full_rate(session)

    def _ask_full_rate(self, session: Session) -> None:
        """Queue a `FullRateRequest` on a summaries stream whose wanted GPUs changed since last asked."""
        wanted = session.known_gpus & self.power_window.tracked
        if not session.summaries or wanted == session.full_rate:
            return
        try:
            session.outbound.put_nowait(wire_stream.full_rate_message(wanted))
        except asyncio.QueueFull:  # a stuck stream: asked again once the tracked set changes
            return
        session.full_rate = wanted

    async def take_events(self, session: Session, events: list[repo.StoredEvent], *, started: float) -> None:
        """Hand validated events (`wire.agent.events_from_wire`) on; ack them once durable; return once decided.

        started: `time.perf_counter()` when the batch arrived (``rasd_event_persist_seconds``).

        Raises:
            repo.SpoolEpochChanged: the node's spool started another epoch since this stream's Hello;
                nothing of the batch is stored or acked.
        """
        now = self.clock()
        # At debug: every event is stored (``rasctl events``), and the decision an event leads to is
        # logged at info with its node and seq. A line per event at info in a storm of thousands of
        # events a second passes journald's default rate limit (10,000 per 30 s) within seconds,
        # which then drops the decisions' lines with them, and costs the decider time per event.
        # As they arrive: before the decision on them is logged.
        for event in events:
            log.debug(
                "health_event_received",
                node=session.node_id,
                seq=event.seq,
                kind=wire_stream.event_kind_name(event.kind),
                gpu_uuid=event.gpu_uuid,
                xid=event.xid,
                message=event.message[:200],
            )
        # Shielded: the stream may end (agent killed, a newer stream of the node) while the batch
        # commits. The commit lands anyway and a resend is then a duplicate, so the hand-over must
        # not depend on this caller still waiting: cancelled here, the events were stored and acked
        # but never decided (and the node's next decision moved the replay watermark past them).
        with self.events_first.event_batch():  # telemetry's absorbing and flushing wait meanwhile
            try:
                taken, ack_queued_at = await asyncio.shield(asyncio.ensure_future(self._hand_over(session, events)))
            except repo.SpoolEpochChanged as exc:
                # The node came back with a new spool (a newer Hello, here or at another replica) while
                # this older stream still sent: nothing of it is stored or acked, and the stream ends.
                seqs = [e.seq for e in events]
                log.warning("events_of_a_left_spool", node=session.node_id, seqs=seqs, error=str(exc))
                raise
            self._last_seen[session.node_id] = now
            if ack_queued_at is None:
                await session.outbound.put(wire_stream.ack_message(taken.acked_seq))
            self.metrics.event_persist_seconds.observe((ack_queued_at or time.perf_counter()) - started)
            if taken.decided is not None:
                await taken.decided  # the stream reads on once they are decided: a storm waits in the agents' spools

    async def _hand_over(
        self, session: Session, events: Sequence[repo.StoredEvent]
    ) -> tuple[consumer_mod.TakenEvents, float | None]:
        """Hand events to the consumer, once; returns what it made of them and when their ack was queued.

        The ack is queued here (`EventBatch.on_durable`) when the events were stored with their
        decision, as soon as that commit is done and ahead of the commands it dispatched; otherwise
        (None) the caller queues it.
        """
        append = self._expected_append(session, events)
        queued: list[float] = []

        def ack_stored() -> None:
            # The agent may drop them from its spool before it runs a reboot they led to. A full
            # queue (a stuck stream) gets its ack after the decision, from `take_events`.
            if append is None:
                return
            with contextlib.suppress(asyncio.QueueFull):
                session.outbound.put_nowait(wire_stream.ack_message(append.acked_seq))
                queued.append(time.perf_counter())

        labels = self.node_labels.get(session.node_id, {})
        taken = await self.consumer.events(
            consumer_mod.EventBatch(session.node_id, list(events), labels, append, ack_stored)
        )
        # The largest: calls of one stream can finish out of order (the store's position only grows).
        session.acked_seq = max(session.acked_seq or 0, taken.acked_seq)
        self.events_stored += taken.stored
        self.metrics.events_stored(event.kind for event in taken.fresh)  # ``rasd_health_events``, by kind
        if taken.with_decision:
            self.events_stored_with_decision += taken.stored
            self.metrics.event_batches_stored_with_decision.inc()
        return taken, queued[0] if queued and taken.with_decision else None

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

    def on_heartbeat(self, session: Session, sent_unix_ns: int) -> None:
        """Note liveness, and the agent's clock (the heartbeat's send time) against ours."""
        now = self.clock()
        session.note_stamp(sent_unix_ns, now)
        self._last_seen[session.node_id] = now

    def on_result(self, session: Session, result: msgs.AgentResult) -> None:
        """Note a command's result: its read-backs, then to whoever awaits it, or to the consumer."""
        pending = self.streams.settle(result)
        action = pending.action if pending is not None else "unknown"
        self.metrics.commands.labels(action=action, outcome=result.outcome_name).inc()
        log.info(
            "command_result",
            node=session.node_id,
            command_id=result.command_id,
            outcome=result.outcome_name,
            replayed=result.replayed,
            message=result.message,
        )
        received = self.clock()
        session.note_stamp(result.finished_unix_ns, received)
        self._note_read_backs(session, result, received)
        if pending is None:
            task = asyncio.get_running_loop().create_task(self.consumer.result(session.node_id, result))
            self._result_tasks.add(task)
            task.add_done_callback(functools.partial(self._result_taken, session.node_id, result.command_id))

    def _note_read_backs(self, session: Session, result: msgs.AgentResult, received: int) -> None:
        """The agent's read-back is the newest word on a GPU's enforced limit, and on the target of a raise."""
        for limit in result.enforced_limits:
            if limit.gpu_uuid in session.known_gpus:
                previous = self.latest.get(limit.gpu_uuid) or fleet.GpuLatest()
                # On the target of a raise it is still moving there (0: none).
                confirmed = previous._replace(
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

    def result_tasks(self) -> list[asyncio.Task[None]]:
        """Results handed to the consumer (`on_result`) and not taken yet."""
        return list(self._result_tasks)

    def _result_taken(self, node_id: str, command_id: str, task: asyncio.Task[None]) -> None:
        """Log a result the consumer could not take (a replica that lost the lead, a store shut down at stop).

        Without this its error was only asyncio's "Task exception was never retrieved", unstructured
        and at garbage collection.
        """
        self._result_tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        log.warning(
            "command_result_not_applied", node=node_id, command_id=command_id, error=f"{type(error).__name__}: {error}"
        )

    # -- reads and flushing -------------------------------------------------------------------------------
    async def list_nodes(
        self, selector: Mapping[str, str] | None = None, *, node_ids: Sequence[str] | None = None
    ) -> list[fleet.NodeStatus]:
        """The fleet (or the named nodes) from the store, overlaid with this replica's fresher in-memory telemetry.

        Read beside the store thread (`StoreCalls.run_read`). No flush first: the overlay already shows this
        replica's latest values, and a read (the simulator's live table, a dashboard's poll) must
        not cost a write of every GPU's telemetry.
        """
        nodes = await self.store_calls.run_read(self.store.list_nodes, node_ids)
        return [
            self.overlaid(node)
            for node in nodes
            if not selector or fleet.matches_selector(node.labels, selector)
        ]  # fmt: skip

    def overlaid(self, node: fleet.NodeStatus) -> fleet.NodeStatus:
        """A stored node with this replica's stream, last-seen time and telemetry laid over it.

        Only reads this replica's maps (key lookups), so a read thread may call it.
        """
        connected = node.node_id in self.sessions or node.connected
        now = self.clock()
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
        return dataclasses.replace(
            node,
            connected=connected,
            state=fleet.effective_node_state(node.state, connected=connected),
            last_seen_unix_ns=max(node.last_seen_unix_ns, self._last_seen.get(node.node_id, 0)),
            gpus=gpus,
        )

    async def list_events(self, *, node_id: str, since_unix_ns: int, limit: int) -> list[repo.StoredEvent]:
        """Stored events, newest first (read beside the store thread)."""
        return await self.store_calls.run_read(
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
        """Write dirty latest telemetry and last-seen times to the store, `FLUSH_CHUNK` rows a store call.

        In chunks, so that an event batch queued on the store thread meanwhile waits for one chunk,
        not for the whole fleet's rows: at 2,048 nodes one transaction of 16,384 GPUs held the store
        thread for about 0.9 s, and every ack and decision behind it (bench/scale.py's p99). No
        chunk starts while an event batch is in flight (`priority.EventsFirst`, for a bounded wait).
        """
        dirty, self._dirty = self._dirty, {}
        last_seen, self._last_seen = self._last_seen, {}
        if not dirty and not last_seen:
            return
        started = time.perf_counter()
        try:
            for rows, write in ((dirty, self.store.save_latest), (last_seen, self.store.touch_nodes)):
                while rows:
                    await self.events_first.telemetry_turn()
                    chunk = _take(rows, FLUSH_CHUNK)  # each as its turn comes: cutting 16,384 at once stalled the loop
                    try:
                        await self.thread.run(write, chunk)
                    except BaseException:
                        rows.update(chunk)
                        raise
        except BaseException:
            # Keep what could not be written (for the next flush, or the final one at stop); newer
            # values that arrived meanwhile win.
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


def _take(rows: dict[Any, Any], size: int) -> dict[Any, Any]:
    """The first size entries of rows (all, if fewer), removed from rows."""
    return {key: rows.pop(key) for key in list(itertools.islice(rows, size))}
