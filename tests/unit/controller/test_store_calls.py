"""`ingest.store_calls`: which blocking store call runs on the store thread and which beside it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rasd.controller.ingest import store_calls
from rasd.controller.store import repo
from rasd.controller.store import thread as store_thread


@pytest.fixture(params=["file", "memory"])
def calls(request, tmp_path):
    url = f"sqlite:///{tmp_path / 'rasd.db'}" if request.param == "file" else "sqlite://"
    store = repo.Store.open(url)
    thread = store_thread.StoreThread(name="rasd-store-under-test")
    yield store_calls.StoreCalls(store, thread)
    thread.close()
    store.close()


def test_writes_run_on_the_store_thread_and_reads_beside_it_where_the_store_allows(calls):
    def where() -> str:
        return threading.current_thread().name

    async def scenario() -> tuple[str, str, str]:
        try:
            return (
                await calls.run_in_store(where),
                await calls.run_beside(where),
                await calls.run_read(where),
            )
        finally:
            await calls.close()

    in_store, beside, read = asyncio.run(scenario())

    assert in_store.startswith("rasd-store-under-test")
    if calls.store.reads_beside_writer:  # a file: connections of their own
        assert not beside.startswith("rasd-store-under-test") and not read.startswith("rasd-store-under-test")
        assert beside != read, "a control loop's read is not queued with the operators' reads"
    else:  # in-memory SQLite: each connection would be a database of its own
        assert beside.startswith("rasd-store-under-test") and read.startswith("rasd-store-under-test")
