"""The group-commit decision pipeline: events through the pure core, committed in passes, under the decision lock.

A node's new health events, each converted to the core's `HealthEvent`, are run through
`escalation.handle_event`. Calls that arrive while a pass runs are decided together in the next
one (group commit, at most ``MAX_GROUP_EVENTS`` calls). The changed ladder states, correlation
documents and incidents and the decisions' actions (the outbox) are committed in one transaction
before anything is sent. Events that arrive in order from their stream (`on_arrivals`) are stored
in that transaction too, checked to be new there, and acked once it is done; the others
(`on_events`) were stored first.

With a commit writer process, a pass is decided while the one before it commits (the pipeline): it
is decided on the state the passes before it leave, and its commit queues behind theirs. If one
fails, the commits queued behind it are refused unrun, every pass from it on is undone in memory,
newest first, and their groups go back to the inbox (`_abandon`). A pass that leaves actions
waiting for admission is followed, once its commit is done, by a dispatch round.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from rasd.controller.core import agent_messages as msgs
from rasd.controller.core.remediation import actions, correlate, escalation
from rasd.controller.core.remediation import events as health
from rasd.controller.remediation import dispatch as dispatch_mod
from rasd.controller.remediation import ledger as ledger_mod
from rasd.controller.remediation import passes
from rasd.controller.remediation import results as results_mod
from rasd.controller.remediation import state as state_mod
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo

log = structlog.get_logger("rasd.controller")

MAX_GROUP_EVENTS = 512
"""Upper bound on the stored events decided together in one transaction."""
STORE_RETRY_S = 1.0
"""Pause before deciding a group again after the store was unavailable."""
MAX_PIPELINED_PASSES = 8
"""Passes decided in one hold of the decision lock while something else waits for it (a result, a
tick, an operator): it waits for no more. While nothing waits, the decider keeps the lock and its
pipeline full: ending a hold drains the pipeline (the last commit, then a dispatch round alone),
and in a burst the events that arrived meanwhile wait for that drain."""
PIPELINE_DEPTH = 2
"""Decided passes not yet committed, with a writer process: one commits while the next is decided."""
PIPELINE_GATHER_S = {"sqlite": 0.002, "postgresql": 0.01}
"""How long the decider waits for the pass ahead to commit before deciding what arrived meanwhile, by backend.

Deciding sooner makes smaller passes and more commits, each with its fixed cost; later leaves the
writer idle and the events waiting. A SQLite commit is a few milliseconds, so a short gather lowers
the burst's latency; a PostgreSQL commit is several round trips, so it gathers longer.
`bench/remediation_ab.py` compares two values (bench/RESULTS.md)."""

# Attributes the agent puts on events, mapped onto the core's typed signal fields.
_FLOAT_SIGNALS = {
    "ecc_sbe_rate_per_s": "ecc_sbe_rate_per_s",
    "nvlink_errors_per_s": "nvlink_crc_rate_per_s",
    "pcie_replays_per_s": "pcie_replay_rate_per_s",
}
_INT_SIGNALS = ("recovery_action", "remapped_rows_uncorrectable", "remapped_rows_correctable", "retired_pages")


def health_event(event: repo.StoredEvent, *, nvlink_domain: str = "") -> health.HealthEvent:
    """The core's view of a stored event; numeric signals come from the agent's attributes."""
    attributes = dict(event.attributes)
    signals: dict[str, Any] = {}
    # Membership first: most events carry none of these, and a suppress() block per key is not free.
    for key, field in _FLOAT_SIGNALS.items():
        if key in attributes:
            with contextlib.suppress(ValueError):
                signals[field] = float(attributes[key])
    for key in _INT_SIGNALS:
        if key in attributes:
            with contextlib.suppress(ValueError):
                signals[key] = int(attributes[key])
    if "retired_pages_pending" in attributes:
        signals["retired_pages_pending"] = attributes["retired_pages_pending"].lower() == "true"
    return health.HealthEvent(
        node_id=event.node_id,
        kind=health.EventKind(event.kind),
        observed_at=event.observed_unix_ns / 1e9,
        gpu_uuid=event.gpu_uuid,
        xid=event.xid,
        severity=health.Severity(event.severity),
        message=event.message,
        source=event.source,
        attributes=attributes,
        seq=event.seq,
        nvlink_domain=nvlink_domain,
        **signals,
    )


@dataclasses.dataclass
class _Decisions:
    """What a pass's events decided, gathered event by event (`Decider._decide_call`)."""

    correlation: correlate.CorrelationState
    states: dict[str, escalation.RemediationState] = dataclasses.field(default_factory=dict)
    new_actions: list[actions.Action] = dataclasses.field(default_factory=list)
    detect_s: list[float] = dataclasses.field(default_factory=list)
    """Counted only once the decision is committed: a group retried after a store failure is not counted twice."""
    new_incidents: list[correlate.Incident] = dataclasses.field(default_factory=list)
    decisions: int = 0
    scopes: set[str] = dataclasses.field(default_factory=set)
    """The correlation scopes the events touched: nothing else changes."""
    port_nodes: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class _Run:
    """One hold of the decision lock: its commit chain, the passes in flight, and a dispatch round to carry."""

    chain: passes.CommitChain
    inflight: list[passes.Pass]
    carried: passes.Pass | None = None
    """A dispatch round staged, to commit with the next pass."""
    passes: int = 0


class Decider:
    """Decides stored and arriving events in group-committed passes (see the module docstring)."""

    def __init__(
        self,
        state: state_mod.LadderState,
        ledger: ledger_mod.Ledger,
        dispatcher: dispatch_mod.Dispatcher,
        results: results_mod.Results,
    ) -> None:
        """Share state; stage and commit through ledger; admit and send through dispatcher; results: outcomes."""
        self._state = state
        self._ledger = ledger
        self._dispatcher = dispatcher
        self._results = results
        self.inbox: list[passes.Call] = []
        self.outcomes: list[tuple[str, msgs.AgentResult]] = []
        """Adapters' outcomes for the next pass (`take_outcomes`)."""
        self._task: asyncio.Task[None] | None = None
        self.pipeline_depth = 1
        """Decided passes in flight at once (`RemediationService.use_writer`): with commits in this process, 1."""
        self._gather_s = PIPELINE_GATHER_S.get(ledger.store.engine.dialect.name, max(PIPELINE_GATHER_S.values()))
        """`PIPELINE_GATHER_S` for this store's backend."""
        self._withheld: dict[str, actions.Action] = {}
        """Committed dispatched commands of tickets a pass still committing cancels a command of (`_head_committed`)."""

    @property
    def quiet(self) -> bool:
        """No event or adapter's outcome waits, and no pass, result, tick or operator action holds the lock."""
        return not self.inbox and not self.outcomes and not self._state.lock.locked()

    async def on_events(self, node_id: str, events: Sequence[repo.StoredEvent], labels: Mapping[str, str]) -> None:
        """Run newly stored events through the core, commit, dispatch; returns once they are decided.

        Calls from many streams are grouped: whatever is waiting when the decider is free is decided
        together and committed in one transaction (group commit), so a burst costs one correlation
        snapshot and one commit per group instead of per event.
        """
        if not events:
            return
        await self._decide_call(node_id, events, labels)

    async def on_arrivals(
        self,
        node_id: str,
        events: Sequence[repo.StoredEvent],
        labels: Mapping[str, str],
        append: repo.ExpectedAppend,
        stored: Callable[[], None] | None = None,
    ) -> None:
        """`on_events` for events not stored yet: the transaction of the pass that decides them stores them.

        In a burst, storing the events and then committing the decision on them were two
        transactions, each waiting for the disk, one after the other: here both are durable at
        once (`rstore.Commit.event_appends`). The pass decides them as new, so their transaction
        checks that they are (append: what the caller expects storing them to do) and is refused
        otherwise. stored is called as soon as that transaction committed, before any command it
        dispatched leaves (the caller acks the events there, as it did before their decision).

        Raises:
            repo.EventsNotAsExpected: storing them would not have done what append says (a resend,
                a spool the node has left): nothing of the pass was written, and the caller stores
                them on their own, which sorts out which of them are new.
            passes.TermEnded: this term ended first; whether they were stored is not known (store them).
            Exception: the core failed on them; nothing of them was written.
        """
        await self._decide_call(node_id, events, labels, append, stored)

    def take_outcomes(self, outcomes: Sequence[tuple[str, msgs.AgentResult]]) -> None:
        """Controller-side adapters' outcomes (node, result): the next pass commits them, with the events waiting.

        In a storm hundreds of quarantines return a second. Each batch committed on its own took the
        decision lock from the pipeline, which drained (its last commit) before every hand-over,
        while the events that arrived meanwhile waited; in a pass they cost no commit of their own.
        An outcome that reaches an ended term is dropped: the next term runs the call again (the
        adapters are idempotent).
        """
        if self._state.term_ended:
            log.info("remediation_adapter_outcomes_dropped", results=len(outcomes), why="this term ended")
            return
        self.outcomes.extend(outcomes)
        self._start()

    def _start(self) -> None:
        """Run the decider unless it runs."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._decide_waiting(), name="rasd-remediation-decider")

    async def stop(self) -> None:
        """End the term: no more deciding; the calls waiting hear `TermEnded`.

        Events waiting for the decider, or put back by a pass the store could not take, were to be
        decided on this term's state; a later term of this replica decided them again on its own
        (after another leader had decided them) and moved the watermark back. Its passes in flight
        are answered; a commit already handed to the store ends there, under this term's fence.
        """
        self._state.term_ended = True
        self._withheld.clear()  # dispatched in the store: the next term sends what is still due
        self.outcomes.clear()  # and runs those calls again
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        stale, self.inbox = self.inbox, []
        ended = passes.TermEnded(f"this replica's term ended before {len(stale)} event groups were decided")
        passes.answer(stale, ended)

    async def _decide_call(
        self,
        node_id: str,
        events: Sequence[repo.StoredEvent],
        labels: Mapping[str, str],
        append: repo.ExpectedAppend | None = None,
        stored: Callable[[], None] | None = None,
    ) -> None:
        if self._state.term_ended:
            # A decider started now would decide on the ended term's state, and commit after its
            # stop. Stored events wait for the next term's replay; arriving ones are stored apart.
            raise passes.TermEnded(f"this replica's term ended: {len(events)} events of {node_id} not decided")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.inbox.append(passes.Call(node_id, list(events), dict(labels), future, append, stored))
        self._start()
        await future

    async def _decide_waiting(self) -> None:
        while self.inbox or self.outcomes:
            try:
                async with self._state.lock:
                    await self._run_pipeline()
            except passes.StoreStalled as stalled:
                # The events are stored and acked already, so their decision is owed: the groups went
                # back first in line (`_abandon`), to be tried again. Their callers wait (their
                # streams stop reading, so the agents spool) rather than fail, which would leave the
                # events undecided until restart.
                log.warning("remediation_store_unavailable", events=stalled.events, error=str(stalled.__cause__))
                await asyncio.sleep(STORE_RETRY_S)
            except Exception:  # a bug: the passes' callers heard of it (`_run_pipeline`); go on with the rest
                log.exception("remediation_pipeline_failed")

    async def _run_pipeline(self) -> None:
        """Decide waiting groups, each pass while the one before it commits, until something else wants the lock.

        A pass is decided on the state the passes before it leave, before their commits are done
        (`_decide_pass` applies it in memory at once), and its commit queues behind theirs on the
        store thread. Nothing is sent and no caller hears back before a pass's own commit is done
        (`_head_committed`). If one fails, the chain refuses the commits queued behind it unrun, every
        pass from it on is undone in memory, newest first, and their groups go back to the inbox.

        A pass that leaves actions waiting for admission (a quarantine goes before its node's
        repair) is followed, once its commit is done, by a dispatch round (`Dispatcher.stage_dispatch`,
        whose adapters so act on durable decisions only). When events wait, the round shares the next
        pass's transaction (`passes.merged`): one commit, not two, per pass in a burst. Callers return
        once their decisions are durable and their commands dispatched.
        """
        inflight: list[passes.Pass] = []
        try:
            await self._pipeline(inflight)
        except passes.StoreStalled:
            raise
        except asyncio.CancelledError:  # the term ended (`stop`): no caller waits for ever
            for unfinished in inflight:
                passes.answer(
                    unfinished.answers, passes.TermEnded("this replica's term ended while the decision was committed")
                )
            raise
        except Exception as exc:
            for unfinished in inflight:
                passes.answer(unfinished.answers, exc)
            raise

    async def _pipeline(self, inflight: list[passes.Pass]) -> None:
        run = _Run(passes.CommitChain(self._ledger.store_commit), inflight)
        while True:
            deciding = sum(1 for p in inflight if p.group or p.outcomes)  # dispatch rounds do not hold it up
            wanted = self._state.lock.waiting > 0  # a result, a tick or an operator waits for the lock
            open_for_more = (run.passes < MAX_PIPELINED_PASSES or not wanted) and deciding < self.pipeline_depth
            if open_for_more and (self.inbox or self.outcomes):
                self._decide_next(run)
                continue
            if run.carried is not None:  # no pass to share a transaction with
                self._submit(run, run.carried)
                run.carried = None
                continue
            if not inflight:
                self._send_withheld()
                return
            head = inflight[0]
            if not head.commit.done():
                # While the head commits, what arrives meanwhile is decided as the next pass.
                await asyncio.wait([head.commit], timeout=self._gather_s if open_for_more else None)
                continue
            try:
                fresh = head.commit.result()
            except BaseException as exc:
                await self._abandon(inflight, exc)
                return
            inflight.pop(0)
            run.carried = await self._head_committed(head, set(fresh), inflight)

    def _decide_next(self, run: _Run) -> None:
        """Decide the next group waiting, merged with a dispatch round carried, and queue its commit."""
        inflight = run.inflight
        group, self.inbox = self.inbox[:MAX_GROUP_EVENTS], self.inbox[MAX_GROUP_EVENTS:]
        outcomes, self.outcomes = self.outcomes, []
        run.passes += 1
        # Actions a pass ahead left waiting are not on the waiting list until it commits.
        waiting_ahead = [a for p in inflight for a in p.new_actions if a.command_id not in p.dispatched]
        decided = self._decide_or_fail(group, waiting_ahead, outcomes)
        if decided is not None:
            decided.answers = list(group)
            decided.overlapped = bool(inflight)
        if run.carried is not None:
            decided = run.carried if decided is None else passes.merged(run.carried, decided)
            run.carried = None
        if decided is not None:
            self._submit(run, decided)

    async def _head_committed(
        self, head: passes.Pass, fresh: set[str], inflight: list[passes.Pass]
    ) -> passes.Pass | None:
        """The head pass committed: send its commands, answer its callers; returns a dispatch round to carry.

        Its callers whose actions wait for admission are answered by that round. What a pass still
        committing cancels (decided on this one's state before it was durable: a reboot that supersedes
        the reset this one dispatched) is withheld until that commit is done, and never leaves if it
        is; sent now, the agent would run a repair its ladder had dropped. The other commands of
        those tickets wait with them (a repair never leaves before its quarantine's adapter is
        called), and leave with the first commit after which no pass in flight cancels any of them.
        """
        self._forget_withheld(head.change)
        closing = {c for p in inflight for c in passes.cancelled_ids(p.change)}
        sent = self._ledger.settle(head, fresh, inflight)
        self._results.committed(head.outcomes)
        self._withheld.update((a.command_id, a) for a in sent)
        closing_tickets = {a.ticket_id for a in self._withheld.values() if a.command_id in closing}
        leaving = [a for a in self._withheld.values() if a.ticket_id not in closing_tickets]
        for action in leaving:
            del self._withheld[action.command_id]
        self._dispatcher.send_dispatched(leaving)
        passes.answer(head.answers_dispatched())
        waiting = head.answers_waiting()
        if not (head.leaves_waiting and head.rounds < dispatch_mod.MAX_DISPATCH_ROUNDS and self._state.deferred):
            passes.answer(waiting)
            return None
        try:
            # Not what a pass still committing cancels: it waits only until that commit is done.
            dispatch = await self._dispatcher.stage_dispatch(closing=closing)
        except Exception as exc:  # a bug: nothing of the round is committed; the next tick tries again
            log.exception("remediation_dispatch_failed")
            passes.answer(waiting, exc)
            return None
        dispatch.answers, dispatch.rounds = waiting, head.rounds + 1
        if dispatch.admitted or dispatch.change.docs:
            return dispatch
        passes.answer(waiting)
        return None

    def _forget_withheld(self, change: rstore.Commit) -> None:
        """The withheld commands a committed change finished: they never leave."""
        for update in change.command_updates:
            if update.command_id in self._withheld and update.status in rstore.FINAL_STATUSES:
                del self._withheld[update.command_id]
                self._dispatcher.drop_unsent(update.command_id, update.status)

    def _send_withheld(self) -> None:
        """No pass is in flight: what is still withheld was cancelled by a pass undone since, and leaves now."""
        if self._withheld:
            withheld, self._withheld = list(self._withheld.values()), {}
            self._dispatcher.send_dispatched(withheld)

    def _submit(self, run: _Run, staged: passes.Pass) -> None:
        """Queue a staged pass's commit behind those in flight."""
        staged.commit = asyncio.ensure_future(self._ledger.run(run.chain, staged.change))
        run.inflight.append(staged)

    async def _abandon(self, inflight: list[passes.Pass], exc: BaseException) -> None:
        """The head pass's commit failed: undo it and every pass staged on it; their groups wait again."""
        for later in inflight[1:]:
            with contextlib.suppress(BaseException):
                await later.commit  # refused by the chain, unrun: nothing of it is durable
        for undone in reversed(inflight):
            self._ledger.undo(undone)
        self._ledger.export_budget()
        self._send_withheld()
        head = inflight[0]
        later_groups = [call for p in inflight[1:] for call in p.group]
        later_outcomes = [outcome for p in inflight[1:] for outcome in p.outcomes]
        # The callers a dispatch round was to answer have their decisions durable; their actions
        # wait for the next round (the next pass or tick).
        for undone in inflight:
            passes.answer(undone.answers_dispatched())
        if isinstance(exc, repo.STORE_UNAVAILABLE):
            # The adapters' outcomes are owed, applied by a tick (`Results.owed`): retried here, an
            # outcome alone would come straight back to a store that is down.
            self._results.owed.extend([*head.outcomes, *later_outcomes])
            self.inbox[:0] = [*head.group, *later_groups]
            if head.group:
                raise passes.StoreStalled(events=sum(len(call.events) for call in self.inbox)) from exc
            log.warning("remediation_dispatch_deferred", error=str(exc))
            return
        if isinstance(exc, repo.EventsNotAsExpected):
            # Arriving events that were not new after all: their callers store them on their own,
            # and hand on what is new; the rest of the head's group is decided again.
            self.inbox[:0] = [call for call in head.group if call.append is None] + later_groups
            self.outcomes[:0] = [*head.outcomes, *later_outcomes]
            passes.answer([call for call in head.group if call.append is not None], exc)
            return
        # Anything else (a fenced replica's refusal, a bug): the head's callers hear of it, and
        # the passes behind it, never run, are decided again. The head's adapters' outcomes are
        # dropped (logged): the next term runs those calls again.
        self.inbox[:0] = later_groups
        self.outcomes[:0] = later_outcomes
        if head.outcomes:
            log.error("remediation_adapter_outcomes_dropped", results=len(head.outcomes), error=repr(exc))
        passes.answer(head.group, exc)

    def _decide_or_fail(
        self,
        group: list[passes.Call],
        waiting_ahead: Sequence[actions.Action],
        outcomes: list[tuple[str, msgs.AgentResult]],
    ) -> passes.Pass | None:
        """`_decide_pass`, or None when the core failed on the group: its callers hear of it.

        The adapters' outcomes go to the next pass; failing alone, they are dropped (logged).
        """
        budget = self._state.budget
        try:
            return self._decide_pass(group, waiting_ahead, outcomes)
        except Exception as exc:  # the callers' streams see it; nothing of the group was applied
            self._state.budget = budget
            passes.answer(group, exc)
            if group:
                self.outcomes[:0] = outcomes
            elif outcomes:
                log.exception("remediation_adapter_results_failed", results=len(outcomes))
            return None

    def _decide_pass(
        self,
        group: list[passes.Call],
        waiting_ahead: Sequence[actions.Action],
        outcomes: list[tuple[str, msgs.AgentResult]],
    ) -> passes.Pass:
        """Decide a group and stage its commit; its state is applied in memory now, undone if the commit fails.

        waiting_ahead: the actions passes still committing left waiting (`Dispatcher.admit_with_decision`).
        outcomes: adapters' outcomes, into the ladder before the group's events; their follow-ups wait
        for admission, as after a result committed on its own.
        """
        state = self._state
        now_ns = state.clock()
        budget_before = state.budget
        change = rstore.Commit(now_unix_ns=now_ns)
        decided = _Decisions(correlation=state.correlation)
        follow_ups = self._results.results_into(outcomes, change, decided.states) if outcomes else []
        for call in group:
            self._decide_call_events(call, decided, change, now_ns / 1e9)
        self._ledger.correlation_into(
            change, decided.correlation, changed_incidents=True, scopes=decided.scopes, port_nodes=decided.port_nodes
        )
        states, new_actions = decided.states, decided.new_actions
        dispatched, follow_up = self._dispatcher.admit_with_decision(new_actions, states, change, waiting_ahead)
        new_actions.extend(follow_up)
        new_actions.extend(follow_ups)
        staged = passes.Pass(
            group=group,
            change=change,
            states=states,
            new_actions=new_actions,
            dispatched=dispatched,
            detect_s=decided.detect_s,
            new_incidents=decided.new_incidents,
            decisions=decided.decisions,
            states_before={node_id: state.node_states.get(node_id) for node_id in states},
            correlation_before=state.correlation,
            budget_before=budget_before,
            budget_stored_before=state.budget_stored,
            outcomes=outcomes,
        )
        state.budget_stored = self._ledger.stage_commit(states, new_actions, change, dispatched)
        state.node_states.update(states)
        state.correlation = decided.correlation
        return staged

    def _decide_call_events(self, call: passes.Call, decided: _Decisions, change: rstore.Commit, now: float) -> None:
        """Run one call's events through the core, in order, into decided and change."""
        node_id, events, labels, _future, append, _stored = call
        if append is not None:
            change.event_appends.append(append)
        shared = self._state
        states = decided.states
        corr = decided.correlation
        node_state = states.get(node_id) or shared.state_of(node_id)
        nvlink_domain = shared.labels_of(node_id, labels).get("nvlink_domain", "")
        scopes, port_nodes, detect_s = decided.scopes, decided.port_nodes, decided.detect_s
        catalog, policy = shared.catalog, shared.policy
        for stored in events:
            event = health_event(stored, nvlink_domain=nvlink_domain)
            scopes.add(correlate.scope_of(event))
            port_nodes.add(event.node_id)
            result = escalation.handle_event(corr, node_state, event, now_s=now, catalog=catalog, policy=policy)
            corr = result.correlation.state
            node_state = result.decision.state
            detect_s.append(max(0.0, (stored.received_unix_ns - stored.observed_unix_ns) / 1e9))
            if result.correlation.incident is not None and result.correlation.outcome is correlate.Outcome.NEW:
                decided.new_incidents.append(result.correlation.incident)
            if result.decision.actions:
                self._note_decision(node_id, stored, result.decision, decided)
            self._ledger.close(result.decision, change, now)
        decided.correlation = corr
        if node_state is not (states.get(node_id) or shared.node_states.get(node_id)):
            states[node_id] = node_state  # a duplicate or secondary leaves the node's state as it was: not rewritten
        passes.note_consumed(change, node_id, events)

    def _note_decision(
        self, node_id: str, stored: repo.StoredEvent, decision: escalation.Decision, decided: _Decisions
    ) -> None:
        """An event that led to actions: time them from its arrival, gather them, log the decision."""
        decided.decisions += 1
        clock = state_mod.EventClock(stored.received_unix_ns / 1e9)  # shared: its first command to leave is timed
        for action in decision.actions:
            self._state.event_times.setdefault(action.command_id, clock)
        decided.new_actions.extend(decision.actions)
        log.info(
            "remediation_decided",
            node=node_id,
            seq=stored.seq,
            actions=[a.kind for a in decision.actions],
            reason=decision.reason,
        )
