"""Admin calls that change the fleet go to the leader: a follower refuses them and says who leads.

Reads (`List*`, `Get*`) come from the shared store and are served by every replica. Every other
AdminService call (quarantine, release, validate, accuse, RMA approval, automation pause, power
budget and policy, and any added later) acts through the leader's loops, whose in-memory state only
the leader has; a follower answers FAILED_PRECONDITION naming the leader, and rasctl's retry or the
Service's next connection reaches another replica.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

ADMIN_SERVICE = "/rasd.api.v1.AdminService/"
READ_PREFIXES = ("List", "Get")


def needs_leader(method: str) -> bool:
    """Whether a full gRPC method name ("/rasd.api.v1.AdminService/Quarantine") must run on the leader."""
    if not method.startswith(ADMIN_SERVICE):
        return False
    return not method.removeprefix(ADMIN_SERVICE).startswith(READ_PREFIXES)


class LeaderGate(grpc.aio.ServerInterceptor):
    """Refuses fleet-changing admin calls on a replica that does not lead."""

    def __init__(self, is_leader: Callable[[], bool], describe_leader: Callable[[], str]) -> None:
        """Ask is_leader() per call; describe_leader() names the leader for the error message."""
        self._is_leader = is_leader
        self._describe_leader = describe_leader

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Pass the call on, or answer FAILED_PRECONDITION when it needs the leader and this is not it."""
        method = handler_call_details.method
        if not needs_leader(method) or self._is_leader():
            return await continuation(handler_call_details)
        message = (
            f"{method.removeprefix(ADMIN_SERVICE)} changes the fleet and runs on the leader; "
            f"this replica does not lead ({self._describe_leader()}): retry, or call the leader"
        )

        async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)

        return grpc.unary_unary_rpc_method_handler(refuse)
