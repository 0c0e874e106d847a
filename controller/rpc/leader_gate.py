"""Admin calls that change the fleet go to the leader: a follower refuses them and says who leads.

Reads (`List*`, `Get*`) come from the shared store and are served by every replica. Every other
AdminService call (quarantine, release, validate, accuse, RMA approval, automation pause, power
budget and policy, and any added later) acts through the leader's loops, whose in-memory state only
the leader has; a follower answers FAILED_PRECONDITION naming the leader, with the leader's replica
id and advertised address in the trailing metadata (`LEADER_ID_KEY`, `LEADER_ADDRESS_KEY`), and
rasctl calls the leader there once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

ADMIN_SERVICE = "/rasd.api.v1.AdminService/"
READ_PREFIXES = ("List", "Get")
LEADER_ID_KEY = "rasd-leader-id"
LEADER_ADDRESS_KEY = "rasd-leader-address"
"""Trailing metadata of a follower's refusal: the leader's replica id and where it serves rasctl."""


def needs_leader(method: str) -> bool:
    """Whether a full gRPC method name ("/rasd.api.v1.AdminService/Quarantine") must run on the leader."""
    if not method.startswith(ADMIN_SERVICE):
        return False
    return not method.removeprefix(ADMIN_SERVICE).startswith(READ_PREFIXES)


class LeaderGate(grpc.aio.ServerInterceptor):
    """Refuses fleet-changing admin calls on a replica that does not lead."""

    def __init__(
        self,
        is_leader: Callable[[], bool],
        describe_leader: Callable[[], str],
        leader: Callable[[], tuple[str, str]] = lambda: ("", ""),
    ) -> None:
        """Ask is_leader() per call; describe_leader() names the leader for the error message.

        leader() is (replica id, advertised address) of the leader as this replica last saw it, either
        "" when unknown; what is known goes into the refusal's trailing metadata.
        """
        self._is_leader = is_leader
        self._describe_leader = describe_leader
        self._leader = leader

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Pass the call on, or answer FAILED_PRECONDITION when it needs the leader and this is not it."""
        method = handler_call_details.method
        if not needs_leader(method) or self._is_leader():
            return await continuation(handler_call_details)
        leader_id, leader_address = self._leader()
        at = f" at {leader_address}" if leader_address else ""
        message = (
            f"{method.removeprefix(ADMIN_SERVICE)} changes the fleet and runs on the leader; "
            f"this replica does not lead ({self._describe_leader()}{at}): retry, or call the leader"
        )
        trailers = tuple((key, value) for key, value in ((LEADER_ID_KEY, leader_id),
                                                         (LEADER_ADDRESS_KEY, leader_address)) if value)  # fmt: skip

        async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, message, trailing_metadata=trailers)

        handler = await continuation(handler_call_details)
        if handler is not None and handler.unary_stream is not None:  # a watch: refused as a stream
            return grpc.unary_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)
