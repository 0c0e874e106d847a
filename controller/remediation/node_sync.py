"""The scheduler's view of the nodes, read periodically: topology for the blast radius, heartbeats back.

With the Kubernetes adapter, every ``node_sync_s`` the leader lists the Nodes once (in a thread: it is
an API call) and takes each Node's topology labels (zone, NVLink clique, rack: the adapter's
``sync_nodes``) into `LadderState.topology`, which the budget's fleet view and the NVLink-domain
correlation lay over the agents' agent.toml labels; the same call refreshes the ``RasdHealthy``
condition's heartbeat on the nodes rasd knows. A failed read keeps the last topology and is logged;
it never stops the ladder.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

import structlog

from rasd.controller.remediation import state as state_mod

log = structlog.get_logger("rasd.controller")

SyncNodes = Callable[[Sequence[str]], Mapping[str, Mapping[str, str]]]
"""Heartbeats for the nodes named; returns every listed node's topology (``KubernetesQuarantine.sync_nodes``)."""


class NodeSync:
    """Runs `sync_once` every ``period_s`` while the service runs (this replica leads)."""

    def __init__(self, state: state_mod.LadderState, sync: SyncNodes, *, period_s: float) -> None:
        """Share state; sync: the adapter's call; period_s: how often."""
        self._state = state
        self._sync = sync
        self._period_s = period_s
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def configured(cls, state: state_mod.LadderState, sync: SyncNodes | None, *, period_s: float) -> NodeSync | None:
        """The loop, or None without a sync call or with a period of 0."""
        return cls(state, sync, period_s=period_s) if sync is not None and period_s > 0 else None

    def start(self) -> None:
        """Start the loop: a first sync at once (the budget wants the topology before a storm)."""
        self._task = asyncio.create_task(self._forever(), name="rasd-node-sync")

    async def stop(self) -> None:
        """Stop the loop."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _forever(self) -> None:
        while True:
            await self.sync_once()
            await asyncio.sleep(self._period_s)

    async def sync_once(self) -> bool:
        """One read of the scheduler's nodes; True when the topology changed. Failures are logged, never raised."""
        nodes = sorted(self._state.streams.node_labels)
        try:
            topology = await asyncio.to_thread(self._sync, nodes)
        except Exception as exc:  # the API server is away: keep the last topology, try again next period
            log.warning("node_sync_failed", error=f"{type(exc).__name__}: {exc}")
            return False
        async with self._state.lock:  # the fleet view is read under it
            changed = self._state.set_topology(topology)
        if changed:
            log.info("node_topology_changed", nodes=len(self._state.topology))
        return changed
