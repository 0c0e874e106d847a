"""The store thread, one dedicated thread that runs every blocking store call of a replica in turn; and read threads.

SQL writes are serialized on it, and the asyncio loop that serves thousands of streams never blocks
on I/O. The ingest, the repair ladder, the relay, the power loop and the audit log all queue their
calls here (each is handed it at construction); whoever built it closes it, after them. Operator
reads go to `ReadThreads` instead, so that no listing holds up a write (an agent's ack).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from typing import Any


class StoreThread:
    """Runs blocking store calls one at a time on a thread of its own."""

    def __init__(self, name: str = "rasd-store") -> None:
        """Create the thread's executor (the thread starts with the first call)."""
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the store thread, after every call queued before it; its result."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @property
    def queued(self) -> int:
        """Calls waiting for the thread (not counting the one it runs)."""
        return self._executor._work_queue.qsize()

    def close(self) -> None:
        """Finish the calls queued, then stop the thread (no call is taken afterwards)."""
        self._executor.shutdown(wait=True)


class ReadsBusy(Exception):
    """More reads wait than `ReadThreads` lets wait: the caller should come back later (RESOURCE_EXHAUSTED)."""


class ReadThreads:
    """Runs blocking reads (operator listings) on threads of their own, never on the store thread.

    Every write, and so every agent's ack, waits its turn on the store thread: a viewer's listing
    there (10,000 events of long messages, 41 MB) held every node's ack behind it, and three viewers
    in a loop pushed a healthy node's ack latency from 8 ms to 17-23 s. SQLite in WAL mode and
    PostgreSQL both serve readers on connections of their own beside the writer, so reads run here:
    `workers` at a time (one by default), at most `max_waiting` queued (more is refused,
    `ReadsBusy`, rather than queued without end), and for at most `busy_share` of the time.

    Why a share: a read is Python work (rows to values to protobuf) that competes with the event
    loop acking events for the interpreter lock and, on a small host, for the CPU. Three viewers
    looping ListEvents kept a read thread busy all the time, and a healthy node's ack p99 went from
    15 ms to 60-130 ms (2 cores, load 4-7; tests/fuzz/test_hostile_clients.py). Reads resting three
    times as long as they ran (a quarter of the time) kept it at 25-34 ms, p50 as with no viewer,
    while each viewer was still served over a thousand events a second.
    """

    def __init__(
        self, workers: int = 1, *, max_waiting: int = 64, busy_share: float = 0.25, name: str = "rasd-reads"
    ) -> None:
        """Create the executor (its threads start with the first reads).

        busy_share: the share of the time reads may run (0 < share <= 1); after a read that took t
        seconds its thread rests t * (1 / share - 1) before the next.
        """
        if not 0 < busy_share <= 1:
            raise ValueError(f"busy_share: {busy_share} is not in (0, 1]")
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._max_waiting = max_waiting
        self._rest_per_busy_s = 1 / busy_share - 1
        self._in_flight = 0

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on a read thread; its result.

        Raises:
            ReadsBusy: `max_waiting` reads already wait (nothing of fn ran).
        """
        if self._in_flight >= self._max_waiting:
            raise ReadsBusy(f"{self._in_flight} reads in flight; retry later")
        self._in_flight += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._paced, fn, *args)
        finally:
            self._in_flight -= 1

    def _paced(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), then this thread rests in proportion to the time it took (`busy_share`)."""
        started = time.perf_counter()
        try:
            return fn(*args)
        finally:
            if self._rest_per_busy_s:
                time.sleep((time.perf_counter() - started) * self._rest_per_busy_s)

    @property
    def in_flight(self) -> int:
        """Reads running or waiting now."""
        return self._in_flight

    def close(self) -> None:
        """Finish the reads queued, then stop the threads."""
        self._executor.shutdown(wait=True)
