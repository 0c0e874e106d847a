"""What a decision writes, and what follows its commit: the one path from the ladder's state to the store.

Every remediation transaction goes through here: the nodes' new ladder states and their ticket
rows, the outbox (new commands and finished ones), the correlation documents and incident rows,
the disruption budget when it changed, and the audit rows, as one `rstore.Commit`, timed on the
store thread (`store_commit`). Memory follows the store: a pass is applied in memory when it is
staged and undone if its commit fails (`undo`); once a commit is done, `settle` moves the outbox's
in-memory lists on and returns the agent commands to send.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import structlog

from rasd.controller.core import agent_messages as msgs
from rasd.controller.core.remediation import actions, blast_radius, correlate, escalation
from rasd.controller.remediation import correlation_docs, passes
from rasd.controller.remediation import outlet as outlet_mod
from rasd.controller.remediation import sender as sender_mod
from rasd.controller.remediation import state as state_mod
from rasd.controller.store import records
from rasd.controller.store import remediation as rstore
from rasd.controller.store import thread as store_thread

log = structlog.get_logger("rasd.controller")

BUDGET_DEMAND_PREFIX = "budget/demand/"
"""controller_states documents of the circuit breaker's demand (`blast_radius.demand_documents`)."""


def audit_record(
    now_ns: int, actor: str, action: str, node_id: str, gpu_uuid: str, reason: str, outcome: str
) -> records.AuditRecord:
    """An audit row of the ladder (its details empty)."""
    return records.AuditRecord(now_ns, actor, action, node_id, gpu_uuid, reason, outcome)


def incident_record(incident: correlate.Incident, now_ns: int, *, closed: bool = False) -> records.IncidentRecord:
    """The incidents-table row; closed once the correlation window forgot the incident."""
    return records.IncidentRecord(
        incident_id=incident.incident_id,
        node_id=incident.node_id,
        gpu_uuid=incident.gpu_uuid,
        cause=incident.fault_key[:128],
        component=str(incident.classification.component.value)[:32],
        severity=int(incident.classification.severity),
        state="closed" if closed else "open",
        opened_unix_ns=int(incident.opened_at * 1e9),
        closed_unix_ns=now_ns if closed else None,
        data=incident.to_dict(),
    )


def ticket_record(ticket: escalation.Ticket, now_ns: int, *, closed: bool = False) -> records.TicketRecord:
    """The repair_tickets row (a projection of the ticket in the node's ladder state)."""
    return records.TicketRecord(
        ticket_id=ticket.ticket_id,
        node_id=ticket.node_id,
        gpu_uuid=ticket.gpu_uuid,
        incident_id=ticket.incident_ids[0] if ticket.incident_ids else "",
        state=ticket.state.value,
        rung=ticket.rung.word if ticket.rung else "",
        purpose=ticket.purpose.value,
        reason=ticket.reason,
        opened_unix_ns=int(ticket.opened_at * 1e9),
        updated_unix_ns=now_ns if closed else int(ticket.updated_at * 1e9),
        closed=closed,
        steps=[*ticket.history, f"{now_ns / 1e9:.0f} ticket closed"] if closed else list(ticket.history),
    )


def outcome_audit(action: actions.Action, change: rstore.Commit, outcome: msgs.Outcome, *, source: str) -> None:
    """Put a controller-side action's outcome into change's audit rows."""
    change.audit.append(
        audit_record(
            change.now_unix_ns,
            source,
            action.kind,
            action.node_id,
            getattr(action, "gpu_uuid", ""),
            action.reason,
            msgs.outcome_name(outcome),
        )
    )


_STATUS_OUTCOME = {status: msgs.outcome_name(outcome) for status, outcome in (
    ("succeeded", msgs.Outcome.SUCCEEDED), ("failed", msgs.Outcome.FAILED), ("refused", msgs.Outcome.REFUSED),
    ("not_supported", msgs.Outcome.NOT_SUPPORTED), ("timed_out", msgs.Outcome.TIMED_OUT),
    ("dry_run", msgs.Outcome.DRY_RUN),
)}  # fmt: skip
"""An outbox status → the outcome a command finished without a result is recorded with."""


class Ledger:
    """Stages, commits and settles the ladder's transactions (see the module docstring)."""

    def __init__(
        self,
        state: state_mod.LadderState,
        store: rstore.RemediationStore,
        thread: store_thread.StoreThread,
        sender: sender_mod.Sender,
        recorder: outlet_mod.DecisionRecorder,
        *,
        leaves_after_commit: Callable[[actions.Action], bool],
    ) -> None:
        """Share state; commit to store on thread; forget finished commands through sender; tell recorder.

        leaves_after_commit: whether an admitted action leaves once its dispatch has committed
        (`Adapters.leaves_after_commit`).
        """
        self._state = state
        self.store = store
        self.thread = thread
        self._sender = sender
        self._recorder = recorder
        self._leaves_after_commit = leaves_after_commit
        self.on_commit: Callable[[rstore.Commit], None] | None = None
        """Told of every transaction that committed, on the thread that committed it (the watchers'
        fan-out, `rasd.controller.changes.Changes.publish_commit`): it must not block."""
        self.last_incident_s: dict[str, float] = {}
        """Node → when its latest incident opened (``rasd_time_between_incidents_seconds``); from the store at start."""

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A store call on the store thread."""
        return await self.thread.run(fn, *args)

    def store_commit(self, change: rstore.Commit) -> list[str]:
        """`RemediationStore.commit` (on the store thread), timed: every remediation transaction goes through it.

        Only a commit that succeeded is counted: its time is how long a decision waited on the
        database to be durable (``rasd_remediation_commit_seconds``, `RemediationStats.commit_s`).
        """
        started = time.perf_counter()
        fresh = self.store.commit(change)
        seconds = time.perf_counter() - started
        self._state.metrics.remediation_commit_seconds.observe(seconds)
        self._state.stats.commit_s.append(seconds)
        if self.on_commit is not None:
            self.on_commit(change)
        return fresh

    async def commit(self, change: rstore.Commit) -> list[str]:
        """`store_commit` on the store thread; the command ids new in the outbox."""
        return await self.thread.run(self.store_commit, change)

    async def commit_with_budget(self, change: rstore.Commit) -> None:
        """Commit change with the budget staged into it (`stage_budget`); recorded as stored once it succeeded."""
        budget = self.stage_budget(change)
        await self.commit(change)
        self._state.budget_stored = budget

    async def commit_states(
        self,
        states: Mapping[str, escalation.RemediationState],
        new_actions: list[actions.Action],
        change: rstore.Commit,
    ) -> None:
        """Commit the nodes' new ladder states, projections and the new outbox rows in one transaction.

        The new actions go into the outbox pending, admitted later by `Dispatcher.dispatch_locked`.
        """
        budget = self.stage_commit(states, new_actions, change, {})
        fresh = set(await self.commit(change))
        self._state.budget_stored = budget
        self._state.node_states.update(states)
        self.after_commit(new_actions, change, {}, fresh)

    # -- staging ---------------------------------------------------------------------------------------
    def close(
        self,
        decision: escalation.Decision,
        change: rstore.Commit,
        now: float,
        *,
        answered: str = "",
        unanswered_status: str = "cancelled",
    ) -> None:
        """Give back the budget of the commands a decision closed, and finish their outbox rows.

        One still waiting for admission is cancelled. One dispatched and not answered (its timeout
        passed, or its ticket was folded or closed) is finished with unanswered_status: left
        "dispatched", it would be sent again when its node reconnects, or by the next controller
        term, and a reset or reboot the ladder gave up on would run after the rungs above it. The
        answered command (a result's own) is finished by its result. Either leaves the service's
        lists only once change has committed (`after_commit`): a commit that fails leaves it
        there, and the decision made again closes it again.
        """
        state = self._state
        for command_id in decision.closed_command_ids:
            state.budget = blast_radius.complete(state.budget, command_id, now_s=now)
            if command_id in state.deferred:
                change.command_updates.append(records.CommandUpdate(command_id, "cancelled"))
            elif command_id != answered:
                # Dispatched, or admitted in a pass still committing (not yet sent: the pipeline
                # commits in order, so this update lands after its "dispatched"); a final row is
                # left as it is (`rstore._update_commands`).
                change.command_updates.append(
                    records.CommandUpdate(
                        command_id,
                        unanswered_status,
                        finished_unix_ns=change.now_unix_ns,
                        result={
                            "outcome": _STATUS_OUTCOME.get(unanswered_status, ""),
                            "message": f"no longer awaited: {decision.reason}",
                        },
                    )
                )

    def correlation_into(
        self,
        change: rstore.Commit,
        after: correlate.CorrelationState,
        *,
        changed_incidents: bool,
        scopes: Collection[str] | None = None,
        port_nodes: Collection[str] | None = None,
    ) -> None:
        """Add what moving the correlation state from the shared one to after writes.

        That is its documents, the rows of the incidents that changed, and the expired incidents' rows
        closed. scopes and port_nodes: see `correlation_docs.correlation_changes` (None: look at all of them).
        """
        before = self._state.correlation
        docs, changed = correlation_docs.correlation_changes(before, after, scopes=scopes, port_nodes=port_nodes)
        change.docs.update(docs)
        now_ns = change.now_unix_ns
        if changed_incidents:
            change.incidents.extend(incident_record(incident, now_ns) for incident in changed)
        change.incidents.extend(
            incident_record(incident, now_ns, closed=True)
            for incident in correlation_docs.expired_incidents(before, after, scopes=scopes)
        )

    def stage_commit(
        self,
        states: Mapping[str, escalation.RemediationState],
        new_actions: Sequence[actions.Action],
        change: rstore.Commit,
        dispatched: Mapping[str, actions.Action],
    ) -> blast_radius.BudgetState:
        """Put the nodes' new ladder states, their projections and the new outbox rows into change.

        New actions go into the outbox pending, except those in dispatched (admitted with their
        decision), which go in dispatched. The tickets are diffed against the shared node states, so
        this runs before the states are applied. Returns the budget staged (`stage_budget`).
        """
        for node_id, state in states.items():
            self._stage_tickets(node_id, state, change)
        now_ns = change.now_unix_ns
        for action in new_actions:
            admitted = action.command_id in dispatched
            change.new_commands.append(
                rstore.CommandRecord(
                    command_id=action.command_id,
                    node_id=action.node_id,
                    gpu_uuid=getattr(action, "gpu_uuid", ""),
                    ticket_id=action.ticket_id,
                    kind=action.kind,
                    payload=action.to_dict(),
                    status="dispatched" if admitted else "pending",
                    reason=action.reason,
                    created_unix_ns=now_ns,
                    dispatched_unix_ns=now_ns if admitted else None,
                    finished_unix_ns=None,
                    result=None,
                )
            )
        return self.stage_budget(change)

    def _stage_tickets(self, node_id: str, state: escalation.RemediationState, change: rstore.Commit) -> None:
        """The node's ladder state document and the rows of the tickets it changed or let go of."""
        change.node_states[node_id] = state.to_dict()
        # Only tickets this commit changed: the core shares unchanged Ticket values between states.
        before = self._state.node_states.get(node_id)
        unchanged = {id(t) for t in before.tickets} if before is not None else set()
        change.tickets.extend(ticket_record(t, change.now_unix_ns) for t in state.tickets if id(t) not in unchanged)
        if before is not None and before.tickets:
            # A ticket the ladder let go of (released, watch ended, folded, force-released, closed by
            # an operator): its row is closed, or `rasctl repairs --open` would list it for ever.
            still = {t.ticket_id for t in state.tickets}
            change.tickets.extend(
                ticket_record(t, change.now_unix_ns, closed=True) for t in before.tickets if t.ticket_id not in still
            )

    def stage_budget(self, change: rstore.Commit) -> blast_radius.BudgetState:
        """Put the budget into change where it differs from the stored one; returns what is staged.

        The document (a few KB with a burst's nodes in flight) only when it changed, and of the
        breaker's demand only the documents of the times whose nodes changed: written whole, the
        demand was ~80 KB after a 2,000-node burst and rewritten on most of its commits, which
        doubled the burst's p99. The caller records the returned state as stored once its commit
        succeeded, never before: a failed commit leaves the stored copy as it was.
        """
        budget, stored = self._state.budget, self._state.budget_stored
        if budget is not stored:
            if not budget.same_document(stored):
                change.docs["budget"] = budget.to_dict()
            demand = blast_radius.demand_documents(stored.demand if stored is not None else {}, budget.demand)
            change.docs.update((BUDGET_DEMAND_PREFIX + key, doc) for key, doc in demand.items())
        return budget

    # -- after a commit ------------------------------------------------------------------------------------
    def after_commit(
        self,
        new_actions: Sequence[actions.Action],
        change: rstore.Commit,
        dispatched: Mapping[str, actions.Action],
        fresh: set[str],
        admitted: Sequence[actions.Action] = (),
    ) -> list[actions.Action]:
        """What follows a commit of `stage_commit`'s rows; returns the dispatched commands to send now.

        Those are the ones new in the outbox (or pending there before: a decision made again after a
        crash), then the agent commands a dispatch round in the commit admitted (admitted). One the
        outbox already had further on is not sent twice; its hold on the budget is given back. New
        pending ones start waiting for admission, and cancelled ones stop.
        """
        state = self._state
        cancelled = passes.cancelled_ids(change)
        for command_id in cancelled:
            state.deferred.pop(command_id, None)
        leaving = [a for a in admitted if self._leaves_after_commit(a)]
        finished = self._forget_finished(change, {a.command_id for a in leaving})
        self._recorder.decisions([a for a in new_actions if a.command_id in fresh], change.now_unix_ns)
        sent: list[actions.Action] = []
        now = change.now_unix_ns / 1e9
        for action in new_actions:
            if action.command_id not in dispatched:
                # One a later event of the same pass superseded is in the outbox cancelled: it never waits.
                if action.command_id in fresh and action.command_id not in cancelled:
                    state.deferred[action.command_id] = action
            elif action.command_id in fresh:
                if action.kind in state_mod.AGENT_KINDS:
                    self._sender.note_dispatched(action)
                    sent.append(action)
                elif self._leaves_after_commit(action):  # its adapter waits on another system: called now
                    sent.append(action)
            else:
                log.info("remediation_command_exists", node=action.node_id, command_id=action.command_id)
                state.budget = blast_radius.complete(state.budget, action.command_id, now_s=now)
        sent.extend(a for a in leaving if a.command_id not in finished)
        return sent

    def _forget_finished(self, change: rstore.Commit, unsent: set[str]) -> set[str]:
        """Forget the commands change finished (`close`, or a result's own); their ids.

        Such a command is one sent and unanswered (a result's own among them), an adapter's call
        whose outcome this was, or one the round admitted (unsent) and the pass committed with it
        superseded (`passes.merged`), which so never leaves.
        """
        state = self._state
        finished: set[str] = set()
        for update in change.command_updates:
            command_id = update.command_id
            if update.status in rstore.FINAL_STATUSES and (
                command_id in state.unanswered
                or command_id in state.running
                or command_id in state.held_by
                or (command_id in unsent and command_id not in finished)
            ):
                finished.add(command_id)
                self._sender.forget(command_id, update.status)
        return finished

    def settle(self, done: passes.Pass, fresh: set[str], later: Sequence[passes.Pass]) -> list[actions.Action]:
        """A pass's commit is done: count it, and return its commands to send now.

        later: the passes decided after it, still in flight; a hold on the budget given back here
        stays given back should one of them be undone.
        """
        for call in done.group:
            if call.stored is not None:
                call.stored()
        sent = self.after_commit(done.new_actions, done.change, done.dispatched, fresh, done.admitted)
        now = done.change.now_unix_ns / 1e9
        for command_id in done.dispatched.keys() - fresh:
            for undoable in later:
                undoable.budget_before = blast_radius.complete(undoable.budget_before, command_id, now_s=now)
        self._count(done)
        if done.change.quarantines or done.change.releases:
            # The gauge is refreshed by the next tick, not here: counting is a query, and a
            # burst dispatches many times a second while Prometheus scrapes every few seconds.
            self._state.quarantine_gauge_stale = True
        return sent

    def _count(self, done: passes.Pass) -> None:
        """A committed pass's events, decisions and new incidents, in the stats and metrics."""
        stats, metrics = self._state.stats, self._state.metrics
        stats.events += len(done.detect_s)
        stats.decisions += done.decisions
        if done.group:
            stats.passes += 1
            stats.passes_overlapped += done.overlapped
        for seconds in done.detect_s:
            metrics.time_to_detect_seconds.observe(seconds)
        for incident in done.new_incidents:
            metrics.incident_opened(incident.fault_key, str(incident.classification.component.value))
            self._note_incident_opened(incident)

    def _note_incident_opened(self, incident: correlate.Incident) -> None:
        """Observe the time since the node's previous incident opened (its committed new incident).

        An incident opens at the controller's clock: one that opened before the node's latest (the
        clock stepped back, or a new leader's runs behind the last one's) is not an interval and
        moves nothing back.
        """
        previous = self.last_incident_s.get(incident.node_id)
        if previous is not None and incident.opened_at >= previous:
            self._state.metrics.time_between_incidents_seconds.observe(incident.opened_at - previous)
        if previous is None or incident.opened_at > previous:
            self.last_incident_s[incident.node_id] = incident.opened_at

    def undo(self, undone: passes.Pass) -> None:
        """Put memory back as it was before a pass whose commit did not happen."""
        state = self._state
        for node_id, before in undone.states_before.items():
            if before is None:
                state.node_states.pop(node_id, None)
            else:
                state.node_states[node_id] = before
        state.correlation = undone.correlation_before
        state.budget = undone.budget_before
        state.budget_stored = undone.budget_stored_before
        for action in undone.admitted:
            state.deferred.setdefault(action.command_id, action)

    # -- gauges --------------------------------------------------------------------------------------------
    def export_budget(self) -> None:
        """The breaker and pause gauges, from the budget in memory."""
        metrics = self._state.metrics
        metrics.breaker_tripped.set(1 if self._state.budget.breaker_tripped else 0)
        metrics.automation_paused.set(1 if self._state.budget.paused else 0)

    async def export_quarantines(self) -> None:
        """The quarantine gauge, counted in the store (what is committed)."""
        counts = await self.thread.run(self.store.quarantine_counts)
        for scope, count in counts.items():
            self._state.metrics.quarantined.labels(scope=scope).set(count)
