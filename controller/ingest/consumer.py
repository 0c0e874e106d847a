"""What the ingest hands on, and to whom: the consumer of a replica's events, results and connections.

The ingest validates and counts what agents send; one consumer, given at construction, makes it
durable and acts on it:

- on a single replica, the repair ladder (`rasd.controller.remediation.service.RemediationService`):
  a batch that is the next of its stream's spool (`EventBatch.append`) is stored in the
  transaction of the decision on it, and acked once that commits, before its commands leave;
  anything else is stored apart first (`EventLog.store_apart`), acked, then decided;
- with lease election, the relay (`rasd.controller.replication.relay.Relay`): events are stored
  apart and the leader decides them from the store; results are stored for the leader;
- without remediation, `StoreOnly`: events are stored and acked, nothing else.

Each batch goes to the consumer once, in one direction: the consumer answers with what it made
durable (`TakenEvents`) and, for events stored apart, the decision still running on the new ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

import structlog

from rasd.controller.core import agent_messages as msgs
from rasd.controller.ingest import group_commit
from rasd.controller.observability import metrics
from rasd.controller.store import repo
from rasd.controller.store import thread as store_thread

log = structlog.get_logger("rasd.controller")

MAX_EVENT_GROUP = 512
"""Event batches (one per stream message) stored in one store transaction at most."""


@dataclasses.dataclass(frozen=True)
class EventBatch:
    """A stream's batch of health events, validated, on its way to being stored (and decided)."""

    node_id: str
    events: list[repo.StoredEvent]
    labels: Mapping[str, str]
    """The node's labels from its Hello (the decision's topology)."""
    append: repo.ExpectedAppend | None
    """What storing them does if they are the next of the stream's spool, as its acked position says
    (`Ingest` works it out); None: a resend, a gap, or a spool the stream does not know."""
    on_durable: Callable[[], None]
    """Queues the ack of ``append.acked_seq``: called at most once, when the events were stored in the
    transaction of the decision on them, as soon as it committed and before any command it
    dispatched leaves."""


@dataclasses.dataclass(frozen=True)
class TakenEvents:
    """What a consumer made of a batch."""

    acked_seq: int
    """The node's acked position after it: the ack to send."""
    stored: int
    """How many of the events were new (a resend's duplicates are not)."""
    fresh: list[repo.StoredEvent]
    """The new events, in seq order."""
    with_decision: bool = False
    """Stored in the transaction of the decision on them (and acked through `EventBatch.on_durable`)."""
    decided: asyncio.Future[None] | None = None
    """Stored apart: the decision on the new events, still running (None: nothing to decide here)."""


class IngestConsumer(Protocol):
    """Whoever acts on a replica's agent streams (see the module docstring)."""

    async def events(self, batch: EventBatch) -> TakenEvents:
        """Make a batch durable (and decide it, or leave it to whoever decides); returns once it is durable.

        Raises:
            repo.SpoolEpochChanged: the node's spool started another epoch since the stream's Hello;
                nothing of the batch is stored.
        """
        ...

    async def result(self, node_id: str, result: msgs.AgentResult) -> None:
        """A command's result that nobody on this replica awaits (`AgentStreams.send_command` awaits its own)."""
        ...

    async def connected(self, node_id: str) -> None:
        """A node's stream opened on this replica."""
        ...


class EventLog:
    """Stores event batches on the store thread, each with every other stream's batch waiting then."""

    def __init__(
        self, store: repo.Store, thread: store_thread.StoreThread, controller_metrics: metrics.ControllerMetrics
    ) -> None:
        """Bind to the store, its thread, and the metrics that count batches stored."""
        self._metrics = controller_metrics
        self._batches: group_commit.GroupCommit[tuple[int, list[int]]] = group_commit.GroupCommit(
            "rasd-event-appender", thread.run, store.append_events_many, store.append_events, MAX_EVENT_GROUP
        )

    async def append(self, node_id: str, events: Sequence[repo.StoredEvent]) -> tuple[int, list[int]]:
        """`Store.append_events` on the store thread, together with every other stream's batch waiting then.

        In a burst each agent's stream brings its own small batch: one transaction (and one sync of
        the disk) each kept the store thread busy ~1.5 ms a batch. Grouped, a batch costs ~0.03 ms
        (`Store.append_events_many`). Each caller gets its own outcome once the group's commit
        returned, so an ack still covers only durable events.

        Raises:
            KeyError: the node never said Hello.
            repo.SpoolEpochChanged: see `Store.append_events`.
        """
        return await self._batches.submit(node_id, events)

    async def store_apart(self, batch: EventBatch, *, how: str = "apart") -> TakenEvents:
        """Store a batch on its own (not with a decision); the new events come back for deciding.

        how: why it was stored apart, for ``rasd_event_batches_stored_total`` ("apart": it was not
        the next of its stream; "refused": it was, and the transaction of the decision refused it).
        """
        acked_seq, stored = await self.append(batch.node_id, batch.events)
        self._metrics.event_batches_stored.labels(how=how).inc()
        new_seqs = set(stored)
        fresh = sorted({e.seq: e for e in batch.events if e.seq in new_seqs}.values(), key=lambda e: e.seq)
        return TakenEvents(acked_seq=acked_seq, stored=len(stored), fresh=fresh)


class StoreOnly:
    """The consumer of a replica without remediation: events are stored and acked; results and connections ignored."""

    def __init__(self, event_log: EventLog) -> None:
        """Store events through event_log."""
        self._event_log = event_log

    async def events(self, batch: EventBatch) -> TakenEvents:
        """Store the batch apart (`EventLog.store_apart`)."""
        return await self._event_log.store_apart(batch)

    async def result(self, node_id: str, result: msgs.AgentResult) -> None:
        """Nothing waits for it."""

    async def connected(self, node_id: str) -> None:
        """Nothing to re-send."""


class Deciding:
    """The decisions on events stored apart, each a task of its own that runs whether or not its stream waits.

    The stream may end (agent killed, a newer stream of the node) while a batch is decided: the
    events were stored and acked, so their decision must not depend on that caller still waiting.
    """

    def __init__(self) -> None:
        """No decision yet."""
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, node_id: str, seqs: list[int], decision: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run decision as a task; a failure is logged with the node and seqs (no one may be left to hear of it)."""
        task = asyncio.ensure_future(decision)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._done, node_id, seqs))
        return task

    def tasks(self) -> list[asyncio.Task[None]]:
        """The decisions still running."""
        return list(self._tasks)

    def _done(self, node_id: str, seqs: list[int], task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        log.warning("events_not_decided", node=node_id, seqs=seqs, error=f"{type(error).__name__}: {error}")
