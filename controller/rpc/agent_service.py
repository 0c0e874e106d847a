"""AgentService servicer: one bidirectional stream per node, kept thin.

Reads messages, hands each to the ingest service, and writes what the ingest queues for the node
(Welcome, acks, commands). Status codes are documented on the RPC in agent_service.proto.
"""

from __future__ import annotations

import asyncio

import grpc
import structlog

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.controller import ingest, recording, wire

log = structlog.get_logger("rasd.controller")


class AgentService(agent_grpc.AgentServiceServicer):
    """Serves AgentService.Connect."""

    def __init__(self, service: ingest.Ingest, *, recorder: recording.Recorder | None = None) -> None:
        """Bind to the ingest service; with a recorder, every inbound message and sent command is recorded."""
        self._ingest = service
        self._recorder = recorder

    async def Connect(self, request_iterator, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
        """Run one node's stream until either side ends it."""
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("payload") != "hello":
            self._ingest.metrics.rejected("payload")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "payload: the first message must be Hello")
        self._ingest.metrics.agent_messages.labels(kind="hello").inc()
        try:
            session, welcome = await self._ingest.open_session(first.hello)
        except wire.WireError as exc:
            self._ingest.metrics.rejected(exc.field)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if self._recorder is not None:
            self._recorder.inbound(session.session_id, session.node_id, first)
        await context.write(welcome)
        writer = asyncio.create_task(self._write(session, context))
        reader = asyncio.create_task(self._read(session, context))
        try:
            done, _ = await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done and reader.exception() is None:
                # The agent half-closed: deliver what is queued (acks), then end.
                session.outbound.put_nowait(None)
                await asyncio.wait_for(writer, timeout=5.0)
            for task in done:
                error = task.exception()
                if isinstance(error, wire.WireError):
                    self._ingest.metrics.rejected(error.field)
                    log.warning("agent_message_rejected", node=session.node_id, field=error.field, error=str(error))
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
                if error is not None:
                    raise error
            if session.replaced:
                await context.abort(grpc.StatusCode.ABORTED, "a newer stream for this node replaced this one")
        finally:
            if self._recorder is not None:  # first, before any await a cancelled call may not survive
                self._recorder.closed(session.session_id, session.node_id)
            for task in (writer, reader):
                task.cancel()
            await asyncio.gather(writer, reader, return_exceptions=True)
            await self._ingest.close_session(session)

    async def _read(self, session: ingest.Session, context: grpc.aio.ServicerContext) -> None:
        metrics = self._ingest.metrics
        while True:
            message: agent_pb.AgentMessage = await context.read()
            if message is grpc.aio.EOF:
                return
            if self._recorder is not None:
                self._recorder.inbound(session.session_id, session.node_id, message)
            kind = message.WhichOneof("payload")
            metrics.agent_messages.labels(kind=kind or "empty").inc()
            if kind == "telemetry":
                self._ingest.on_telemetry(session, message.telemetry)
            elif kind == "events":
                await self._ingest.on_events(session, message.events)
            elif kind == "action_result":
                self._ingest.on_result(session, message.action_result)
            elif kind == "heartbeat":
                self._ingest.on_heartbeat(session, message.heartbeat)
            elif kind == "hello":
                raise wire.WireError("hello", "Hello may only be the first message of a stream")
            else:
                raise wire.WireError("payload", "empty or unknown payload")

    async def _write(self, session: ingest.Session, context: grpc.aio.ServicerContext) -> None:
        while True:
            message = await session.outbound.get()
            if message is None:
                return
            if self._recorder is not None and message.HasField("command"):
                self._recorder.outbound_command(session.session_id, session.node_id, message.command)
            await context.write(message)
