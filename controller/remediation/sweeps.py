"""Rolling SDC sweeps: the quick validation suite on idle nodes, in turn, within the disruption budget.

The planner (``sdc.plan_sweep``) takes a share of the idle nodes (`sdc_ledger.sweep_candidates`),
least recently swept first, within the free disruption budget minus a reserve for repairs; each
start is one transaction (ladder state, outbox, last-swept document, audit) before anything is
sent. The SDC ledger itself (per-GPU marks and suspicion) is `sdc_ledger.SdcLedger`.

With several replicas the sweeps run on the leader over every node: the nodes whose streams other
replicas hold, and their GPUs' idleness, come from the aggregates those replicas ship
(`use_fleet`, `replication.aggregates.FleetReader`); a replica whose aggregate is too old to trust
contributes no candidate. The sweep's command reaches the node through the outbox, whichever
replica holds its stream.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import structlog

from rasd.controller.core import aggregates
from rasd.controller.core.remediation import blast_radius, escalation, sdc
from rasd.controller.remediation import dispatch as dispatch_mod
from rasd.controller.remediation import ledger as ledger_mod
from rasd.controller.remediation import sdc_ledger
from rasd.controller.remediation import state as state_mod
from rasd.controller.store import remediation as rstore

log = structlog.get_logger("rasd.controller")


class RemoteFleet(Protocol):
    """The other replicas' aggregates (`replication.aggregates.FleetReader`)."""

    async def read(self, *, max_age_s: float, tracked: frozenset[str] = frozenset()) -> aggregates.FleetAggregate:
        """The other replicas' fresh aggregates, merged."""
        ...


class Sweeps:
    """Starts rolling sweeps every ``sweep_interval_s`` while the service runs (when enabled)."""

    def __init__(
        self,
        state: state_mod.LadderState,
        ledger: ledger_mod.Ledger,
        dispatcher: dispatch_mod.Dispatcher,
        sdc_records: sdc_ledger.SdcLedger,
        *,
        power_stale_after_s: float,
    ) -> None:
        """Share state; commit through ledger; dispatch through dispatcher; note sweeps in sdc_records.

        power_stale_after_s: a GPU whose last power sample is older than this shows an unknown draw
        (not idle).
        """
        self._state = state
        self._ledger = ledger
        self._dispatcher = dispatcher
        self._sdc = sdc_records
        self._stale_after_s = power_stale_after_s
        self._task: asyncio.Task[None] | None = None
        self._fleet: RemoteFleet | None = None

    def use_fleet(self, fleet: RemoteFleet) -> None:
        """Sweep the other replicas' nodes too, judged idle from the aggregates they ship."""
        self._fleet = fleet

    def start(self) -> None:
        """Start sweeping, if the policy enables it."""
        if self._state.policy.sdc.sweep_enabled:
            self._task = asyncio.create_task(self._sweep_forever(), name="rasd-sdc-sweep")

    async def stop(self) -> None:
        """Stop sweeping."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._state.policy.sdc.sweep_interval_s)
            try:
                await self.sweep_once()
            except Exception:
                log.exception("sdc_sweep_failed")

    async def sweep_once(self) -> list[str]:
        """One pass of the rolling SDC sweep: start the quick suite on due idle nodes; returns them."""
        if not self._state.policy.sdc.sweep_enabled:
            return []
        remote = aggregates.EMPTY
        if self._fleet is not None:
            # Older than the staleness of a power sample: the replica is gone, its nodes are not idle.
            remote = await self._fleet.read(max_age_s=self._stale_after_s)
        async with self._state.lock:
            now_ns = self._state.clock()
            started = []
            for pick in self._picks(now_ns, remote):
                if await self._start(pick, now_ns):
                    started.append(pick.node_id)
            if started:
                await self._dispatcher.dispatch_locked()
            return started

    def _picks(self, now_ns: int, remote: aggregates.FleetAggregate) -> list[sdc.SweepPick]:
        """The nodes the planner picks to sweep now: this replica's and the other replicas' (remote)."""
        state = self._state
        pol = state.policy.sdc
        now = now_ns / 1e9
        streams = state.streams
        node_gpus = {n: s.gpu_uuids for n, s in remote.nodes.items()}
        node_gpus.update({n: streams.node_gpus(n) for n in streams.sessions})
        candidates = sdc_ledger.sweep_candidates(
            connected=list(node_gpus),
            node_gpus=node_gpus,
            latest=aggregates.overlay_latest(streams.latest, remote, local_nodes=streams.sessions),
            node_states=state.node_states,
            budget=state.budget,
            last_swept=self._sdc.last_swept,
            now_unix_ns=now_ns,
            stale_after_s=self._stale_after_s,
            policy=pol,
        )
        in_flight = sum(
            1 for s in state.node_states.values() for t in s.tickets if t.purpose is escalation.Purpose.SWEEP
        )
        free = blast_radius.free_node_slots(state.budget, state.fleet_view(), now_s=now, policy=state.policy.disruption)
        return sdc.plan_sweep(candidates, now_s=now, policy=pol, in_flight=in_flight, free_disruption_slots=free)

    async def _start(self, pick: sdc.SweepPick, now_ns: int) -> bool:
        """Start a sweep on the picked node (one transaction); False when its ladder had nothing to start."""
        state = self._state
        now = now_ns / 1e9
        decision = escalation.start_sweep(
            state.state_of(pick.node_id),
            sweep_id=pick.sweep_id,
            suite=pick.suite,
            seed=pick.seed,
            now_s=now,
            policy=state.policy.escalation,
        )
        if not decision.actions:
            return False
        change = rstore.Commit(now_unix_ns=now_ns)
        change.docs.update(self._sdc.swept(pick.node_id, now=now, seed=pick.seed, suite=pick.suite))
        why = f"suite {pick.suite} seed {pick.seed}"
        row = ledger_mod.audit_record(now_ns, "rasd-controller", "sdc_sweep", pick.node_id, "", why, "started")
        change.audit.append(row)
        await self._ledger.commit_states({pick.node_id: decision.state}, list(decision.actions), change)
        log.info("sdc_sweep_started", node=pick.node_id, suite=pick.suite, seed=pick.seed)
        return True

    def records(self) -> list[dict[str, Any]]:
        """Every GPU with SDC history or under watch, most suspicious first (``rasctl sdc list``)."""
        now = self._state.now_s()
        return self._sdc.records(now=now, watch=sdc_ledger.watches(self._state.node_states, now=now))
