"""rasd's side of `rasd-sim goodput`: the agent's events through the real pure core, its commands carried out.

The calls are the controller's (controller/README.md, "One Xid 79"): `escalation.handle_event` for each
event, `blast_radius.admit` for everything proposed plus everything still deferred,
`escalation.mark_dispatched` for what leaves, `escalation.on_result` and `blast_radius.complete` for
what comes back, `escalation.tick` when `tick_due_at` says so, `correlate.expire` with it, and
`escalation.operator_release` when a person has replaced a part or mended what the ladder cannot.
Nothing of the ladder is re-implemented here: the simulator plays the hardware (a command's result,
a validation's verdict, from `goodput_faults.Variant.fix`) and the people (an RMA's replacement, a
repair the core asked a person for, a resume after a breaker trip).

A fault whose node automation has left in the job ``manual_delay_s`` after it was seen (the budget
deferred its quarantine, or the core took no action) goes to a person, as in the baseline, and is
counted (``left_to_person``).
"""

from __future__ import annotations

import collections
import math
from typing import Any

from rasd.common import xid_catalog
from rasd.controller.core.remediation import actions, blast_radius, correlate, escalation, policy
from rasd.controller.core.remediation import events as health
from rasd.sim import goodput_faults as gf
from rasd.sim.goodput import Fault, World, gpu_uuid, node_id

_REPAIR_KINDS = frozenset({"restart_process", "reset_gpu", "reboot_node", "power_cycle_bmc"})
_NODE_RUNGS = frozenset({"reboot_node", "power_cycle_bmc"})
MIN_IDLE_TICK_S = 60.0
MAX_IDLE_TICK_S = 3600.0
"""A node whose tick is due and finds nothing to do is ticked again after 1 min, 2, 4, ... up to an hour."""


def _hold_key(action: actions.Action) -> str:
    gpu = getattr(action, "gpu_uuid", "")
    port = getattr(action, "ib_port", "")
    return f"gpu:{gpu}" if gpu else f"port:{port}" if port else "node"


class RasdArm:
    """The controller's core deciding, the simulated fleet carrying it out (see the module docstring)."""

    name = "rasd"

    def __init__(self, world: World, pol: policy.RemediationPolicy, catalog: xid_catalog.XidCatalog) -> None:
        """Drive the core with pol on world's nodes (racks of ``nodes_per_rack``, ``gpus_per_node`` each)."""
        self._world = world
        self._pol = pol
        self._catalog = catalog
        p = world.params
        self._fleet = blast_radius.FleetView(
            node_labels={node_id(n): {"rack": f"rack-{n // p.nodes_per_rack:04d}"} for n in range(world.total_nodes)},
            node_gpu_counts={node_id(n): p.gpus_per_node for n in range(world.total_nodes)},
        )
        self._corr = correlate.CorrelationState()
        self._states: dict[str, escalation.RemediationState] = {}
        self._budget = blast_radius.BudgetState()
        self._deferred: list[actions.Action] = []
        self._retry_at: float | None = None
        self._resume_at: float | None = None
        self._tick_at: dict[str, float] = {}
        self._seq: collections.Counter[str] = collections.Counter()
        self._people_called: set[str] = set()
        self.admitted: collections.Counter[str] = collections.Counter()
        self.deferred_ids: set[str] = set()
        self.left_to_person = 0
        self.breaker_trips = 0

    def _state(self, node: str) -> escalation.RemediationState:
        return self._states.get(node) or escalation.RemediationState(node)

    # What the world tells the core --------------------------------------------------------

    def detected(self, fault: Fault, now: float) -> None:
        """The agent's events for the fault, in order, through `escalation.handle_event`."""
        node = node_id(fault.node)
        for fields in gf.event_fields(fault.variant.signal, gpu_uuid(fault.node, fault.gpu)):
            self._seq[node] += 1
            event = health.HealthEvent(node_id=node, observed_at=now, seq=self._seq[node], **fields)
            result = escalation.handle_event(
                self._corr, self._state(node), event, now_s=now, catalog=self._catalog, policy=self._pol
            )
            self._corr = result.correlation.state
            self._take(node, result.decision, now)
        self._world.at(now + self._world.params.manual_delay_s, self._fallback, fault)

    def _fallback(self, fault: Fault) -> None:
        if not fault.fixed and fault.node in self._world.job:
            self.left_to_person += 1
            self._world.person_repair(fault)

    def _take(self, node: str, decision: escalation.Decision, now: float) -> None:
        """Keep the decision's state, close what it closed, propose its actions, plan the node's next tick."""
        self._states[node] = decision.state
        for command_id in decision.closed_command_ids:
            self._budget = blast_radius.complete(self._budget, command_id, now_s=now)
        self._propose(decision.actions, now)
        self._plan_tick(node, now)

    def _propose(self, new: tuple[actions.Action, ...] | list[actions.Action], now: float) -> None:
        """`blast_radius.admit` over everything deferred plus new; carry out what is admitted."""
        if not new and not self._deferred:
            return
        admission = blast_radius.admit(
            self._budget, [*self._deferred, *new], self._fleet, now_s=now, policy=self._pol.disruption
        )
        self._budget = admission.state
        self._deferred = list(admission.deferred)
        self.deferred_ids.update(a.command_id for a in admission.deferred)
        for action in admission.admitted:
            self._carry_out(action, now)
        self._call_people({a.node_id for a in admission.admitted if a.kind == "notify"}, now)
        cooldown_until = self._budget.cooldown_until
        if self._deferred and cooldown_until is not None and cooldown_until > now and self._retry_at is None:
            # Only the end of a storm's cooldown frees budget with time; everything else that does (a
            # result, a release, a resume) reaches the core through `_take`, which proposes again.
            self._retry_at = cooldown_until
            self._world.at(cooldown_until, self._retry)
        if self._budget.breaker_tripped_at is not None and self._resume_at is None:
            self.breaker_trips += 1
            self._resume_at = now + self._world.params.manual_delay_s
            self._world.at(self._resume_at, self._resume)

    def _retry(self) -> None:
        self._retry_at = None
        self._propose([], self._world.now)

    def _resume(self) -> None:
        now = self._world.now
        self._resume_at = None
        self._budget = blast_radius.resume(self._budget, now_s=now, policy=self._pol.disruption)
        self._propose([], now)

    # Carrying out the admitted commands ----------------------------------------------------

    def _carry_out(self, action: actions.Action, now: float) -> None:
        world, p = self._world, self._world.params
        node = int(action.node_id.rsplit("-", 1)[1]) if action.node_id else -1
        self.admitted[action.kind] += 1
        if action.kind.startswith("quarantine_"):
            world.hold(node, _hold_key(action))
        elif action.kind == "release":
            world.unhold(node, _hold_key(action))
        elif action.kind in _REPAIR_KINDS or action.kind == "run_validation":
            self._states[action.node_id] = escalation.mark_dispatched(
                self._state(action.node_id), action.command_id, now_s=now
            )
            took_s = p.validation_s if action.kind == "run_validation" else p.repair_s[action.kind]
            world.at(now + took_s, self._answer, action, node)
        elif action.kind == "open_rma":
            world.at(now + p.rma_s, self._replaced, action, node)

    def _answer(self, action: actions.Action, node: int) -> None:
        """The command's result, as the hardware would give it, through `escalation.on_result`."""
        now = self._world.now
        if action.kind == "run_validation":
            result = self._verdict(action, node)
        else:
            self._repair(action, node)
            result = escalation.ActionResult(action.command_id, escalation.Outcome.SUCCEEDED)
        self._budget = blast_radius.complete(self._budget, action.command_id, now_s=now)
        decision = escalation.on_result(self._state(action.node_id), result, now_s=now, policy=self._pol.escalation)
        self._take(action.node_id, decision, now)

    def _repair(self, action: actions.Action, node: int) -> None:
        """A repair at a rung fixes the faults of its target whose fix is that rung or a cheaper one."""
        rank = gf.LADDER_FIXES.index(action.kind) + 1
        gpu = "" if action.kind in _NODE_RUNGS else getattr(action, "gpu_uuid", "")
        for fault in self._world.unfixed(node):
            on_target = not gpu or gpu_uuid(node, fault.gpu) == gpu
            if on_target and 0 < fault.variant.rank() <= rank:
                self._world.fix(fault)

    def _verdict(self, action: actions.RunValidation, node: int) -> escalation.ActionResult:
        """Fail on every checked GPU that still carries a fault the ladder could fix."""
        checked = set(action.gpu_uuids or (gpu_uuid(node, g) for g in range(self._world.params.gpus_per_node)))
        checked -= set(action.exclude_gpu_uuids)
        failed = sorted({gpu_uuid(node, f.gpu) for f in self._world.unfixed(node) if f.variant.rank()} & checked)
        verdict = "fail" if failed else "pass"
        return escalation.ActionResult(
            action.command_id, escalation.Outcome.SUCCEEDED, validation_verdict=verdict, failed_gpu_uuids=tuple(failed)
        )

    def _replaced(self, action: actions.OpenRma, node: int) -> None:
        """The RMA's part is replaced: its faults are gone; a person asks for release (validation first)."""
        for fault in self._world.unfixed(node):
            if not action.gpu_uuid or gpu_uuid(node, fault.gpu) == action.gpu_uuid:
                self._world.fix(fault)
        self._release(action.node_id, action.ticket_id)

    def _call_people(self, nodes: set[str], now: float) -> None:
        """A ticket of nodes the core left to a person (it notified): they mend the node and ask for its release."""
        p = self._world.params
        for node in nodes:
            for ticket in self._state(node).tickets:
                waits = ticket.state is escalation.TicketState.AWAITING_OPERATOR
                if waits and ticket.ticket_id not in self._people_called:
                    self._people_called.add(ticket.ticket_id)
                    self._world.at(now + p.manual_delay_s + p.manual_repair_s, self._mended, node, ticket.ticket_id)

    def _mended(self, node: str, ticket_id: str) -> None:
        index = int(node.rsplit("-", 1)[1])
        for fault in self._world.unfixed(index):
            self._world.fix(fault)
        self._world.people += 1
        self._release(node, ticket_id)

    def _release(self, node: str, ticket_id: str) -> None:
        now = self._world.now
        decision = escalation.operator_release(self._state(node), ticket_id, now_s=now, policy=self._pol.escalation)
        self._take(node, decision, now)

    # Time ----------------------------------------------------------------------------------

    def _plan_tick(self, node: str, now: float, idle_s: float = 0.0) -> None:
        """Tick the node when `tick_due_at` says; a due time already past backs off (idle_s, doubling to an hour).

        The due time is a bound: a node whose reboot the budget holds past ``reboot_node_timeout_s``
        stays due, and a tick finds nothing to do (the controller ticks it every period for nothing).
        """
        due = escalation.tick_due_at(self._state(node), policy=self._pol.escalation)
        if due == math.inf:
            self._tick_at.pop(node, None)
            return
        backoff_s = min(MAX_IDLE_TICK_S, max(MIN_IDLE_TICK_S, 2 * idle_s))
        when = due if due > now else now + backoff_s
        if self._tick_at.get(node, math.inf) > when or self._tick_at.get(node, 0.0) < now:
            self._tick_at[node] = when
            self._world.at(when, self._tick, node, when, backoff_s if due <= now else 0.0)

    def _tick(self, node: str, when: float, idle_s: float) -> None:
        if self._tick_at.get(node) != when:
            return  # a later plan replaced this one
        del self._tick_at[node]
        now = self._world.now
        self._corr = correlate.expire(self._corr, now, self._pol)
        before = self._state(node)
        decision = escalation.tick(before, now_s=now, policy=self._pol.escalation)
        idle = decision.state == before and not decision.actions
        self._states[node] = decision.state
        self._propose(decision.actions, now)
        self._plan_tick(node, now, idle_s if idle else 0.0)

    def summary(self) -> dict[str, Any]:
        """Commands admitted by kind, how many ever waited for budget, what was left to people."""
        return {
            "commands": dict(sorted(self.admitted.items())),
            "commands_deferred_by_budget": len(self.deferred_ids),
            "left_to_person": self.left_to_person,
            "breaker_trips": self.breaker_trips,
            "open_tickets_at_end": sum(len(s.tickets) for s in self._states.values()),
        }
