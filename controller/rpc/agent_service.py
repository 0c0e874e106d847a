"""AgentService servicer: one bidirectional stream per node, kept thin.

Reads messages, checks each at the edge (``rasd.controller.rpc.validate_input``: fields, identity,
pacing), hands it to the ingest service, and writes what the ingest queues for the node (Welcome,
acks, commands). Status codes are documented on the RPC in agent_service.proto.

The caller was authenticated by the auth interceptor (``rasd.controller.rpc.authz``); on a TLS
controller its node certificate fixes which node the stream may speak for.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable

import grpc
import structlog

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import agent_service_pb2_grpc as agent_grpc
from rasd.controller.ingest import service as ingest
from rasd.controller.observability import audit, recording
from rasd.controller.rpc import authz, store_outage, validate_input
from rasd.controller.store import repo
from rasd.controller.wire import agent as wire
from rasd.controller.wire import commands as wire_commands
from rasd.controller.wire import stream as wire_stream

log = structlog.get_logger("rasd.controller")


class AgentService(agent_grpc.AgentServiceServicer):
    """Serves AgentService.Connect."""

    def __init__(
        self,
        service: ingest.Ingest,
        *,
        limits: validate_input.InputLimits | None = None,
        security_metrics: authz.SecurityMetrics | None = None,
        audit_log: audit.AuditLog | None = None,
        recorder: recording.Recorder | None = None,
    ) -> None:
        """Bind to the ingest, the input limits, and where denials are counted, audited and recorded.

        With a recorder, every inbound message and sent command is recorded too.
        """
        self._ingest = service
        self._limits = limits or validate_input.InputLimits()
        self._security = security_metrics
        self._audit = audit_log
        self._recorder = recorder
        self._closing: set[asyncio.Future[None]] = set()
        """Session clean-ups in flight (held so that a cancelled call's clean-up is not collected)."""

    def identity(self) -> validate_input.StreamIdentity:
        """What the current stream may speak for (its node certificate; nothing on plaintext)."""
        principal = authz.current_principal()
        node_id = principal.node_id if principal is not None and principal.kind == "node" else None
        return validate_input.StreamIdentity(node_id=node_id, gpu_owners=self._ingest.gpu_nodes)

    async def _deny_identity(
        self, context: grpc.aio.ServicerContext, error: validate_input.IdentityError, kind: str, claimed: str
    ) -> None:
        if self._security is not None:
            self._security.identity_rejections.labels(kind=kind).inc()
        recorded = True
        if self._audit is not None:
            recorded = await self._audit.record_denial(
                actor=authz.actor(),
                peer=context.peer() or "",
                action="AgentService.Connect",
                node_id=claimed,
                reason=str(error),
                outcome=f"denied:{grpc.StatusCode.PERMISSION_DENIED.name}",
                details={"kind": kind, "field": error.field[:200]},
            )
        if recorded:
            log.warning("agent_identity_denied", actor=authz.actor(), kind=kind, field=error.field, error=str(error))
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(error))

    async def Connect(self, request_iterator, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
        """Run one node's stream until either side ends it."""
        try:
            first = await asyncio.wait_for(context.read(), self._limits.hello_timeout_s)
        except TimeoutError:
            self._ingest.metrics.rejected("hello")
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"hello: none within {self._limits.hello_timeout_s:g} s of opening the stream",
            )
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("payload") != "hello":
            self._ingest.metrics.rejected("payload")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "payload: the first message must be Hello")
        self._ingest.metrics.agent_messages.labels(kind="hello").inc()
        identity = self.identity()
        try:
            validate_input.check_hello(first.hello, identity)
        except validate_input.IdentityError as exc:
            await self._deny_identity(context, exc, "hello", first.hello.node_id[:253])
        except wire.WireError as exc:
            self._ingest.metrics.rejected(exc.field)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            node_hello = wire.hello_from_wire(first.hello)
            session, welcome = await self._ingest.open_session(
                node_hello, sent_unix_ns=first.hello.sent_unix_ns, certified=identity.node_id is not None
            )
        except wire.WireError as exc:
            self._ingest.metrics.rejected(exc.field)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except repo.GpuClaimRefused as exc:  # another node's GPU, by the store's record (any replica, any restart)
            claim = validate_input.IdentityError(exc.field, exc.problem)
            await self._deny_identity(context, claim, "hello", first.hello.node_id[:253])
        except repo.STORE_UNAVAILABLE as exc:
            await store_outage.abort_unavailable(
                context, exc, "store_unavailable_stream_ended", node=first.hello.node_id[:253]
            )
        if self._security is not None:
            self._security.stream_opened(mutual_tls=identity.node_id is not None)
        if self._recorder is not None:
            self._recorder.inbound(session.session_id, session.node_id, first)
        await context.write(wire_stream.welcome_message(welcome))
        writer = asyncio.create_task(self._write(session, context))
        reader = asyncio.create_task(self._read(session, context, identity))
        try:
            done, _ = await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done and reader.exception() is None:
                # The agent half-closed: deliver what is queued (acks), then end.
                session.outbound.put_nowait(None)
                await asyncio.wait_for(writer, timeout=5.0)
            for task in done:
                error = task.exception()
                if error is not None:
                    await self._end_for(context, session, error)
            if session.replaced:
                await context.abort(grpc.StatusCode.ABORTED, "a newer stream for this node replaced this one")
        finally:
            if self._recorder is not None:  # first, before any await a cancelled call may not survive
                self._recorder.closed(session.session_id, session.node_id)
            for task in (writer, reader):
                task.cancel()
            # The call can be cancelled again while this block awaits (the client went away, then the
            # server shuts the call down): the session must be closed all the same, or the node stays
            # "connected" forever and its power and commands go nowhere. So the clean-up runs as its
            # own task, shielded from this one's cancellation.
            cleanup = asyncio.ensure_future(self._close(session, writer, reader))
            self._closing.add(cleanup)
            cleanup.add_done_callback(self._closing.discard)
            await asyncio.shield(cleanup)

    async def _end_for(self, context: grpc.aio.ServicerContext, session: ingest.Session, error: BaseException) -> None:
        """End the call with the status that says why one half of the stream failed; raises always."""
        if isinstance(error, validate_input.IdentityError):
            await self._deny_identity(context, error, error.field.split(".", 1)[0], session.node_id)
        if isinstance(error, wire.WireError):
            self._ingest.metrics.rejected(error.field)
            log.warning("agent_message_rejected", node=session.node_id, field=error.field, error=str(error))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        if isinstance(error, repo.SpoolEpochChanged):
            await context.abort(grpc.StatusCode.ABORTED, f"a newer stream for this node replaced this one: {error}")
        if isinstance(error, repo.STORE_UNAVAILABLE):
            await store_outage.abort_unavailable(context, error, "store_unavailable_stream_ended", node=session.node_id)
        raise error

    async def _close(self, session: ingest.Session, *tasks: asyncio.Task[None]) -> None:
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._ingest.close_session(session)

    async def _read(
        self, session: ingest.Session, context: grpc.aio.ServicerContext, identity: validate_input.StreamIdentity
    ) -> None:
        metrics = self._ingest.metrics
        bucket = validate_input.TokenBucket(self._limits.max_messages_per_s, self._limits.burst_messages)
        accepted = None
        if self._recorder is not None:
            accepted = functools.partial(self._recorder.inbound, session.session_id, session.node_id)
        while True:
            wait_s = bucket.delay(time.monotonic())
            if wait_s > 0:
                # Over its rate: read later, so HTTP/2 flow control slows the sender; nothing is dropped.
                if self._security is not None:
                    self._security.throttled_seconds.inc(wait_s)
                await asyncio.sleep(wait_s)
            message: agent_pb.AgentMessage = await context.read()
            if message is grpc.aio.EOF:
                return
            metrics.agent_messages.labels(kind=message.WhichOneof("payload") or "empty").inc()
            await deliver(self._ingest, session, message, identity, self._limits, accepted=accepted)

    async def _write(self, session: ingest.Session, context: grpc.aio.ServicerContext) -> None:
        while True:
            message = await session.outbound.get()
            if message is None:
                return
            if self._recorder is not None and message.HasField("command"):
                self._recorder.outbound_command(session.session_id, session.node_id, message.command)
            await context.write(message)


async def deliver(
    service: ingest.Ingest,
    session: ingest.Session,
    message: agent_pb.AgentMessage,
    identity: validate_input.StreamIdentity,
    limits: validate_input.InputLimits,
    *,
    accepted: Callable[[agent_pb.AgentMessage], None] | None = None,
) -> None:
    """Check one non-first message of a stream at the edge, convert it, then hand it to the ingest.

    The fuzz tests and the recording's replay drive this same function in process, so they exercise
    exactly what a stream does.
    ``accepted`` (the recorder) sees each message that passed the edge, before the ingest acts on
    it: a refused message is not part of what the controller decided on, so replay never sees it.

    Raises:
        wire.WireError: a malformed field (INVALID_ARGUMENT); nothing of this message was applied.
        validate_input.IdentityError: it speaks for another node (PERMISSION_DENIED).
    """
    kind = validate_input.check_message(message, identity, limits)
    if accepted is not None:
        accepted(message)
    if kind == "telemetry":
        service.on_telemetry(session, wire_stream.telemetry_from_wire(message.telemetry, session.known_gpus))
    elif kind == "summary":
        # Checked now (a GPU the node did not announce ends the stream here); converted and absorbed
        # on the ingest's telemetry turn, behind the health events in flight (`Ingest.queue_summary`).
        wire.check_summary(message.summary, session.known_gpus)
        node_id, known_gpus = session.node_id, session.known_gpus
        service.queue_summary(
            session,
            functools.partial(wire_stream.summary_from_wire, message.summary, node_id, known_gpus, checked=True),
        )
    elif kind == "events":
        started = time.perf_counter()
        events = wire.events_from_wire(
            message.events, session.known_gpus, service.clock(), session.node_id, spool_epoch=session.spool_epoch
        )
        await service.take_events(session, events, started=started)
    elif kind == "action_result":
        service.on_result(session, wire_commands.result_from_wire(message.action_result))
    elif kind == "heartbeat":
        service.on_heartbeat(session, message.heartbeat.sent_unix_ns)
