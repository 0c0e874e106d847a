"""How a replica's services run blocking store calls: on the store thread, or beside it.

Three ways, by who waits and what the call does:

- `run_in_store`: on the store thread, in turn with every write (the ladder's commits, the agents'
  event batches and acks). For writes, and for reads that must see every write queued before them.
- `run_beside`: a control loop's read (the power period's) on a connection of its own where the
  store allows it. The period waits for it, and in a cap wave the store thread is busy with the
  relay's writes and results. Never refused or rationed.
- `run_read`: an operator's listing, on read threads that are bounded and rationed
  (`store_thread.ReadThreads`): a viewer in a loop must not slow the agents' acks.

On an in-memory SQLite store every connection is a database of its own, so both kinds of read
run on the store thread there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from rasd.controller.store import repo
from rasd.controller.store import thread as store_thread


class StoreCalls:
    """The store thread, the operators' read threads, and which call runs where (see the module docstring)."""

    def __init__(self, store: repo.Store, thread: store_thread.StoreThread) -> None:
        """Run on thread; operator reads get threads of their own where the store allows reads beside it."""
        self.store = store
        self.thread = thread
        self._read_threads = store_thread.ReadThreads() if store.reads_beside_writer else None

    async def run_in_store(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking store call on the store thread (serialised with every other write)."""
        return await self.thread.run(fn, *args)

    async def run_beside(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a control loop's blocking read beside the store thread where the store allows it, else on it."""
        return await run_beside(self.store, self.thread, fn, *args)

    async def run_read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking read (an operator's listing) beside the store thread, never on it.

        Raises:
            store_thread.ReadsBusy: too many reads wait already.
        """
        if self._read_threads is None:
            return await self.thread.run(fn, *args)
        return await self._read_threads.run(fn, *args)

    async def close(self) -> None:
        """Close the read threads (the store thread is its builder's to close)."""
        if self._read_threads is not None:
            await asyncio.to_thread(self._read_threads.close)


async def run_beside(store: repo.Store, thread: store_thread.StoreThread, fn: Callable[..., Any], *args: Any) -> Any:
    """`StoreCalls.run_beside` for a service that holds the store and its thread, not the ingest's `StoreCalls`."""
    if store.reads_beside_writer:
        return await asyncio.to_thread(fn, *args)
    return await thread.run(fn, *args)
