"""The lost-node watch: the leader reads every node's last-seen time and hands each lost node to the ladder.

`rasd.controller.core.remediation.lost_nodes` decides which nodes are lost; this loop runs it every
``check_interval_s`` while this replica leads (`RemediationService.start` .. `stop`):

1. one read of the silent nodes' last-seen times and stored states, and of how many nodes were heard
   from (`repo.Store.silent_nodes`: filtered and counted in the database), beside the store thread
   where the store allows it, so that the ladder's commits never wait for it;
2. a node is judged only while it is in service: stored HEALTHY or DEGRADED, and no ticket of the
   ladder on it that is acting, waiting, validating or held for a person (a reboot the ladder sent
   silences the agent on purpose);
3. each node named lost is an audit row (actor ``lost-node-watch``), then enters the ladder as a health
   event of kind ``NODE_LOST`` (source ``controller``), as an accusation and the straggler watch's rungs
   do, so classification, the disruption budget,
   the circuit breaker, the audit trail and the quarantine adapter all apply: the node is
   quarantined (Kubernetes: cordoned and tainted, so the scheduler moves the work now) and a person
   is told.

When the straggler watch names a hung job (its effect "stall", carried out here by the leader),
`check_stalled` runs one check at once with ``stalled_lost_after_s`` (20 s) in place of
``lost_after_s``: a dead host hangs the job it runs, so a node silent that long while the job is
stalled is taken for lost without waiting out the full silence.

A node named lost and heard from again (its agent streams again on any replica) is asked back into
service as an operator's `rasctl release` would (actor ``lost-node-watch``): the ladder validates it
and releases it on a pass. Only while the ladder holds the node for that loss alone, with
``release_on_return``, and not when it came back once already within ``relapse_window_s`` (then it is
logged, ``lost_node_relapsed``, and left to a person).

Metrics: ``rasd_lost_nodes`` (silent past ``lost_after_s`` now), ``rasd_nodes_named_lost`` (a counter) and
``rasd_lost_node_storm`` (1 while more nodes fell silent at once than a failure of hosts explains;
nothing is named then). A read that fails is logged and retried at the next check; it never stops
the ladder.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Protocol

import structlog

from rasd.controller.core import fleet
from rasd.controller.core.remediation import escalation, lost_nodes
from rasd.controller.core.remediation import events as health
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.remediation import ledger as ledger_mod
from rasd.controller.remediation import outlet as outlet_mod
from rasd.controller.remediation import state as state_mod
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo

log = structlog.get_logger("rasd.controller")

SOURCE = "controller"
ACTOR = "lost-node-watch"
FAULT_KEY = "node_lost"
"""The fault key classification gives a NODE_LOST event (`classify`)."""
IN_SERVICE = frozenset({fleet.ComponentState.HEALTHY, fleet.ComponentState.DEGRADED, fleet.ComponentState.UNSPECIFIED})
"""Stored node states whose silence means the node is lost (UNSPECIFIED: a row from before states were kept)."""
_LADDER_BUSY = frozenset(
    {
        escalation.TicketState.ACTING,
        escalation.TicketState.WAITING,
        escalation.TicketState.VALIDATING,
        escalation.TicketState.AWAITING_OPERATOR,
        escalation.TicketState.RMA_PENDING,
    }
)
"""Ticket states under which the ladder may have silenced the node itself, or already holds it."""


class Decide(Protocol):
    """The ladder's decider (`decider.Decider.on_events`)."""

    async def on_events(self, node_id: str, events: Sequence[repo.StoredEvent], labels: dict[str, str]) -> None:
        """Decide stored events of one node."""
        ...


ReadSightings = Callable[[int, int, Collection[str]], Awaitable[tuple[list[repo.NodeSighting], int]]]
"""`Store.silent_nodes` (seen since, silent before, also; unix ns), run off the event loop."""
Release = Callable[[str, str], Awaitable[str]]
"""Ask the ladder to validate and release a node, as an operator would (node, reason) → what happened."""


class LostNodeWatch:
    """Runs `check_once` every ``check_interval_s`` while the service runs (when enabled)."""

    def __init__(
        self,
        state: state_mod.LadderState,
        ledger: ledger_mod.Ledger,
        decider: Decide,
        read_sightings: ReadSightings,
        release: Release,
        read_labels: Callable[[Sequence[str]], Awaitable[dict[str, dict[str, str]]]],
        *,
        recorder: outlet_mod.DecisionRecorder | None = None,
        loop_checks: bool = True,
    ) -> None:
        """Share the ladder's state, ledger and decider; read_sightings (`Store.silent_nodes`), read_labels: reads."""
        self._state = state
        self._ledger = ledger
        self._decider = decider
        self._read = read_sightings
        self._release = release
        self._read_labels = read_labels
        self._recorder = recorder or outlet_mod.NoRecorder()
        self._loop_checks = loop_checks
        """False where the checks are driven from outside (a replay feeds the recorded verdicts instead)."""
        self._watch: lost_nodes.WatchState | None = None
        self._checking = asyncio.Lock()  # a stall's check and the loop's never judge one state twice
        self._task: asyncio.Task[None] | None = None
        self._storm = False
        self.failures = 0
        """Checks whose read or decision raised (each logged)."""

    @property
    def policy(self) -> policy_mod.LostNodePolicy:
        """``[remediation.lost_nodes]``."""
        return self._state.policy.lost_nodes

    def start(self) -> None:
        """Start this term's watch: silence counts from now at the earliest."""
        self._watch = lost_nodes.WatchState(started_s=self._state.now_s())
        self._storm = False
        if self.policy.enabled and self._loop_checks:
            self._task = asyncio.get_running_loop().create_task(self._forever(), name="rasd-lost-nodes")

    async def stop(self) -> None:
        """Stop the loop; the next term starts again from its own start."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _forever(self) -> None:
        while True:
            await asyncio.sleep(self.policy.check_interval_s)
            try:
                await self.check_once()
            except Exception:  # a store outage: the next check reads again
                self.failures += 1
                log.exception("lost_node_check_failed")

    async def check_stalled(self) -> tuple[str, ...]:
        """One check now, with ``stalled_lost_after_s``: the job is hung (see the module docstring).

        Nothing while the watch is off or not started (a follower, or the loop disabled).
        """
        if self._watch is None or not self.policy.enabled:
            return ()
        pol = self.policy
        return await self.check_once(
            dataclasses.replace(pol, lost_after_s=min(pol.lost_after_s, pol.stalled_lost_after_s))
        )

    async def check_once(self, pol: policy_mod.LostNodePolicy | None = None) -> tuple[str, ...]:
        """Read, judge, hand each node named lost to the ladder; returns the nodes named.

        pol: the policy to judge by (`check_stalled`'s shorter silence); the configured one by default.
        """
        if self._watch is None:
            raise RuntimeError("LostNodeWatch.check_once before start()")
        async with self._checking:
            return await self._check(pol or self.policy)

    async def _check(self, pol: policy_mod.LostNodePolicy) -> tuple[str, ...]:
        assert self._watch is not None
        now_s = self._state.now_s()
        seen_since_ns = int(lost_nodes.horizon_s(self._watch, pol) * 1e9)
        silent_before_ns = int((now_s - pol.lost_after_s) * 1e9)
        rows, nodes_seen = await self._read(seen_since_ns, silent_before_ns, tuple(self._watch.reported))
        sightings = [
            lost_nodes.Sighting(row.node_id, row.last_seen_unix_ns / 1e9, self._in_service(row)) for row in rows
        ]
        judgement = lost_nodes.judge(self._watch, sightings, now_s=now_s, pol=pol, nodes_seen=nodes_seen)
        self._watch = judgement.state
        self._export(judgement, nodes_seen)
        handed: set[str] = set()
        try:
            labels = await self._read_labels([lost.node_id for lost in judgement.lost]) if judgement.lost else {}
            for lost in judgement.lost:
                await self._hand_over(lost, now_s, labels.get(lost.node_id, {}), pol)
                handed.add(lost.node_id)
        finally:  # a node not handed over (the store failed) is named again at the next check
            unhanded = {lost.node_id for lost in judgement.lost} - handed
            if unhanded:
                kept = {node: at for node, at in judgement.state.reported.items() if node not in unhanded}
                self._watch = dataclasses.replace(judgement.state, reported=kept)
        for node_id in judgement.release:
            try:
                await self._returned(node_id)
            except Exception:  # logged; a person can still release it (rasctl release)
                self.failures += 1
                log.exception("lost_node_release_failed", node=node_id)
        for node_id in judgement.relapsed:
            log.warning(
                "lost_node_relapsed",
                node=node_id,
                reason=f"heard from again, but back once already within {self.policy.relapse_window_s:.0f} s: "
                "left quarantined for a person",
            )
        return tuple(lost.node_id for lost in judgement.lost)

    async def _hand_over(
        self, lost: lost_nodes.LostNode, now_s: float, labels: dict[str, str], pol: policy_mod.LostNodePolicy
    ) -> None:
        """The audit row, the recording's entry, then the NODE_LOST event to the ladder."""
        log.warning("node_lost", node=lost.node_id, silent_s=round(lost.silent_s, 1))
        await self.take_recorded(
            lost.node_id, self._message(lost, pol), int(lost.last_seen_s * 1e9), int(now_s * 1e9), labels
        )

    async def take_recorded(
        self, node_id: str, message: str, last_seen_unix_ns: int, at_unix_ns: int, labels: Mapping[str, str]
    ) -> None:
        """Hand a NODE_LOST verdict to the ladder (audited, recorded): this watch's, or a recording's in a replay."""
        event = repo.controller_event(
            node_id,
            int(health.EventKind.NODE_LOST),
            int(health.Severity.FATAL),
            now_unix_ns=at_unix_ns,
            message=message,
            source=SOURCE,
            attributes={"last_seen_unix_ns": str(last_seen_unix_ns)},
        )
        row = ledger_mod.audit_record(at_unix_ns, ACTOR, "node_lost", node_id, "", message, "handed to the ladder")
        await self._ledger.commit(rstore.Commit(now_unix_ns=at_unix_ns, audit=[row]))
        self._recorder.node_lost(node_id, message=message, last_seen_unix_ns=last_seen_unix_ns, at_unix_ns=at_unix_ns)
        await self._decider.on_events(node_id, [event], dict(labels))

    async def _returned(self, node_id: str) -> None:
        """A lost node streams again: validated and released, while the ladder holds it for that loss alone."""
        node = self._state.node_states.get(node_id)
        holders = [t for t in (node.tickets if node is not None else ()) if "node" in t.held]
        if not (len(holders) == 1 and holders[0].fault_key == FAULT_KEY):
            return  # a person released it already, or another fault holds it too: theirs to decide
        if not self.policy.release_on_return:
            log.info("lost_node_returned", node=node_id, outcome="left quarantined: release_on_return is off")
            return
        outcome = await self._release(node_id, "its agent streams again after it was lost: validate and release")
        log.info("lost_node_returned", node=node_id, outcome=outcome)

    def _in_service(self, row: repo.NodeSighting) -> bool:
        if row.state not in IN_SERVICE:
            return False
        node = self._state.node_states.get(row.node_id)
        return node is None or not any(t.state in _LADDER_BUSY for t in node.tickets)

    def _export(self, judgement: lost_nodes.Judgement, nodes: int) -> None:
        metrics = self._state.metrics
        metrics.lost_nodes.set(judgement.silent)
        metrics.lost_node_storm.set(1 if judgement.storm else 0)
        metrics.nodes_named_lost.inc(len(judgement.lost))
        if judgement.storm and not self._storm:
            log.error(
                "lost_node_storm",
                silent=judgement.silent,
                limit=lost_nodes.storm_limit(nodes, self.policy),
                reason="more nodes fell silent at once than a failure of hosts explains: the controller's own "
                "network or store is suspect, so no node is quarantined for it; nodes are judged again each check",
            )
        self._storm = judgement.storm

    def _message(self, lost: lost_nodes.LostNode, pol: policy_mod.LostNodePolicy) -> str:
        after_s = pol.lost_after_s
        why = " while the job it runs is stalled" if after_s < self.policy.lost_after_s else ""
        return f"no replica has heard from its agent for {lost.silent_s:.0f} s (lost after {after_s:.0f} s{why})"
