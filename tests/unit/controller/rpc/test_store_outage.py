"""StoreOutageInterceptor on a real loopback gRPC server: an outage answers UNAVAILABLE, the rest untouched."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import sqlalchemy as sa

from rasd.controller.rpc import store_outage


def _identity(data: bytes) -> bytes:
    return data


async def _call(method: str, behaviour) -> tuple[grpc.StatusCode, str, bytes | None]:
    handler = grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=_identity, response_serializer=_identity
    )
    server = grpc.aio.server(interceptors=[store_outage.StoreOutageInterceptor()])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Svc", {method: handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(
                f"/test.Svc/{method}", request_serializer=_identity, response_deserializer=_identity
            )
            try:
                reply = await call(b"ping", timeout=10)
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or "", None
            return grpc.StatusCode.OK, "", reply
    finally:
        await server.stop(None)


@pytest.mark.parametrize("error", [sa.exc.OperationalError, sa.exc.InterfaceError])
def test_a_store_outage_answers_unavailable_without_the_database_text(error):
    async def behaviour(request, context):
        raise error("SELECT secret FROM nodes", {}, Exception('connection to server at "db.internal" refused'))

    code, detail, _ = asyncio.run(_call("Outage", behaviour))
    assert code is grpc.StatusCode.UNAVAILABLE
    assert detail == store_outage.STORE_UNAVAILABLE_DETAIL
    assert "db.internal" not in detail and "SELECT" not in detail


def test_other_outcomes_pass_through_unchanged():
    async def ok(request, context):
        return request + b"-pong"

    async def refused(request, context):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "limit: at most 10000")

    assert asyncio.run(_call("Ok", ok)) == (grpc.StatusCode.OK, "", b"ping-pong")
    assert asyncio.run(_call("Refused", refused))[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "limit: at most 10000")
