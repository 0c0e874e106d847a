"""Health events ahead of telemetry on the steps both pass through: the event loop and the store thread.

A fault's batch crosses the replica's one event loop several times (read, stored, decided,
committed, dispatched) and its store thread at least once. At 2,048 nodes a second's telemetry
summaries (2,048 messages, 16,384 GPUs) and the latest view's flush (16,384 rows every 5 s) sat in
front of each crossing, and a batch's receive → ack took 264 ms on average (12 ms at 1,024 nodes).
So telemetry work that can wait does:

- `EventsFirst` counts the event batches between their arrival and their decision; absorbing
  summaries and flushing the latest view wait while any is in flight, up to a bound, so that a
  storm of events cannot starve the power loop's view of the fleet.
- `PendingSummaries` holds the summaries read and not absorbed yet, per node in arrival order. Nothing
  is dropped: when a node has `per_node` waiting, its oldest is handed back to be absorbed at once.
- `Absorber` absorbs them, a slice of nodes a turn, each turn behind the batches in flight.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import structlog

log = structlog.get_logger("rasd.controller")

ItemT = TypeVar("ItemT")


class EventsFirst:
    """The event batches in flight on this replica, and the telemetry work's turn behind them."""

    def __init__(self, *, max_wait_s: float = 0.5) -> None:
        """No batch in flight; telemetry waits max_wait_s at most for one turn (the power loop needs the latest)."""
        self.max_wait_s = max_wait_s
        self._in_flight = 0
        self._clear = asyncio.Event()
        self._clear.set()
        self.overdue_turns = 0
        """Turns telemetry took after waiting max_wait_s with batches still in flight."""

    @property
    def in_flight(self) -> int:
        """Event batches between their arrival and their decision now."""
        return self._in_flight

    @contextlib.contextmanager
    def event_batch(self) -> Iterator[None]:
        """One event batch in flight for the duration of the block."""
        self._in_flight += 1
        self._clear.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._clear.set()

    async def telemetry_turn(self) -> None:
        """Return once no event batch is in flight, or after max_wait_s (counted in `overdue_turns`)."""
        if not self._in_flight:
            return
        try:
            await asyncio.wait_for(self._clear.wait(), self.max_wait_s)
        except TimeoutError:
            self.overdue_turns += 1


class PendingSummaries(Generic[ItemT]):
    """Items (summaries) read and not absorbed yet: per node, in arrival order; nodes in the order they first waited."""

    def __init__(self, *, per_node: int = 4) -> None:
        """Empty; a node holds per_node summaries waiting at most (a newer one pushes its oldest out to be absorbed)."""
        if per_node < 1:
            raise ValueError(f"per_node: {per_node} is not at least 1")
        self.per_node = per_node
        self._by_node: dict[str, collections.deque[ItemT]] = {}
        self._count = 0
        self.ready = asyncio.Event()
        """Set while something waits."""

    def __len__(self) -> int:
        return self._count

    def put(self, node_id: str, item: ItemT) -> ItemT | None:
        """Queue item behind node_id's others; returns the node's oldest when it had per_node waiting (absorb it)."""
        waiting = self._by_node.get(node_id)
        if waiting is None:
            waiting = self._by_node[node_id] = collections.deque()
        pushed_out = waiting.popleft() if len(waiting) >= self.per_node else None
        if pushed_out is None:
            self._count += 1
        waiting.append(item)
        self.ready.set()
        return pushed_out

    def take(self, max_nodes: int) -> list[ItemT]:
        """Everything waiting of the first max_nodes nodes, each node's in arrival order."""
        taken: list[ItemT] = []
        for node_id in list(itertools.islice(self._by_node, max_nodes)):
            taken.extend(self._by_node.pop(node_id))
        self._count -= len(taken)
        if not self._by_node:
            self.ready.clear()
        return taken


class Absorber(Generic[ItemT]):
    """Absorbs what nodes' streams read (`put`) once no event batch is in flight, a slice of nodes a turn."""

    def __init__(
        self,
        absorb: Callable[[ItemT], None],
        events_first: EventsFirst,
        *,
        pushed_out: Callable[[], None],
        per_node: int = 4,
        slice_nodes: int = 128,
    ) -> None:
        """absorb: takes one item in (it must not block); pushed_out: counts an item absorbed at once under pressure."""
        self._absorb_one = absorb
        self._events_first = events_first
        self._pushed_out = pushed_out
        self._slice_nodes = slice_nodes
        self.pending: PendingSummaries[ItemT] = PendingSummaries(per_node=per_node)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Absorb from now on in turns (until then every item is absorbed as it is put)."""
        self._task = asyncio.create_task(self._absorb_forever(), name="rasd-summary-absorber")

    async def stop(self) -> None:
        """Stop taking turns, and absorb what waits (so that a final flush writes it)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._absorb(len(self.pending))

    def put(self, node_id: str, item: ItemT) -> None:
        """Queue node_id's item for its turn; absorbed at once when no turns are taken (not started, or stopped)."""
        if self._task is None or self._task.done():
            self._absorb_one(item)
            return
        pushed_out = self.pending.put(node_id, item)
        if pushed_out is not None:
            self._pushed_out()
            self._absorb_one(pushed_out)

    async def _absorb_forever(self) -> None:
        while True:
            await self.pending.ready.wait()
            await self._events_first.telemetry_turn()
            self._absorb(self._slice_nodes)
            await asyncio.sleep(0)  # the loop's other work (a batch that just arrived) between slices

    def _absorb(self, max_nodes: int) -> None:
        for item in self.pending.take(max_nodes):
            try:
                self._absorb_one(item)
            except Exception as exc:  # one node's bad summary must not stop everyone's
                log.error("summary_not_absorbed", error=f"{type(exc).__name__}: {exc}")
