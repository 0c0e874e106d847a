"""AdminService servicer: the RPCs rasctl calls. Kept thin: validate, call the service, convert.

RPCs whose capability has not been built yet (repairs, quarantine, validation, power policy,
RMA, audit) are answered UNIMPLEMENTED by the generated base class, naming nothing that pretends
to work. Each arrives with its issue.
"""

from __future__ import annotations

import grpc

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.controller import ingest, wire

MAX_LIST_LIMIT = 10_000


class AdminService(admin_grpc.AdminServiceServicer):
    """Serves the operator API."""

    def __init__(self, service: ingest.Ingest) -> None:
        """Bind to the ingest service."""
        self._ingest = service

    async def ListNodes(
        self, request: admin_pb.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListNodesResponse:
        """Every node with its GPUs and latest power."""
        nodes = await self._ingest.list_nodes(dict(request.label_selector))
        return admin_pb.ListNodesResponse(nodes=[wire.node_status_to_wire(n) for n in nodes])

    async def GetNode(
        self, request: admin_pb.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.GetNodeResponse:
        """One node and its 50 most recent events."""
        if not request.node_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node_id: required")
        nodes = [n for n in await self._ingest.list_nodes() if n.node_id == request.node_id]
        if not nodes:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"node_id: {request.node_id!r} never connected")
        events = await self._ingest.list_events(node_id=request.node_id, since_unix_ns=0, limit=50)
        return admin_pb.GetNodeResponse(
            node=wire.node_status_to_wire(nodes[0]),
            recent_events=[wire.stored_event_to_wire(e) for e in events],
        )

    async def ListEvents(
        self, request: admin_pb.ListEventsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb.ListEventsResponse:
        """Stored health events, newest first."""
        if request.limit > MAX_LIST_LIMIT:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit: at most {MAX_LIST_LIMIT}")
        events = await self._ingest.list_events(
            node_id=request.node_id, since_unix_ns=request.since_unix_ns, limit=request.limit or 100
        )
        return admin_pb.ListEventsResponse(events=[wire.stored_event_to_wire(e) for e in events])
