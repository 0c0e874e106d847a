"""A term's start from the store alone: the ladder's durable state loaded, the outbox resumed.

A controller killed at any point restarts from the store: `pending` commands are re-admitted,
`dispatched` ones are re-sent with the same id (the agent answers a repeat from its journal and
never runs it twice), controller-side ones whose outcome was never committed are carried out again
(their adapters are idempotent), and finished ones are never sent again.
"""

from __future__ import annotations

import dataclasses

from rasd.controller.core.remediation import actions, blast_radius, escalation
from rasd.controller.remediation import adapters as adapters_mod
from rasd.controller.remediation import correlation_docs
from rasd.controller.remediation import ledger as ledger_mod
from rasd.controller.remediation import sender as sender_mod
from rasd.controller.remediation import state as state_mod
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo


async def load_ladder(state: state_mod.LadderState, ledger: ledger_mod.Ledger, node_store: repo.Store) -> None:
    """Every node's ladder state, the fleet the budget counts, the correlation state and when incidents opened."""
    store = ledger.store
    node_docs = await ledger.run(store.load_node_states)
    state.node_states = {n: escalation.RemediationState.from_dict(d) for n, d in node_docs.items()}
    # The budget's fleet is every node the store knows, not only those back on a stream yet:
    # right after a restart, the replayed backlog's demand was weighed against the few nodes
    # that had reconnected ("10 of 5 nodes"), and the circuit breaker tripped on its own count.
    for node in await ledger.run(node_store.list_nodes):
        if node.node_id not in state.streams.node_labels:
            state.streams.remember_remote_node(node.node_id, node.labels, tuple(g.record.uuid for g in node.gpus))
    corr_docs = await ledger.run(store.load_docs, correlation_docs.CORRELATION_PREFIX)
    incident_data = await ledger.run(store.incident_data, correlation_docs.correlation_incident_ids(corr_docs))
    latest = await ledger.run(store.latest_incident_opened)
    ledger.last_incident_s = {node_id: opened_ns / 1e9 for node_id, opened_ns in latest.items()}
    state.correlation = correlation_docs.correlation_from_docs(corr_docs, incident_data)
    await _load_budget(state, ledger)


async def _load_budget(state: state_mod.LadderState, ledger: ledger_mod.Ledger) -> None:
    """The disruption budget: its document, the breaker's demand, and the GPUs automation holds."""
    store = ledger.store
    budget = await ledger.run(store.load_doc, "budget")
    stored = blast_radius.BudgetState.from_dict(budget) if budget else blast_radius.BudgetState()
    # The breaker's demand is in documents of its own. A budget document from before holds it
    # too (its "demand"): merged in, and with nothing counted as stored, the next commit writes
    # it all out as demand documents and rewrites the budget document without it.
    demand_docs = await ledger.run(store.load_docs, ledger_mod.BUDGET_DEMAND_PREFIX)
    state.budget = stored.with_demand(demand_docs.values())
    state.budget_stored = state.budget if (budget or demand_docs) and not stored.demand else None
    # The GPUs automation holds are the store's quarantine rows, not part of the budget document.
    held = await ledger.run(store.quarantines)
    state.budget = state.budget.with_quarantined_gpus(
        (
            (q["node_id"], q["gpu_uuid"])
            for q in held
            if q["gpu_uuid"] and not q["port"] and q["source"] == "automation"
        ),
        state.fleet_view(),
    )


@dataclasses.dataclass(frozen=True)
class Outbox:
    """The outbox's unfinished commands at a term's start, by what becomes of them."""

    pending: list[actions.Action]
    """Still pending: admitted again."""
    resend: list[rstore.CommandRecord]
    """Agent commands dispatched and unanswered: sent again on their node's reconnect."""
    redo: list[actions.Action]
    """Controller-side actions dispatched whose outcome was never committed: carried out again."""
    blockers: dict[str, actions.Action]
    """Ticket id → its controller-side action carried out again whose adapter is called after the commit."""


def outbox(unfinished: list[rstore.CommandRecord], adapters: adapters_mod.Adapters) -> Outbox:
    """Sort the outbox's pending and dispatched commands (see `Outbox`).

    Controller-side actions that were dispatched but whose outcome never got committed are
    carried out again: their executors are idempotent (a repeated quarantine is a no-op that says
    so), so "at least once" here is "exactly once" in effect.
    """
    agent = state_mod.AGENT_KINDS
    pending = [actions.from_dict(r.payload) for r in unfinished if r.status == "pending"]
    resend = [r for r in unfinished if r.status == "dispatched" and r.kind in agent]
    redo = [actions.from_dict(r.payload) for r in unfinished if r.status == "dispatched" and r.kind not in agent]
    blockers: dict[str, actions.Action] = {}
    for record in unfinished:
        if record.status == "dispatched" and record.kind not in agent:
            by_adapter = actions.from_dict(record.payload)
            if adapters.leaves_after_commit(by_adapter):  # its adapter is called after the commit: outcome unknown
                blockers[record.ticket_id] = by_adapter
    return Outbox(pending=pending, resend=resend, redo=redo, blockers=blockers)


def await_answers(state: state_mod.LadderState, sender: sender_mod.Sender, unfinished: Outbox) -> None:
    """Await the dispatched agent commands again: sent on their node's reconnect.

    A repair whose quarantine's outcome was never committed waits for it to be carried out again,
    as it waited the first time: never sent before its node leaves scheduling.
    """
    for record in unfinished.resend:
        action = actions.from_dict(record.payload)
        blocker = unfinished.blockers.get(record.ticket_id)
        if blocker is not None and blocker.node_id == action.node_id and blocker.step < action.step:
            sender.hold(action, blocker.command_id)
        else:
            state.unanswered[record.command_id] = action
