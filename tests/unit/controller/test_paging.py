"""Operator listings page: bounded in rows and bytes, resumable, every row once (issue #37 item 10)."""

from __future__ import annotations

import asyncio
import io
import json

import grpc
import pytest

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.cli import main as rasctl
from rasd.controller import server
from rasd.controller.rpc import pages
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo
from rasd.controller.wire import agent as wire

NOW = 1_800_000_000 * 10**9


def _event(node_id, seq, received, message="m"):
    return repo.StoredEvent(node_id, seq, received, received, 1, 0, "", 13, message, "kmsg", {"k": "v"})


def _fill(store, node_id, count, *, same_time=False, message="m"):
    store.register_hello(wire.hello_from_wire(agent_pb.Hello(node_id=node_id, boot_id="b")), NOW)
    store.append_events(
        node_id, [_event(node_id, seq, NOW if same_time else NOW + seq, message) for seq in range(1, count + 1)]
    )


def _all_pages(read, **kwargs):
    pages_read, after = [], None
    while True:
        page = read(after=after, **kwargs)
        pages_read.append(page.items)
        if page.next_after is None:
            return pages_read
        after = page.next_after


@pytest.mark.parametrize("same_time", [False, True])
def test_event_pages_resume_where_they_ended_and_hold_every_event_once(store, same_time):
    _fill(store, "n1", 30, same_time=same_time)
    read = _all_pages(store.events_page, node_id="n1", limit=7)
    assert [len(p) for p in read] == [7, 7, 7, 7, 2]
    seqs = [e.seq for p in read for e in p]
    assert sorted(seqs) == list(range(1, 31)) and len(set(seqs)) == 30
    if not same_time:
        assert seqs == list(range(30, 0, -1))  # newest first


def test_a_page_ends_before_its_byte_budget_but_holds_at_least_one_event(store):
    _fill(store, "n1", 9, message="x" * 1000)
    one = repo.event_bytes(_event("n1", 1, NOW, "x" * 1000))
    read = _all_pages(store.events_page, limit=100, max_bytes=2 * one + 10)
    assert [len(p) for p in read] == [2, 2, 2, 2, 1]
    assert [len(p) for p in _all_pages(store.events_page, limit=100, max_bytes=1)] == [1] * 9


def test_audit_pages_resume_too(store):
    audit = rstore.RemediationStore(store.engine)
    rows = [{"at_unix_ns": NOW + n % 3, "actor": f"a{n}", "action": "x", "outcome": "OK"} for n in range(25)]
    audit.commit(rstore.Commit(now_unix_ns=NOW, audit=rows))
    read = _all_pages(audit.audit_page, limit=10)
    assert [len(p) for p in read] == [10, 10, 5]
    assert sorted(r["actor"] for p in read for r in p) == sorted(r["actor"] for r in rows)


def test_nodes_page_by_id(store):
    for n in range(5):
        store.register_hello(wire.hello_from_wire(agent_pb.Hello(node_id=f"n{n}", boot_id="b")), NOW)
    assert [n.node_id for n in store.list_nodes(limit=2)] == ["n0", "n1"]
    assert [n.node_id for n in store.list_nodes(after="n1", limit=2)] == ["n2", "n3"]
    assert store.list_nodes(after="n4", limit=2) == []


@pytest.mark.parametrize(
    "bad",
    [
        "nonsense!",
        pages.token("audit", (1, 2)),  # another listing's
        "W10=",  # base64 of []
        "eyJhIjoxfQ==",  # {"a": 1}
        pages.token("events", (1, 2)).replace("=", "") + "x" * 2000,
    ],
)
def test_a_page_token_not_made_for_the_listing_is_refused(bad):
    with pytest.raises(pages.BadPageToken, match="page_token"):
        pages.position("events", bad)


def test_page_tokens_round_trip_and_sizes_are_capped():
    assert pages.position("events", pages.token("events", (5, 7))) == (5, 7)
    assert pages.position("nodes", pages.token("nodes", (0, "node-a"))) == (0, "node-a")
    assert pages.token("events", None) == "" and pages.position("events", "") is None
    assert (pages.page_size(0), pages.page_size(10_000), pages.page_size(5)) == (100, 1000, 5)


def test_listings_page_over_grpc_and_rasctl_follows_the_pages(tmp_path):
    async def scenario():
        controller = server.Controller(
            server.ControllerSettings(listen="127.0.0.1:0", db_url=f"sqlite:///{tmp_path / 'r.db'}", metrics_port=None)
        )
        _fill(controller.store, "n1", 1500)
        await controller.start()
        async with grpc.aio.insecure_channel(controller.address) as channel:
            stub = admin_grpc.AdminServiceStub(channel)
            first = await stub.ListEvents(admin_pb.ListEventsRequest(limit=5000))
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await stub.ListEvents(admin_pb.ListEventsRequest(page_token="nonsense"))
            with pytest.raises(grpc.aio.AioRpcError) as too_many:
                await stub.ListEvents(admin_pb.ListEventsRequest(limit=10_001))
        listed = await asyncio.to_thread(_rasctl, controller.address, "events", "--json", "--limit", "1200")
        every = await asyncio.to_thread(_rasctl, controller.address, "events", "--limit", "5000")
        await controller.stop()
        return first, bad.value, too_many.value, listed, every

    first, bad, too_many, listed, every = asyncio.run(scenario())
    assert len(first.events) == pages.MAX_PAGE_SIZE and first.next_page_token
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in bad.details()
    assert too_many.code() == grpc.StatusCode.INVALID_ARGUMENT
    code, out, err = listed
    assert code == 0 and len(json.loads(out)) == 1200 and "more than 1200" in err
    code, out, err = every
    assert code == 0 and len(out.splitlines()) == 1 + 1500 and not err


def _rasctl(address, *argv):
    out, err = io.StringIO(), io.StringIO()
    return rasctl.run(["--controller", address, *argv], out, err), out.getvalue(), err.getvalue()
