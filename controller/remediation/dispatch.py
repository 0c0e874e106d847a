"""Admission and dispatch: what the disruption budget lets go, recorded dispatched, then carried out.

Undispatched actions go through `blast_radius.admit`; admitted ones are marked dispatched (durably)
and then carried out: repairs and validations as id-keyed agent commands (`Sender`), quarantines,
releases, RMA tickets, notices and BMC power cycles by controller-side adapters (`Adapters`). An
adapter that waits on another system is called once the commit that records its action
dispatched is done; one that waits on nothing (or none: the record is the action) is carried out
in the round, its outcome in the round's own transaction. Deferred actions wait for the next round.
Most decisions are admitted with the decision itself, in its transaction (`admit_with_decision`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

import structlog

from rasd.controller.core import agent_messages as msgs
from rasd.controller.core.remediation import actions, blast_radius, escalation
from rasd.controller.remediation import adapters as adapters_mod
from rasd.controller.remediation import ledger as ledger_mod
from rasd.controller.remediation import passes
from rasd.controller.remediation import results as results_mod
from rasd.controller.remediation import sender as sender_mod
from rasd.controller.remediation import state as state_mod
from rasd.controller.store import records, repo
from rasd.controller.store import remediation as rstore

log = structlog.get_logger("rasd.controller")

MAX_DISPATCH_ROUNDS = 8
"""Dispatch rounds in a row: a controller-side result can admit follow-ups; bounded, never a loop."""
MAX_WAITING_CHECKED = 256
"""Waiting actions checked against the budget for a decision's own admission (`admit_with_decision`)."""

AGENT_KINDS = state_mod.AGENT_KINDS


class Dispatcher:
    """Admits waiting actions within the budget and carries them out once their dispatch is durable."""

    def __init__(
        self,
        state: state_mod.LadderState,
        ledger: ledger_mod.Ledger,
        sender: sender_mod.Sender,
        adapters: adapters_mod.Adapters,
        results: results_mod.Results,
    ) -> None:
        """Share state; stage and commit through ledger; carry out through sender and adapters."""
        self._state = state
        self._ledger = ledger
        self._sender = sender
        self._adapters = adapters
        self._results = results

    # -- with the decision ----------------------------------------------------------------------------------
    def admit_with_decision(
        self,
        new_actions: Sequence[actions.Action],
        states: dict[str, escalation.RemediationState],
        change: rstore.Commit,
        waiting_ahead: Sequence[actions.Action] = (),
    ) -> tuple[dict[str, actions.Action], list[actions.Action]]:
        """Admit a pass's actions into its own transaction; returns them by command id, and the ladder's follow-ups.

        Most decisions are one agent command (restart, reset, reboot), or a quarantine and its
        repair. Admitting them before the decision commits, and recording them as dispatched in
        that commit, saves the dispatch round's transaction and its wait on every such decision.
        The outbox rule is unchanged: no agent command is sent, and no adapter that waits on
        another system (Kubernetes, Slurm, a BMC) is called, before the transaction that says it
        was dispatched has committed (`Ledger.after_commit` returns both; the repair is held until
        its quarantine's adapter has returned, `Sender.hold`). A controller-side action whose
        adapter waits on nothing (record only, or no adapter: an RMA ticket, a notice) is carried
        out here, its record and outcome in the same transaction: the record is the whole of what
        it does, so it is as durable as the decision and no sooner. The ladder's follow-ups to
        those outcomes go into the outbox pending, for the dispatch round.

        Taken only when it cannot change what is admitted or in which order:
        - none of the node's actions waits for admission;
        - what waits for admission (on the waiting list, or left waiting by a pass ahead still
          committing, waiting_ahead) is admitted first by the dispatch round; so the actions are
          admitted now only if the budget admits everything waiting and them together, and at most
          ``MAX_WAITING_CHECKED`` actions wait (more: the budget is binding anyway);
        - an admission that answers with an action of its own (the breaker's notice) is dropped,
          and the two-step way decides it.
        """
        admission = self._admission_with_decision(new_actions, change, waiting_ahead)
        if admission is None:
            return {}, []
        self._take_admission(admission)
        admitted: dict[str, actions.Action] = {}
        for action in admission.admitted:
            self.record_dispatch(action, states, change)
            admitted[action.command_id] = action
        follow_up: list[actions.Action] = []
        for action in admission.admitted:
            if action.kind not in AGENT_KINDS:
                self.record_controller_side(action, change, source="automation")
                self._sender.note_dispatched(action)
                if not self._adapters.leaves_after_commit(action):
                    follow_up += self._carry_out_now(action, change, states)
        return admitted, follow_up

    def _admission_with_decision(
        self, new_actions: Sequence[actions.Action], change: rstore.Commit, waiting_ahead: Sequence[actions.Action]
    ) -> blast_radius.Admission | None:
        """The budget's admission of a pass's own actions, or None where it may not be taken (see above)."""
        if not new_actions:
            return None
        state = self._state
        cancelled = passes.cancelled_ids(change)
        waiting = [a for a in (*state.deferred.values(), *waiting_ahead) if a.command_id not in cancelled]
        if len(waiting) > MAX_WAITING_CHECKED:
            return None
        held = {a.node_id for a in waiting}
        candidates = [a for a in new_actions if a.node_id not in held and a.command_id not in cancelled]
        if not candidates:
            return None
        now = change.now_unix_ns / 1e9
        policy = state.policy.disruption
        if waiting:
            together = blast_radius.admit(state.budget, [*waiting, *candidates], state.fleet_view(), now_s=now,
                                          policy=policy)  # fmt: skip
            if len(together.admitted) != len(waiting) + len(candidates) or together.deferred:
                return None
        admission = blast_radius.admit(state.budget, candidates, state.fleet_view(), now_s=now, policy=policy)
        proposed = {a.command_id for a in candidates}
        if not admission.admitted or any(a.command_id not in proposed for a in admission.admitted):
            return None
        return admission

    def _take_admission(self, admission: blast_radius.Admission) -> None:
        """Hold the budget as an admission leaves it, and log what it deferred (its events' waits are the policy's)."""
        state = self._state
        state.budget = admission.state
        self._ledger.export_budget()
        state.stats.max_disrupted_nodes = max(state.stats.max_disrupted_nodes, len(state.budget.disrupted_nodes()))
        for action, reason in zip(admission.deferred, admission.reasons, strict=False):
            log.info("remediation_deferred", node=action.node_id, action=action.kind, reason=reason)
            if (clock := state.event_times.get(action.command_id)) is not None:
                clock.held = True

    def record_dispatch(
        self, action: actions.Action, states: dict[str, escalation.RemediationState], change: rstore.Commit
    ) -> None:
        """Put an admitted action's dispatch into change: its ticket's dispatch time (in states) and the audit row."""
        now_ns = change.now_unix_ns
        state = states.get(action.node_id) or self._state.node_states.get(action.node_id)
        if state is not None:
            states[action.node_id] = escalation.mark_dispatched(state, action.command_id, now_s=now_ns / 1e9)
        change.audit.append(
            ledger_mod.audit_record(
                now_ns, "automation", action.kind, action.node_id, getattr(action, "gpu_uuid", ""), action.reason,
                "dispatched",
            )
        )  # fmt: skip

    def record_controller_side(self, action: actions.Action, change: rstore.Commit, *, source: str) -> None:
        """Put a controller-side action's record (quarantine, release, RMA) into change and its hold into the budget."""
        if isinstance(action, actions.QuarantineNode | actions.QuarantineGpu | actions.QuarantinePort):
            self._record_quarantine(action, change, source=source)
        elif isinstance(action, actions.Release):
            self._record_release(action, change)
        elif isinstance(action, actions.OpenRma):
            change.rmas.append(
                records.RmaRecord(
                    rma_id=action.command_id,
                    node_id=action.node_id,
                    gpu_uuid=action.gpu_uuid,
                    state="pending",
                    reason=action.reason,
                    evidence={"history": list(action.evidence), "ticket_id": action.ticket_id},
                    opened_unix_ns=change.now_unix_ns,
                )
            )
        elif isinstance(action, actions.Notify):
            log.warning("remediation_notice", node=action.node_id, severity=action.severity, summary=action.summary)

    def _record_quarantine(
        self,
        action: actions.QuarantineNode | actions.QuarantineGpu | actions.QuarantinePort,
        change: rstore.Commit,
        *,
        source: str,
    ) -> None:
        state = self._state
        change.quarantines.append(
            records.QuarantineRecord(
                node_id=action.node_id,
                gpu_uuid=getattr(action, "gpu_uuid", ""),
                port=getattr(action, "ib_port", ""),
                reason=action.reason,
                source=source,
            )
        )
        if isinstance(action, actions.QuarantineNode) and source == "automation":
            state.budget = dataclasses.replace(
                state.budget, quarantined_nodes=tuple(sorted({*state.budget.quarantined_nodes, action.node_id}))
            )
        elif isinstance(action, actions.QuarantineGpu) and source == "automation":
            # Admitted by automation, `blast_radius.admit` counted it already: then the same state.
            state.budget = state.budget.with_gpu(action.node_id, action.gpu_uuid, state.fleet_view(), held=True)

    def _record_release(self, action: actions.Release, change: rstore.Commit) -> None:
        state = self._state
        change.releases.append(
            records.ReleaseRecord(
                node_id=action.node_id,
                gpu_uuid=action.gpu_uuid,
                port=action.ib_port,
                reason=action.reason,
                forced=action.forced,
            )
        )
        if not action.gpu_uuid and not action.ib_port:
            state.budget = dataclasses.replace(
                state.budget,
                quarantined_nodes=tuple(n for n in state.budget.quarantined_nodes if n != action.node_id),
            )
        elif action.gpu_uuid:
            state.budget = state.budget.with_gpu(action.node_id, action.gpu_uuid, state.fleet_view(), held=False)

    def _carry_out_now(
        self, action: actions.Action, change: rstore.Commit, states: dict[str, escalation.RemediationState]
    ) -> list[actions.Action]:
        """Call an admitted controller-side action's adapter that waits on nothing, and fold its outcome into change.

        Its record (`record_controller_side`) is already in change; the call, its audit row and the
        ladder's answer (states) join the same transaction. Returns the ladder's follow-up actions.
        """
        self._sender.note_handed_over(action)
        outcome, message = self._adapters.execute_now(action)
        ledger_mod.outcome_audit(action, change, outcome, source="automation")
        result = msgs.AgentResult(command_id=action.command_id, outcome=outcome, message=message)
        return self._results.result_into(action.node_id, result, change, states)

    # -- dispatch rounds ------------------------------------------------------------------------------------
    async def dispatch_locked(self) -> None:
        """Admit what the budget allows, then carry it out (under the decision lock).

        One transaction records the admitted commands as dispatched together with what the
        controller-side ones (quarantine, release, RMA, notify, power cycle) did and the ladder's
        answer to them; only after it commits are agent commands sent. A crash before that commit
        leaves everything pending (executors are idempotent, so re-running them is harmless); after
        it, agent commands are re-sent with the same ids on reconnect.
        """
        for _round in range(MAX_DISPATCH_ROUNDS):  # a result can admit follow-up actions; bounded, never a loop
            if not self._state.deferred:
                return
            dispatch = await self.stage_dispatch()
            if not dispatch.admitted and not dispatch.change.docs:
                return
            try:  # nothing admitted: only the budget document (a deferral can change it)
                fresh = set(await self._ledger.commit(dispatch.change))
            except Exception:
                # Nothing of this round is durable: the admitted actions are still pending in the
                # store, so they wait here again (the next tick admits them again; controller-side
                # executors are idempotent) and the budget they took is given back.
                self._ledger.undo(dispatch)
                raise
            self.send_dispatched(self._ledger.settle(dispatch, fresh, ()))
            if not dispatch.admitted:
                return

    async def dispatch_after_commit(self) -> None:
        """Dispatch once a decision is durable; if the store fails now, the next tick dispatches."""
        try:
            await self.dispatch_locked()
        except repo.STORE_UNAVAILABLE as exc:
            log.warning("remediation_dispatch_deferred", error=str(exc))

    async def stage_dispatch(self, closing: Collection[str] = ()) -> passes.Pass:
        """Admit what waits and carry out its controller-side part; returns the round staged, not committed.

        Its state is applied in memory (`Ledger.undo` puts it back): the admitted actions leave the
        waiting list, the budget holds them, and the ladder has the controller-side results. Agent
        commands are sent once its commit is done (`send_dispatched`). Only called when every
        decision the waiting actions come from has committed: the adapters act on durable decisions only.

        closing: waiting commands that a later decision, still committing, cancels. They stay on the
        waiting list until that commit is done (`Ledger.close`), and are not admitted meanwhile: sent,
        they would run although their outbox row ends cancelled.
        """
        state = self._state
        now_ns = state.clock()
        budget_before, budget_stored_before = state.budget, state.budget_stored
        waiting = [a for a in state.deferred.values() if a.command_id not in closing]
        admission = blast_radius.admit(
            state.budget, waiting, state.fleet_view(), now_s=now_ns / 1e9, policy=state.policy.disruption
        )
        self._take_admission(admission)
        change = rstore.Commit(now_unix_ns=now_ns)
        touched: dict[str, escalation.RemediationState] = {}
        for action in admission.admitted:
            state.deferred.pop(action.command_id, None)
            update = records.CommandUpdate(action.command_id, "dispatched", dispatched_unix_ns=now_ns)
            change.command_updates.append(update)
            self.record_dispatch(action, touched, change)
            self._sender.note_dispatched(action)
        for action in admission.admitted:
            if action.kind not in AGENT_KINDS:
                self.record_controller_side(action, change, source="automation")
        # Recorded and done in this round: the controller-side actions without an adapter, or with
        # one that waits on nothing. The others leave after the commit, as agent commands do
        # (`send_dispatched`).
        follow_up: list[actions.Action] = []
        for action in admission.admitted:
            if not self._adapters.leaves_after_commit(action):
                follow_up += self._carry_out_now(action, change, touched)
        dispatch = passes.Pass(
            group=[],
            change=change,
            states=touched,
            new_actions=follow_up,
            dispatched={},
            admitted=list(admission.admitted),
            states_before={node_id: state.node_states.get(node_id) for node_id in touched},
            correlation_before=state.correlation,
            budget_before=budget_before,
            budget_stored_before=budget_stored_before,
        )
        state.budget_stored = self._ledger.stage_commit(touched, follow_up, change, {})
        state.node_states.update(touched)
        return dispatch

    def drop_unsent(self, command_id: str, status: str) -> None:
        """A dispatched command finished before it left (`Decider` withheld it): stop tracking it."""
        self._sender.forget(command_id, status)

    def send_dispatched(self, dispatched: Sequence[actions.Action]) -> None:
        """Start the adapters of dispatched controller-side actions, then send the agent commands.

        Adapters first: a repair whose ticket's quarantine is being carried out waits for it
        (`Sender.hold`), sent when its adapter returns. Agent commands go with the same ids again on
        reconnect if lost.
        """
        self._adapters.start_all(dispatched)
        for action in dispatched:
            if action.kind not in AGENT_KINDS:
                continue
            blocker = self._state.adapter_of_ticket.get(action.ticket_id)
            if blocker is not None:
                self._sender.hold(action, blocker)
            else:
                self._sender.send_now(action)
