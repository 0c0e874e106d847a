"""The power fail-safe: after losing the controller for too long, lower every GPU to a safe cap.

DESIGN.md invariant 6: the agent never raises a cap on its own. So the fall-back only lowers: a GPU
already at or below the safe limit is left alone, a GPU whose limit cannot be read now is tried
again next cycle (setting it could raise it), a raise still slewing is stopped first, and nothing is
undone when the controller returns: only the controller may raise a cap again.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from rasd.agent import actions, gpu
from rasd.agent import settings as agent_settings
from rasd.agent.core import model

if TYPE_CHECKING:
    from rasd.agent import runtime


class FailSafe:
    """Watches how long the controller stream has been down and applies the safe cap once."""

    def __init__(
        self,
        settings: agent_settings.FailsafeSettings,
        backend: gpu.GpuBackend,
        executor: actions.ActionExecutor,
        inventory: Sequence[model.GpuInfo],
        stats: runtime.AgentStats,
        *,
        clock: Callable[[], int],
        call: Callable[..., Awaitable[Any]],
        node_id: str,
    ) -> None:
        """Bind the fail-safe to the node; call(fn, *args) runs a backend call off the event loop if it blocks."""
        self.settings = settings
        self._backend = backend
        self._executor = executor
        self._inventory = inventory
        self._stats = stats
        self._clock = clock
        self._call = call
        self._log = structlog.get_logger("rasd.agent").bind(node=node_id)
        self.disconnected_since = time.monotonic()
        """When the controller stream was last lost (monotonic s); the agent starts disconnected."""
        self.done = False
        """Whether the safe cap is in force on every GPU since the stream was lost."""

    def stream_up(self) -> None:
        """The controller is back: a later outage applies the safe cap again."""
        self.done = False

    def stream_lost(self) -> None:
        """The controller stream ended: the outage is counted from now."""
        self.disconnected_since = time.monotonic()

    async def check(self) -> None:
        """Lower every cap to the safe limit once the controller has been gone longer than after_s."""
        limit_w = self.settings.power_limit_w
        if limit_w is None or self._stats.connected or self.done:
            return
        if time.monotonic() - self.disconnected_since < self.settings.after_s:
            return
        # A raise still moving would lift a limit after the fall-back: stop it where it is first.
        self._executor.cancel_slews()
        try:
            counters = {c.gpu_uuid: c for c in await self._call(self._backend.read_counters, self._clock())}
        except gpu.BackendError as exc:  # outside the sampling cycle's guard: tried again next cycle
            self._log.warning("failsafe_read_failed", error=str(exc), error_type=type(exc).__name__)
            return
        unread = []
        for info in self._inventory:
            current = counters.get(info.uuid)
            enforced = current.enforced_power_limit_w if current else None
            target = max(limit_w, info.power_limit_min_w)
            if enforced is None:
                # Not read this time (a transient NVML error): the GPU may sit below the safe
                # limit, and setting it would raise it. Tried again next cycle.
                unread.append(info.uuid)
                continue
            if enforced <= target:
                continue
            try:
                await self._call(self._backend.set_power_limit, info.uuid, target)
                self._stats.failsafe_applied += 1
            except gpu.BackendError as exc:
                self._log.error("failsafe_power_limit_failed", gpu_uuid=info.uuid, error=str(exc))
        self.done = not unread
        self._log.warning(
            "failsafe_power_limit_applied",
            power_limit_w=limit_w,
            gpus_lowered=self._stats.failsafe_applied,
            gpus_unread=len(unread),
            disconnected_s=round(time.monotonic() - self.disconnected_since, 1),
        )
