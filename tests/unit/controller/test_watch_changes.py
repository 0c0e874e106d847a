"""The watch fan-out (`rasd.controller.changes`): bounded per watcher, never blocking a publisher,
a slow watcher dropped to a resync, a cap on watchers, and what a ladder commit publishes."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rasd.controller import changes
from rasd.controller.store import records
from rasd.controller.store import remediation as rstore


def _run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_a_watcher_takes_what_was_published_in_order():
    async def scenario() -> tuple[list[object], bool]:
        hub = changes.Changes()
        watcher = hub.watch("events")
        hub.publish("events", [1, 2])
        hub.publish("events", [3])
        hub.publish("incidents", ["not for this watcher"])
        await asyncio.sleep(0)
        return await watcher.take()

    assert _run(scenario()) == ([1, 2, 3], False)


def test_publishing_without_watchers_costs_nothing_and_needs_no_loop():
    hub = changes.Changes()
    hub.publish("events", iter(lambda: pytest.fail("items are not read without a watcher"), None))


def test_a_full_queue_drops_everything_and_marks_a_resync_without_blocking_the_publisher():
    async def scenario() -> tuple[tuple[list[object], bool], int, tuple[list[object], bool]]:
        hub = changes.Changes(max_queued=3)
        watcher = hub.watch("events")
        for i in range(10):  # the watcher does not read meanwhile
            hub.publish("events", [i])
        await asyncio.sleep(0)
        first = await watcher.take()
        hub.publish("events", ["after"])
        await asyncio.sleep(0)
        return first, watcher.resyncs, await watcher.take()

    first, resyncs, after = _run(scenario())
    assert first == ([], True) and resyncs == 1
    assert after == (["after"], False), "after a resync the changes come again"


def test_publishing_from_another_thread_reaches_the_loop():
    async def scenario() -> tuple[list[object], bool]:
        hub = changes.Changes()
        watcher = hub.watch("repairs")
        thread = threading.Thread(target=hub.publish, args=("repairs", [{"ticket_id": "t1"}]))
        thread.start()
        thread.join()
        return await asyncio.wait_for(watcher.take(), 5)

    assert _run(scenario()) == ([{"ticket_id": "t1"}], False)


def test_watchers_are_capped_and_closing_one_frees_its_place():
    async def scenario() -> None:
        hub = changes.Changes(max_watchers=2)
        first = hub.watch("nodes")
        hub.watch("events")
        with pytest.raises(changes.TooManyWatchers, match="2 watches are open"):
            hub.watch("repairs")
        hub.close(first)
        assert hub.watchers("nodes") == 0
        hub.watch("repairs")

    _run(scenario())


def test_a_commit_publishes_its_incidents_tickets_and_the_nodes_they_touch():
    async def scenario() -> dict[str, list[object]]:
        hub = changes.Changes()
        watchers = {kind: hub.watch(kind) for kind in changes.KINDS}
        change = rstore.Commit(
            now_unix_ns=1,
            incidents=[records.IncidentRecord(incident_id="i1", node_id="n1", cause="xid:48")],
            tickets=[records.TicketRecord(ticket_id="t1", node_id="n2", state="open")],
            quarantines=[records.QuarantineRecord(node_id="n3", reason="r", source="automation")],
        )
        hub.publish_commit(change)
        await asyncio.sleep(0)
        return {kind: (await asyncio.wait_for(w.take(), 5))[0] for kind, w in watchers.items() if kind != "events"}

    taken = _run(scenario())
    assert [row["incident_id"] for row in taken["incidents"]] == ["i1"]
    assert [row["ticket_id"] for row in taken["repairs"]] == ["t1"]
    assert taken["nodes"] == ["n1", "n2", "n3"]


def test_new_events_go_to_event_watchers_and_their_nodes_to_node_watchers():
    class Event:
        def __init__(self, node_id: str, seq: int) -> None:
            self.node_id, self.seq = node_id, seq

    async def scenario() -> tuple[list[object], list[object]]:
        hub = changes.Changes()
        events, nodes = hub.watch("events"), hub.watch("nodes")
        batch = [Event("n2", 1), Event("n1", 7), Event("n2", 2)]
        hub.publish_events(batch)
        hub.publish_events([])
        await asyncio.sleep(0)
        return [(e.node_id, e.seq) for e in (await events.take())[0]], (await nodes.take())[0]

    assert _run(scenario()) == ([("n2", 1), ("n1", 7), ("n2", 2)], ["n1", "n2"])
