"""Sending dispatched agent commands: to the outlet, held behind their quarantine's adapter, again on reconnect.

A command leaves only after the commit that records it dispatched (the decider and dispatch call
here then). One whose ticket's quarantine adapter still runs is held until it returns (`hold`),
so a repair never reaches a node still in scheduling. A command sent and not answered is sent
again, with the same id, when its node reconnects (`resend`): the agent answers a repeat from its
journal. The decision latency of every command an event led to is timed here, as it leaves.
"""

from __future__ import annotations

import math

import structlog

from rasd.controller.core.remediation import actions, escalation
from rasd.controller.remediation import outlet as outlet_mod
from rasd.controller.remediation import state as state_mod

log = structlog.get_logger("rasd.controller")


class Sender:
    """Hands dispatched agent commands to the outlet and keeps track of them until they are answered."""

    def __init__(self, state: state_mod.LadderState, outlet: outlet_mod.CommandOutlet) -> None:
        """Share state; send through outlet (this replica's streams, or the relay's courier)."""
        self._state = state
        self._outlet = outlet

    def note_dispatched(self, action: actions.Action) -> None:
        """Count an action admitted and recorded as dispatched."""
        stats = self._state.stats
        stats.actions_by_kind[action.kind] = stats.actions_by_kind.get(action.kind, 0) + 1
        self._state.kinds[action.command_id] = action.kind

    def note_handed_over(self, action: actions.Action, *, at_ns: int | None = None) -> None:
        """The decision latency of an action an event led to: event stored → now (or at_ns).

        An event the blast-radius policy held back counts in `RemediationStats.policy_held_s` instead.

        Now is when it leaves the decision path for its executor: an agent command put on its
        node's stream (after the commit that records it dispatched), a controller-side action
        (quarantine, RMA, notice) as its adapter is called (at_ns: read in the adapter's thread,
        after any wait for a thread or for the node's calls before it). Not the decision's own
        clock reading, taken before deciding and committing, which would leave both out of the figure.
        """
        state = self._state
        event = state.event_times.pop(action.command_id, None)
        if event is not None:
            latency_s = max(0.0, (state.clock() if at_ns is None else at_ns) / 1e9 - event.stored_s)
            if event.held:
                state.stats.policy_held_s.append(latency_s)
            else:
                state.stats.decision_latency_s.append(latency_s)
                state.stats.decision_latency_kinds.append(action.kind)
            if not event.acted:
                # Once per event: a quarantine and the reset that follows it are one response, and
                # timing both would count each such event twice, the second from further away.
                event.acted = True
                state.metrics.time_to_first_action_seconds.observe(latency_s)

    def forget(self, command_id: str, outcome: str) -> None:
        """A command is finished (answered, or no longer awaited): count it by kind and outcome, stop tracking it.

        One that never left has no decision latency (`note_handed_over`), so its arrival time goes too.
        """
        state = self._state
        kind = state.kinds.pop(command_id, "unknown")
        state.unanswered.pop(command_id, None)
        state.event_times.pop(command_id, None)
        blocker = state.held_by.pop(command_id, None)
        if blocker is not None:
            state.held[blocker] = [a for a in state.held.get(blocker, ()) if a.command_id != command_id]
        # Finished without its adapter's outcome (cancelled, or closed before it ran): what waited
        # for it goes now, as it would have had the adapter returned.
        self.send_held(command_id)
        state.metrics.remediation_actions.labels(kind=kind, outcome=outcome).inc()

    def send_now(self, action: actions.Action) -> None:
        """Put a dispatched agent command on its way; without a stream, it waits for the node's reconnect."""
        self._state.unanswered[action.command_id] = action
        if self._outlet.send(action):
            self.note_handed_over(action)
        else:
            # No stream: the command stays dispatched; a reconnect re-sends it with the
            # same id, and the ladder's timeout climbs if the node never comes back. It has
            # not left, so its latency is counted when it does (`resend`).
            log.warning("remediation_node_unreachable", node=action.node_id, action=action.kind)

    def hold(self, action: actions.Action, blocker: str) -> None:
        """Keep a dispatched agent command until the adapter of blocker (its ticket's quarantine) returns."""
        self._state.held.setdefault(blocker, []).append(action)
        self._state.held_by[action.command_id] = blocker

    def send_held(self, blocker: str) -> None:
        """Send the agent commands that waited for blocker's adapter (`hold`)."""
        for held in self._state.held.pop(blocker, ()):
            self._state.held_by.pop(held.command_id, None)
            self.send_now(held)

    def resend(self, node_id: str) -> None:
        """Re-send the node's dispatched, unanswered commands (same ids: the agent never runs one twice).

        A command can be lost with a stream (or with a controller that died after dispatching it);
        the agent answers a repeat from its journal.
        """
        state = self._state
        awaited = escalation.awaited_until(
            state.node_states.get(node_id), now_s=state.now_s(), policy=state.policy.escalation
        )
        for action in [a for a in state.unanswered.values() if a.node_id == node_id]:
            until = awaited.get(action.command_id)
            if until is None:
                # Its wait ran out while the node was away (or this replica was down): the tick
                # closes it and climbs. Sent now, it would run after the rung above it.
                continue
            if self._outlet.send(action, deadline_unix_ns=None if math.isinf(until) else int(until * 1e9)):
                self.note_handed_over(action)  # counted once: only a command never sent before is still timed
