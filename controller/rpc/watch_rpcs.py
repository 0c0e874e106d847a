"""The AdminService watches (``rasctl get nodes|events|incidents|repairs --watch``): server-streaming RPCs.

Each watch is a watcher of the replica's `rasd.controller.changes.Changes`, subscribed before
anything is read, so nothing published after the RPC began is missed. Items are converted and sent
as they come; a watcher that fell behind (its queue passed its bound while the caller read slowly)
gets one answer marked ``resync`` that holds the current state re-read from the store, a page at
most, and then the changes again. Who may watch is decided in `authz` (viewer, as the listings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import grpc

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.controller import changes as changes_mod
from rasd.controller.core import fleet
from rasd.controller.ingest import service as ingest
from rasd.controller.remediation import service as remediation_mod
from rasd.controller.rpc import pages
from rasd.controller.wire import agent as wire

ANSWER_ITEMS = pages.MAX_PAGE_SIZE
"""Items one answer carries at most (more are sent in several)."""

AnswerT = TypeVar("AnswerT")


class _Servicer(Protocol):
    """What the watches need of the AdminService they are part of."""

    _ingest: ingest.Ingest
    _remediation: remediation_mod.RemediationService | None
    _changes: changes_mod.Changes

    async def _read(self, context: grpc.aio.ServicerContext, read: Callable[[], AnswerT]) -> AnswerT: ...

    async def _need_remediation(self, context: grpc.aio.ServicerContext) -> remediation_mod.RemediationService: ...


def _offline(node: fleet.NodeStatus) -> fleet.NodeStatus:
    """node, its stream closed here: the store may not say so yet (`changes.Disconnected`)."""
    return dataclasses.replace(node, connected=False, state=fleet.effective_node_state(node.state, connected=False))


def _chunks(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[i : i + ANSWER_ITEMS] for i in range(0, len(items), ANSWER_ITEMS)]


async def _stream(
    servicer: _Servicer,
    context: grpc.aio.ServicerContext,
    kind: str,
    answer: Callable[[list[Any], bool], Awaitable[list[Any]]],
    first: Callable[[], Awaitable[list[Any]]] | None = None,
) -> None:
    """Write answer(items, resync) for each batch the watcher takes, until the caller cancels.

    first: the answers to send before the changes (subscribed already, so none falls between).
    """
    try:
        watcher = servicer._changes.watch(kind)
    except changes_mod.TooManyWatchers as exc:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        raise  # unreachable: abort raises
    try:
        for message in await first() if first is not None else []:
            await context.write(message)
        while True:
            items, resync = await watcher.take()
            for message in await answer(items, resync):
                await context.write(message)
    finally:
        servicer._changes.close(watcher)


class WatchRpcs:
    """The Watch* methods of `admin_service.AdminService` (a mixin: it holds the state they read)."""

    async def WatchEvents(
        self: _Servicer, request: admin_pb.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Events as they are stored, oldest first; those since request.since_unix_ns first."""
        store = self._ingest.store
        last_received = [request.since_unix_ns]
        first_sent: set[tuple[str, int]] = set()
        """The events sent first: one stored as the watch began may come again from the fan-out."""

        async def since(since_unix_ns: int, resync: bool) -> list[admin_pb.WatchEventsResponse]:
            page = await self._read(
                context,
                lambda: store.events_page(node_id=request.node_id, since_unix_ns=since_unix_ns,
                                          limit=pages.MAX_PAGE_SIZE, max_bytes=pages.PAGE_BYTES),
            )  # fmt: skip
            return events(list(reversed(page.items)), resync) or (
                [admin_pb.WatchEventsResponse(resync=True)] if resync else []
            )

        def events(items: list[Any], resync: bool) -> list[admin_pb.WatchEventsResponse]:
            items = [e for e in items if not request.node_id or e.node_id == request.node_id]
            if not resync:
                items = [e for e in items if (e.node_id, e.seq) not in first_sent]
            if items:
                last_received[0] = max(last_received[0], max(e.received_unix_ns for e in items))
            return [
                admin_pb.WatchEventsResponse(events=[wire.stored_event_to_wire(e) for e in chunk], resync=resync)
                for chunk in _chunks(items)
            ]

        async def answer(items: list[Any], resync: bool) -> list[admin_pb.WatchEventsResponse]:
            return await since(last_received[0], True) if resync else events(items, False)

        async def first() -> list[admin_pb.WatchEventsResponse]:
            if request.since_unix_ns <= 0:
                return []
            answers = await since(request.since_unix_ns, False)
            first_sent.update((e.node_id, e.event.seq) for a in answers for e in a.events)
            return answers

        await _stream(self, context, "events", answer, first)

    async def WatchIncidents(
        self: _Servicer, request: admin_pb.WatchIncidentsRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Incidents as the ladder writes them; a resync is the newest page."""
        store = (await self._need_remediation(context)).store

        async def answer(rows: list[dict[str, Any]], resync: bool) -> list[admin_pb.WatchIncidentsResponse]:
            if resync:
                page = await self._read(context, lambda: store.incidents_page(node_id=request.node_id,
                                        limit=pages.MAX_PAGE_SIZE, max_bytes=pages.PAGE_BYTES))  # fmt: skip
                rows = list(reversed(page.items))
            rows = [r for r in rows if not request.node_id or r["node_id"] == request.node_id]
            chunks = _chunks([wire.incident_to_wire(r) for r in rows]) or ([[]] if resync else [])
            return [admin_pb.WatchIncidentsResponse(incidents=chunk, resync=resync) for chunk in chunks]

        await _stream(self, context, "incidents", answer)

    async def WatchRepairs(
        self: _Servicer, request: admin_pb.WatchRepairsRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Repair tickets as the ladder writes them; a resync is the most recently updated page."""
        store = (await self._need_remediation(context)).store

        async def answer(rows: list[dict[str, Any]], resync: bool) -> list[admin_pb.WatchRepairsResponse]:
            if resync:
                page = await self._read(context, lambda: store.tickets_page(node_id=request.node_id,
                                        limit=pages.MAX_PAGE_SIZE, max_bytes=pages.PAGE_BYTES))  # fmt: skip
                rows = list(reversed(page.items))
            rows = [r for r in rows if not request.node_id or r["node_id"] == request.node_id]
            chunks = _chunks([wire.repair_to_wire(r) for r in rows]) or ([[]] if resync else [])
            return [admin_pb.WatchRepairsResponse(repairs=chunk, resync=resync) for chunk in chunks]

        await _stream(self, context, "repairs", answer)

    async def WatchNodes(
        self: _Servicer, request: admin_pb.WatchNodesRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Nodes that connected, disconnected, or whose state or events changed, each as it is now.

        A resync is the fleet's first page.
        """
        selector = dict(request.label_selector)
        ingest_service = self._ingest

        async def answer(items: list[Any], resync: bool) -> list[admin_pb.WatchNodesResponse]:
            if resync:
                listed = await self._read(context, lambda: ingest_service.store.list_nodes(limit=pages.MAX_PAGE_SIZE))
                nodes = [ingest_service.overlaid(n) for n in listed]
            else:
                gone = {i.node_id for i in items if isinstance(i, changes_mod.Disconnected)}
                node_ids = {i.node_id if isinstance(i, changes_mod.Disconnected) else i for i in items}
                nodes = [_offline(n) if n.node_id in gone and n.node_id not in ingest_service.sessions else n
                         for n in await ingest_service.list_nodes(node_ids=sorted(node_ids))]  # fmt: skip
            nodes = [n for n in nodes if not selector or fleet.matches_selector(n.labels, selector)]
            chunks = _chunks([wire.node_status_to_wire(n) for n in nodes]) or ([[]] if resync else [])
            return [admin_pb.WatchNodesResponse(nodes=chunk, resync=resync) for chunk in chunks]

        await _stream(self, context, "nodes", answer)
