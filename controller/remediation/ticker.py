"""The periodic tick: owed results, expired incidents, timeouts and watch windows, drained GPUs, then waiting actions.

The lock is taken only for work there is: each hold ends a burst's pipeline (its commits drained
first, then the decider starts again with what arrived meanwhile), and a tick that took it for
every chunk of nodes cost the events of a 2,000 events/s burst 40-60 ms more each time. So the
nodes whose due time has come (`_nodes_due`) are first looked at without the lock (a look that
finds nothing due changes nothing, and state a pass has not committed yet is only ever looked at),
and only the nodes due are ticked under it, looked at again there, in chunks of
``TICK_CHUNK_NODES``, each chunk one transaction.

A reset that waits for its GPU to drain (``escalation.TicketState.DRAINING``: a pending row remap
after Xid 94) starts when this replica's telemetry shows the GPU idle (`_drained`): no kernel ran in
its last fresh counters (utilization 0 %), or, where the GPU reports no utilization, its fresh draw is
under ``sdc.idle_power_pct`` of its limit, as the SDC sweeps judge idle nodes. Power alone would miss
an idle GPU held at a power-smoothing floor. A GPU whose stream another replica holds shows no
telemetry here, so it is not taken for idle; the agent refuses the reset anyway while a process runs.
"""

from __future__ import annotations

import asyncio
import math

import structlog

from rasd.controller.core import fleet
from rasd.controller.core.remediation import actions, correlate, escalation, sdc
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.remediation import dispatch as dispatch_mod
from rasd.controller.remediation import ledger as ledger_mod
from rasd.controller.remediation import results as results_mod
from rasd.controller.remediation import state as state_mod
from rasd.controller.store import remediation as rstore

log = structlog.get_logger("rasd.controller")

TICK_CHUNK_NODES = 200
"""Nodes ticked per hold of the decision lock (a few milliseconds), so a tick never stalls events for long."""


class Ticker:
    """Runs `tick` every tick_interval_s while the service runs."""

    def __init__(
        self,
        state: state_mod.LadderState,
        ledger: ledger_mod.Ledger,
        dispatcher: dispatch_mod.Dispatcher,
        results: results_mod.Results,
        *,
        tick_interval_s: float,
        power_stale_after_s: float = 10.0,
    ) -> None:
        """Share state; commit through ledger; admit what waits through dispatcher; apply owed results.

        power_stale_after_s: a GPU whose last power sample is older than this is not taken for idle.
        """
        self._state = state
        self._ledger = ledger
        self._dispatcher = dispatcher
        self._results = results
        self._interval_s = tick_interval_s
        self._stale_after_s = power_stale_after_s
        self._task: asyncio.Task[None] | None = None
        self._due: dict[
            str, tuple[escalation.RemediationState, policy_mod.EscalationPolicy, float, tuple[str, ...]]
        ] = {}
        """Node → (its state, the ladder policy, `escalation.tick_due_at` of them, its GPUs waiting to drain),
        for `_nodes_due` and `_drained`."""

    def start(self) -> None:
        """Start ticking (a new term: what was due is worked out again)."""
        self._due.clear()
        self._task = asyncio.create_task(self._tick_forever(), name="rasd-remediation-tick")

    async def stop(self) -> None:
        """Stop ticking."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.tick()
            except Exception:
                log.exception("remediation_tick_failed")

    async def tick(self) -> None:
        """Results the store could not take earlier, timeouts, watch windows, waiting tickets; then deferred actions.

        The nodes due are ticked in chunks (see the module docstring): ticking every node with a
        ticket at once held the lock for tens of milliseconds with a thousand such nodes. Each
        node's tick is independent of the others'. The quarantine gauge is refreshed without the lock.
        """
        state = self._state
        if self._results.owed:
            async with state.lock:
                await self._results.apply_owed()
        if correlate.expire(state.correlation, state.now_s(), state.policy) is not state.correlation:
            async with state.lock:
                await self._expire_incidents()
        due = await self._nodes_due()
        for start in range(0, len(due), TICK_CHUNK_NODES):
            async with state.lock:
                await self._tick_chunk(due[start : start + TICK_CHUNK_NODES])
        drained = self._drained()
        if drained:
            async with state.lock:
                await self._start_drained(drained)
        if state.deferred:
            async with state.lock:
                await self._dispatcher.dispatch_locked()
        if state.quarantine_gauge_stale:
            # Without the lock: the gauge counts what is committed, and no decision waits for it.
            # Taken for it, the lock drained a burst's pipeline at every tick that followed a
            # quarantine, and events queued behind the drain for ~60 ms. A pass that commits
            # quarantines meanwhile marks the gauge stale again, for the next tick.
            state.quarantine_gauge_stale = False
            await self._ledger.export_quarantines()

    async def _tick_chunk(self, nodes: list[str]) -> None:
        """Tick nodes in one transaction (under the lock).

        One transaction per chunk, not per node: after a partition every node's command times out
        at once, and a commit per node held the lock ~5 ms a node.
        """
        now_ns = self._state.clock()
        change = rstore.Commit(now_unix_ns=now_ns)
        states: dict[str, escalation.RemediationState] = {}
        new_actions: list[actions.Action] = []
        for node_id in nodes:
            decision = self._tick_decision(node_id, now_ns / 1e9)
            if decision is None:
                continue
            # A tick closes a dispatched command only when its wait ran out.
            self._ledger.close(decision, change, now_ns / 1e9, unanswered_status="timed_out")
            states[node_id] = decision.state
            new_actions.extend(decision.actions)
        if states:
            await self._ledger.commit_states(states, new_actions, change)

    async def _nodes_due(self) -> list[str]:
        """The nodes whose tick would change something now: a look without the lock.

        Only the nodes whose due time (`escalation.tick_due_at`) has come are ticked to see, in
        chunks of `TICK_CHUNK_NODES`. A node's due time is kept with the state it was computed
        from, so a node whose state did not change since the last tick costs a lookup: ticking
        every node with a ticket, as this did before, took 25-35 ms of the event loop per tick at
        2,000 such nodes in a burst, and would take ten times that at 16,000.
        """
        state = self._state
        now = state.now_s()
        nodes = [node_id for node_id, ladder in state.node_states.items() if self._due_at(node_id, ladder) <= now]
        due: list[str] = []
        for start in range(0, len(nodes), TICK_CHUNK_NODES):
            if start:
                await asyncio.sleep(0)  # events decided in between: the look is not a pause
            now = state.now_s()
            due += [
                node_id
                for node_id in nodes[start : start + TICK_CHUNK_NODES]
                if self._tick_decision(node_id, now) is not None
            ]
        return due

    def _due_at(self, node_id: str, ladder: escalation.RemediationState) -> float:
        """When the node's tick may next change something (`escalation.tick_due_at`); inf for a node with no ticket.

        Remembered with the state and policy it was computed for: states are immutable and
        replaced whole, so a different state object is a different node state.
        """
        if not ladder.tickets:
            return math.inf  # as before: a node without tickets is left to its next event
        return self._remembered(node_id, ladder)[2]

    def _remembered(
        self, node_id: str, ladder: escalation.RemediationState
    ) -> tuple[escalation.RemediationState, policy_mod.EscalationPolicy, float, tuple[str, ...]]:
        """What `_due` keeps for the node's state: computed again only when the state or the policy changed."""
        remembered = self._due.get(node_id)
        policy = self._state.policy.escalation
        if remembered is not None and remembered[0] is ladder and remembered[1] is policy:
            return remembered
        remembered = (ladder, policy, escalation.tick_due_at(ladder, policy=policy), escalation.draining_gpus(ladder))
        self._due[node_id] = remembered
        return remembered

    def _drained(self) -> list[tuple[str, str]]:
        """(node, GPU) of the resets waiting for a drain whose GPU this replica's telemetry shows idle now."""
        state = self._state
        now = state.now_s()
        idle_pct = state.policy.sdc.idle_power_pct
        out = []
        for node_id, ladder in state.node_states.items():
            if not ladder.tickets:
                continue
            for gpu in self._remembered(node_id, ladder)[3]:
                if self._looks_idle(gpu, now, idle_pct):
                    out.append((node_id, gpu))
        return out

    def _looks_idle(self, gpu: str, now_s: float, idle_pct: float) -> bool:
        """No kernel in its fresh counters (utilization 0 %); without that figure, a fresh draw under idle_pct."""
        streams = self._state.streams
        seen = streams.latest.get(gpu)
        if seen is None:
            return False
        counted_at_ns = streams.latest_controller_ns.get(gpu)
        fresh = counted_at_ns is not None and now_s - counted_at_ns / 1e9 <= self._stale_after_s
        if seen.utilization_gpu_pct is not None:
            return fresh and seen.utilization_gpu_pct == 0
        seen = fleet.drop_stale_power(seen, now_s=now_s, stale_after_s=self._stale_after_s)
        limit_w = float(seen.enforced_power_limit_w or 0)
        return sdc.node_is_idle([(seen.power_w, limit_w)], idle_power_pct=idle_pct)

    async def _start_drained(self, drained: list[tuple[str, str]]) -> None:
        """Start the resets of the drained GPUs (`escalation.gpu_idle`), in one transaction (under the lock)."""
        now_ns = self._state.clock()
        change = rstore.Commit(now_unix_ns=now_ns)
        states: dict[str, escalation.RemediationState] = {}
        new_actions: list[actions.Action] = []
        for node_id, gpu in drained:
            ladder = states.get(node_id) or self._state.node_states.get(node_id)
            if ladder is None:
                continue
            decision = escalation.gpu_idle(ladder, gpu, now_s=now_ns / 1e9, policy=self._state.policy.escalation)
            if decision.state == ladder and not decision.actions:
                continue  # no longer draining (decided since the look)
            log.info("remediation_gpu_drained", node=node_id, gpu_uuid=gpu, reason=decision.reason)
            self._ledger.close(decision, change, now_ns / 1e9)
            states[node_id] = decision.state
            new_actions.extend(decision.actions)
        if states:
            await self._ledger.commit_states(states, new_actions, change)

    def _tick_decision(self, node_id: str, now: float) -> escalation.Decision | None:
        """The node's tick at now, or None when it would change nothing (no ticket, nothing due)."""
        ladder = self._state.node_states.get(node_id)
        if ladder is None or not ladder.tickets:
            return None
        decision = escalation.tick(ladder, now_s=now, policy=self._state.policy.escalation)
        return None if decision.state == ladder and not decision.actions else decision

    async def _expire_incidents(self) -> None:
        """Close the incidents whose correlation window ended in scopes no event has touched since."""
        state = self._state
        now_ns = state.clock()
        corr = correlate.expire(state.correlation, now_ns / 1e9, state.policy)
        if corr is state.correlation:
            return
        change = rstore.Commit(now_unix_ns=now_ns)
        self._ledger.correlation_into(change, corr, changed_incidents=False)
        await self._ledger.commit(change)
        state.correlation = corr
