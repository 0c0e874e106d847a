"""Decision passes: the groups of calls decided together, what a pass's commit writes, and how passes chain.

A pass is decided on the state the passes before it leave, before their commits are done; its
commit queues behind theirs (`CommitChain`), and if one fails every pass from it on is undone in
memory (`Pass` keeps what was before). A dispatch round is a pass without calls; it may share the
next pass's transaction (`merged`). A pass also commits the controller-side adapters' outcomes that
returned since the last one (`Pass.outcomes`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

from rasd.controller.core import agent_messages as msgs
from rasd.controller.core.remediation import actions, blast_radius, correlate, escalation
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo


class TermEnded(RuntimeError):
    """This replica's term as leader ended before these events were decided.

    Stored already, the next leader decides them from the store (the events its watermark has not
    covered), on the state the terms before it committed; arriving ones (`Decider.on_arrivals`) may
    not be stored, and their caller stores them.
    """


class StoreStalled(Exception):
    """The store was unavailable for a pass; its groups wait in the inbox to be tried again."""

    def __init__(self, *, events: int) -> None:
        super().__init__(f"{events} events wait for the store")
        self.events = events


class NotRun(RuntimeError):
    """A pipelined commit refused unrun, behind one that failed."""


class CommitChain:
    """The commits of one pipeline run, in order on the store thread; after one fails, the rest are refused.

    Each pass was decided on the passes before it: one committed after a failed one would make
    durable a decision whose grounds never were.
    """

    def __init__(self, commit: Callable[[rstore.Commit], list[str]]) -> None:
        self._commit = commit
        self.broken = False

    def __call__(self, change: rstore.Commit) -> list[str]:
        """Commit change, unless an earlier commit of the chain failed (`NotRun`)."""
        if self.broken:
            raise NotRun("an earlier commit of this pipeline failed")
        try:
            return self._commit(change)
        except BaseException:
            self.broken = True
            raise


class Call(NamedTuple):
    """One `on_events` or `on_arrivals` call waiting to be decided."""

    node_id: str
    events: list[repo.StoredEvent]
    labels: dict[str, str]
    future: asyncio.Future[None]
    append: repo.ExpectedAppend | None = None
    """Set for `on_arrivals`: the events are not stored yet, and are stored by the pass that decides them."""
    stored: Callable[[], None] | None = None
    """`on_arrivals`' callback: called once the pass that stored the events committed, before its commands leave."""


@dataclasses.dataclass
class Pass:
    """A decided group: what its commit writes, what follows it, and how to undo it if it never commits."""

    group: list[Call]
    """The calls it decides (none for a dispatch round)."""
    change: rstore.Commit
    states: dict[str, escalation.RemediationState]
    new_actions: list[actions.Action]
    dispatched: dict[str, actions.Action]
    """The new agent commands admitted with the decision (`Dispatcher.admit_with_decision`)."""
    states_before: dict[str, escalation.RemediationState | None]
    correlation_before: correlate.CorrelationState
    budget_before: blast_radius.BudgetState
    budget_stored_before: blast_radius.BudgetState | None
    detect_s: list[float] = dataclasses.field(default_factory=list)
    new_incidents: list[correlate.Incident] = dataclasses.field(default_factory=list)
    decisions: int = 0
    admitted: list[actions.Action] = dataclasses.field(default_factory=list)
    """A dispatch round's admitted waiting actions (`Dispatcher.stage_dispatch`)."""
    answers: list[Call] = dataclasses.field(default_factory=list)
    """Calls answered once it commits: a dispatch round answers those whose actions it dispatched."""
    rounds: int = 0
    """Dispatch rounds in a row up to this one (a result can admit follow-ups; bounded)."""
    outcomes: list[tuple[str, msgs.AgentResult]] = dataclasses.field(default_factory=list)
    """Adapters' outcomes it commits (`Decider.take_outcomes`), before its calls' events."""
    overlapped: bool = False
    """Decided while a pass ahead of it was committing."""
    commit: asyncio.Future[list[str]] = dataclasses.field(init=False)

    @property
    def leaves_waiting(self) -> bool:
        """Some of its actions wait for admission: their dispatch must follow its commit."""
        return any(a.command_id not in self.dispatched for a in self.new_actions)

    def answers_dispatched(self) -> list[Call]:
        """The calls it answers whose decisions an earlier pass committed (a dispatch round's)."""
        own = {id(call.future) for call in self.group}
        return [call for call in self.answers if id(call.future) not in own]

    def answers_waiting(self) -> list[Call]:
        """The calls it decides: answered when their actions are dispatched."""
        own = {id(call.future) for call in self.group}
        return [call for call in self.answers if id(call.future) in own]


def answer(calls: Sequence[Call], exc: BaseException | None = None) -> None:
    """Return from the `on_events` calls whose decisions are done (or raise exc in them)."""
    for call in calls:
        future = call.future
        if not future.done():
            if exc is None:
                future.set_result(None)
            else:
                future.set_exception(exc)


def cancelled_ids(change: rstore.Commit) -> set[str]:
    """The waiting commands change cancels (`Ledger.close`): they stop waiting once it commits."""
    return {update.command_id for update in change.command_updates if update.status == "cancelled"}


def note_consumed(change: rstore.Commit, node_id: str, events: Sequence[repo.StoredEvent]) -> None:
    """Move node_id's replay watermark in change over decided events: its newest spool epoch's highest seq.

    A pass can hold a node's events of two spools (the agent came back with a new one while the old
    one's last batch was being decided): the new spool's seqs start over, so the old one's, however
    high, say nothing about them. An event that does not know its epoch counts in the one noted.
    """
    seq = change.processed_seq.get(node_id)
    epoch = change.processed_epoch.get(node_id)
    for event in events:
        if event.seq <= 0:
            continue
        if event.spool_epoch is not None and epoch is not None and event.spool_epoch != epoch:
            if event.spool_epoch < epoch:
                continue
            seq = None
        if event.spool_epoch is not None:
            epoch = event.spool_epoch
        seq = event.seq if seq is None else max(seq, event.seq)
    if seq is not None:
        change.processed_seq[node_id] = seq
    if epoch is not None:
        change.processed_epoch[node_id] = epoch


_APPENDED_COMMIT_FIELDS = (
    "event_appends",
    "new_commands",
    "command_updates",
    "incidents",
    "tickets",
    "quarantines",
    "releases",
    "rmas",
    "validations",
    "audit",
)
"""`rstore.Commit`'s lists; the store writes them in order (incidents and tickets: the last row per id)."""


def merged(first: Pass, second: Pass) -> Pass:
    """Two staged passes as one transaction: second was staged on first's state, so its rows go after.

    Upserts keep the last row per key (a node's ladder state, a ticket, a document), so second's
    win where both wrote; the rest is appended in order. Undoing it puts back what was before first.
    """
    change = first.change
    later = second.change
    change.now_unix_ns = later.now_unix_ns
    for node_id, seq in later.processed_seq.items():
        change.processed_seq[node_id] = seq
        if node_id in later.processed_epoch:
            change.processed_epoch[node_id] = later.processed_epoch[node_id]
        else:
            change.processed_epoch.pop(node_id, None)
    change.node_states.update(later.node_states)
    change.docs.update(later.docs)
    for field in _APPENDED_COMMIT_FIELDS:
        getattr(change, field).extend(getattr(later, field))
    return Pass(
        group=second.group,
        change=change,
        states={**first.states, **second.states},
        new_actions=[*first.new_actions, *second.new_actions],
        dispatched=second.dispatched,
        states_before={**second.states_before, **first.states_before},
        correlation_before=first.correlation_before,
        budget_before=first.budget_before,
        budget_stored_before=first.budget_stored_before,
        detect_s=second.detect_s,
        new_incidents=second.new_incidents,
        decisions=second.decisions,
        admitted=[*first.admitted, *second.admitted],
        answers=[*first.answers, *second.answers],
        overlapped=second.overlapped,
        outcomes=[*first.outcomes, *second.outcomes],
    )
