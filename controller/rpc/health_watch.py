"""grpc.health.v1 with its Watch streams bounded: how many at once, and for how long each.

Health needs no credentials (kubelet probes present none), so anyone who reaches the port may call
it. gRPC's own servicer holds every Watch stream until the client goes: one client held 17,000 of
them open on a controller. Here a Watch over `WatchLimits.max_watches` is refused with
RESOURCE_EXHAUSTED, and each one ends (OK) after `WatchLimits.max_s`, which the health-checking
protocol tells clients to answer by watching again (with backoff). Check is untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import grpc
from grpc_health.v1 import health, health_pb2


@dataclasses.dataclass(frozen=True)
class WatchLimits:
    """Bounds on the health service's Watch streams (per replica, over all its ports)."""

    max_watches: int = 100
    """Watch streams open at once; one more is refused (no rasd part watches: Kubernetes and rasd's
    own checks call Check)."""
    max_s: float = 300.0
    """How long one Watch stream is held before it ends and its client watches again."""
    max_service_bytes: int = 256
    """The longest service name a Watch may ask for (each open one is kept as a key meanwhile)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) <= 0:
                raise ValueError(f"health watch limits.{field.name}: must be > 0")


class BoundedHealthServicer(health.aio.HealthServicer):
    """gRPC's asyncio health servicer, its Watch streams capped in number and in time."""

    def __init__(self, limits: WatchLimits | None = None) -> None:
        """Serve health with limits (`WatchLimits` by default)."""
        super().__init__()
        self.limits = limits or WatchLimits()
        self.watching = 0
        """Watch streams open now."""

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> None:
        """Stream the service's status as gRPC's servicer does, if a stream is free; end it after `max_s`."""
        limits = self.limits
        if len(request.service.encode()) > limits.max_service_bytes:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"service: longer than {limits.max_service_bytes} bytes"
            )
        if self.watching >= limits.max_watches:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"health: {limits.max_watches} Watch streams are open, the most this controller holds; "
                "call Check, or watch again later",
            )
        self.watching += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(super().Watch(request, context), limits.max_s)
        finally:
            self.watching -= 1
