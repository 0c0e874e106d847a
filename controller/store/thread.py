"""The store thread: one dedicated thread that runs every blocking store call of a replica, in turn.

SQL writes are serialized on it, and the asyncio loop that serves thousands of streams never blocks
on I/O. The ingest, the repair ladder, the relay, the power loop and the audit log all queue their
calls here (each is handed it at construction); whoever built it closes it, after them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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
