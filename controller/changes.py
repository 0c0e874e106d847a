"""What changed in the controller, fanned out to the operators watching it (AdminService ``Watch*``).

Publishers are the ingest's consumer (`Watched`: new events, and the nodes they came from; with
lease election the leader's relay, as it takes every replica's events from the store) and the
ladder's commits (`Changes.publish_commit`: incidents, repair tickets and the nodes whose state
moved). A publisher never waits on a watcher: `publish` hands the items to the event loop
(thread-safe, the ladder commits on the store thread) and returns; on the loop each watcher's queue
is bounded (`max_queued`), and a watcher whose queue is full loses what it held and is marked to
resync (its RPC re-reads the current state from the store and says so), so a slow operator's
terminal never holds up ingestion or decisions. The number of watchers is capped (`TooManyWatchers`).
With no watcher, publishing costs a dict lookup.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rasd.controller.ingest import consumer as consumer_mod
from rasd.controller.ingest import streams as streams_mod

KINDS = ("nodes", "events", "incidents", "repairs")
"""What can be watched. Items: node ids (or `Disconnected`), `repo.StoredEvent`, incident and ticket rows (dicts)."""
MAX_WATCHERS = 64
"""Watch RPCs open at once, all kinds together; one more is refused (RESOURCE_EXHAUSTED)."""
MAX_QUEUED = 1024
"""Items a watcher may hold unsent; one more drops them all and marks the watcher to resync."""


@dataclasses.dataclass(frozen=True)
class Disconnected:
    """A node's stream on this replica closed.

    Published before the store records it: the reader must not take the store's "connected" for the truth.
    """

    node_id: str


class TooManyWatchers(Exception):
    """`MAX_WATCHERS` watch RPCs are open already."""


@dataclasses.dataclass(eq=False)
class Watcher:
    """One watch RPC's queue: items of its kind, in publishing order, or a resync mark."""

    kind: str
    max_queued: int
    items: collections.deque[Any] = dataclasses.field(default_factory=collections.deque)
    resync: bool = False
    """It fell behind: what it held was dropped; the RPC must re-read the current state."""
    resyncs: int = 0
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def offer(self, items: Sequence[Any]) -> None:
        """Queue items, or drop everything and mark a resync when they would pass `max_queued`. Never waits."""
        if self.resync or len(self.items) + len(items) > self.max_queued:
            self.items.clear()
            if not self.resync:
                self.resyncs += 1
            self.resync = True
        else:
            self.items.extend(items)
        self.wake.set()

    async def take(self) -> tuple[list[Any], bool]:
        """Wait for items or a resync; returns (the items queued, whether to resync) and empties the queue."""
        await self.wake.wait()
        self.wake.clear()
        items, resync = list(self.items), self.resync
        self.items.clear()
        self.resync = False
        return items, resync


class Changes:
    """The watchers of one controller replica and the fan-out to them."""

    def __init__(self, *, max_watchers: int = MAX_WATCHERS, max_queued: int = MAX_QUEUED) -> None:
        """No watcher yet."""
        self.max_watchers = max_watchers
        self.max_queued = max_queued
        self._watchers: dict[str, set[Watcher]] = {kind: set() for kind in KINDS}
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, kind: str) -> Watcher:
        """A new watcher of kind (call on the event loop; `close` it when its RPC ends).

        Raises:
            TooManyWatchers: `max_watchers` are open.
        """
        if sum(len(w) for w in self._watchers.values()) >= self.max_watchers:
            raise TooManyWatchers(f"{self.max_watchers} watches are open on this controller; retry later")
        self._loop = asyncio.get_running_loop()
        watcher = Watcher(kind, self.max_queued)
        self._watchers[kind].add(watcher)
        return watcher

    def close(self, watcher: Watcher) -> None:
        """Forget a watcher."""
        self._watchers[watcher.kind].discard(watcher)

    def watchers(self, kind: str) -> int:
        """How many watch kind now."""
        return len(self._watchers[kind])

    def publish(self, kind: str, items: Iterable[Any]) -> None:
        """Hand items to kind's watchers on the event loop; from any thread, never blocking."""
        if not self._watchers[kind] or self._loop is None:
            return
        batch = tuple(items)
        if batch:
            self._loop.call_soon_threadsafe(self._deliver, kind, batch)

    def _deliver(self, kind: str, batch: tuple[Any, ...]) -> None:
        for watcher in list(self._watchers[kind]):
            watcher.offer(batch)

    def publish_events(self, events: Sequence[Any]) -> None:
        """New stored events (`repo.StoredEvent`), and the nodes they came from."""
        if events:
            self.publish("events", events)
            self.publish("nodes", sorted({event.node_id for event in events}))

    def publish_commit(self, change: Any) -> None:
        """A remediation transaction committed (`rstore.Commit`): its incidents, tickets and nodes.

        Called on the store thread for every commit: with no watcher it returns at once.
        """
        if not any(self._watchers.values()):
            return
        self.publish("incidents", (record.row() for record in change.incidents))
        self.publish("repairs", (record.row() for record in change.tickets))
        nodes = {*change.node_states, *(q.node_id for q in change.quarantines)}
        nodes.update(record.node_id for record in (*change.incidents, *change.tickets))
        self.publish("nodes", sorted(nodes))


class Watched:
    """An ingest consumer that also publishes the events it made durable, and the nodes that connected."""

    def __init__(self, inner: consumer_mod.IngestConsumer, changes: Changes, *, events: bool = True) -> None:
        """Pass everything on to inner; publish to changes.

        events: False where the events reach the watchers another way (with lease election the
        leader publishes every replica's as its relay takes them from the store, `Changes.publish_events`).
        """
        self.inner = inner
        self.changes = changes
        self._events = events

    async def events(self, batch: consumer_mod.EventBatch) -> consumer_mod.TakenEvents:
        """`IngestConsumer.events`, then the new events (and their node) go to the watchers."""
        taken = await self.inner.events(batch)
        if taken.fresh and self._events:
            self.changes.publish_events(taken.fresh)
        return taken

    async def result(self, node_id: str, result: Any) -> None:
        """`IngestConsumer.result`."""
        await self.inner.result(node_id, result)

    async def connected(self, node_id: str) -> None:
        """`IngestConsumer.connected`, then the node goes to the watchers."""
        await self.inner.connected(node_id)
        self.changes.publish("nodes", (node_id,))


class WatchedStreams(streams_mod.AgentStreams):
    """The replica's agent streams; one that closes tells the node watchers that its node went offline."""

    def __init__(self, changes: Changes, *, clock: Callable[[], int]) -> None:
        """`streams_mod.AgentStreams`, publishing to changes."""
        super().__init__(clock=clock)
        self.changes = changes

    def close(self, session: streams_mod.Session) -> bool:
        """`AgentStreams.close`; the node goes to the watchers when it was its current stream."""
        current = super().close(session)
        if current:
            self.changes.publish("nodes", (Disconnected(session.node_id),))
        return current
