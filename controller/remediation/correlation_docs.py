"""The correlation state in the store: one document per scope and per node's port history, incidents in their rows.

A decision rewrites only what it changed (`correlation_changes`), and a new term rebuilds the
state from the documents and the incidents' rows (`correlation_from_docs`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from rasd.controller.core.remediation import correlate

CORRELATION_PREFIX = "correlation/"
"""controller_states names of the correlation state: one document per scope ("correlation/incidents/<scope>")
and per node's IB port history ("correlation/ports/<node>"), so a decision rewrites only what it changed."""


def correlation_changes(
    before: correlate.CorrelationState,
    after: correlate.CorrelationState,
    *,
    scopes: Collection[str] | None = None,
    port_nodes: Collection[str] | None = None,
) -> tuple[dict[str, Any], list[correlate.Incident]]:
    """What a decision must write for its correlation state: documents, and incidents for their rows.

    A scope's document lists its incidents' ids in order (``{"ids": [...]}``), written only when
    that list changes (an incident opened or expired; None: the scope is gone, delete it). Each
    incident's data lives in its row of the incidents table, which operators query anyway: every
    incident that differs from before is returned for that row, in the same transaction. So a
    duplicate, the most common event in a burst, rewrites one incident row, not its whole scope.
    The core shares unchanged scope tuples and incidents between states, so identity tells what
    changed.

    scopes and port_nodes, when given, are the only scopes and nodes whose entries can differ
    (those of the events that moved before to after: `correlate.correlate` touches the event's scope
    and node alone), so a small pass does not walk every scope in the fleet.
    """
    docs: dict[str, Any] = {}
    changed: list[correlate.Incident] = []
    for scope in set(before.incidents) | set(after.incidents) if scopes is None else scopes:
        incidents = after.incidents.get(scope, ())
        old = before.incidents.get(scope, ())
        if incidents is old:
            continue
        kept = {id(i) for i in old}
        changed.extend(i for i in incidents if id(i) not in kept)
        ids = [i.incident_id for i in incidents]
        if ids != [i.incident_id for i in old]:
            docs[f"{CORRELATION_PREFIX}incidents/{scope}"] = {"ids": ids} if ids else None
    for node in set(before.ports) | set(after.ports) if port_nodes is None else port_nodes:
        ports = after.ports.get(node)
        if ports is not before.ports.get(node):
            docs[f"{CORRELATION_PREFIX}ports/{node}"] = (
                {
                    "items": [
                        {"node_id": p.node_id, "ib_port": p.ib_port, "changed_at": list(p.changed_at)} for p in ports
                    ]
                }
                if ports
                else None
            )
    return docs, changed


def correlation_incident_ids(docs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The incident ids the scope documents name (their data is read from the incidents table)."""
    prefix = f"{CORRELATION_PREFIX}incidents/"
    return [i for name, doc in docs.items() if name.startswith(prefix) for i in doc.get("ids", ())]


def correlation_from_docs(
    docs: Mapping[str, Mapping[str, Any]], incident_data: Mapping[str, Mapping[str, Any]] | None = None
) -> correlate.CorrelationState:
    """Rebuild the correlation state from its per-scope documents and the incidents' stored data.

    Args:
        docs: the ``correlation/`` documents.
        incident_data: incident id → the ``data`` of its incidents-table row, for the ids the
            documents name. A scope document written before ids were stored carries its
            incidents inline (``{"items": [...]}``) and needs none.
    """
    data = incident_data or {}
    incidents: dict[str, tuple[correlate.Incident, ...]] = {}
    ports: dict[str, tuple[correlate.PortHistory, ...]] = {}
    for name, doc in docs.items():
        kind, _, key = name.removeprefix(CORRELATION_PREFIX).partition("/")
        if kind == "incidents":
            items = doc["items"] if "items" in doc else [data[i] for i in doc["ids"] if i in data]
            incidents[key] = tuple(correlate.Incident.from_dict(i) for i in items)
        elif kind == "ports":
            ports[key] = tuple(
                correlate.PortHistory(p["node_id"], p["ib_port"], tuple(p["changed_at"])) for p in doc["items"]
            )
    return correlate.CorrelationState(incidents={k: v for k, v in incidents.items() if v}, ports=ports)


def expired_incidents(
    before: correlate.CorrelationState,
    after: correlate.CorrelationState,
    *,
    scopes: Collection[str] | None = None,
) -> list[correlate.Incident]:
    """Incidents before remembers and after no longer does: their window ended, so their rows close.

    scopes, when given, are the only scopes that can differ (see `correlation_changes`).
    """
    gone: dict[str, correlate.Incident] = {}
    for scope in before.incidents if scopes is None else scopes:
        old = before.incidents.get(scope, ())
        if after.incidents.get(scope, ()) is old:
            continue
        gone.update((i.incident_id, i) for i in old)
    if gone:
        # An incident still remembered sits in a scope whose tuple changed too (it was pruned from one
        # or moved into another), so the unchanged scopes, most of them, need no look.
        for scope in after.incidents if scopes is None else scopes:
            incidents = after.incidents.get(scope, ())
            if before.incidents.get(scope, ()) is incidents:
                continue
            for incident in incidents:
                gone.pop(incident.incident_id, None)
    return list(gone.values())
