"""Calls that meet a store outage end with UNAVAILABLE ("retry"), not UNKNOWN with the database's text.

A store call that fails because the database is unreachable, restarting or locked committed nothing
(repo.STORE_UNAVAILABLE), so the caller may simply retry. Without this interceptor gRPC would answer
UNKNOWN and put the driver's message (host, port, SQL) on the wire. The agent stream maps the same
errors itself (agent_service), since a stream's errors surface in its own tasks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import structlog

from rasd.controller.store import repo

log = structlog.get_logger("rasd.controller.rpc")

STORE_UNAVAILABLE_DETAIL = "controller store unavailable; retry later"


async def abort_unavailable(context: grpc.aio.ServicerContext, error: Exception, what: str, **where: str) -> None:
    """Log the store error (first line) under `what` and end the call with UNAVAILABLE and a generic detail.

    Nothing of the call was committed, so the caller retries (an agent keeps the messages in its spool).
    The database's own text (host names, SQL) belongs in our log, not on the wire.
    """
    log.warning(what, **where, error=str(error).splitlines()[0][:300])
    await context.abort(grpc.StatusCode.UNAVAILABLE, STORE_UNAVAILABLE_DETAIL)


class StoreOutageInterceptor(grpc.aio.ServerInterceptor):
    """Map repo.STORE_UNAVAILABLE raised by a unary call to StatusCode.UNAVAILABLE, logging the cause."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Wrap unary handlers; the agent stream maps its own store errors."""
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        behavior = handler.unary_unary
        method = handler_call_details.method

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await behavior(request, context)
            except repo.STORE_UNAVAILABLE as exc:
                await abort_unavailable(context, exc, "store_unavailable_call_refused", method=method)

        return grpc.unary_unary_rpc_method_handler(
            unary,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
