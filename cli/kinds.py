"""The listings rasctl shows (`listings.Listing` per kind): their tables, ``-o name`` names and JSON."""

from __future__ import annotations

from typing import Any

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.cli import listings, output, power_views, views
from rasd.cli import remediation_views as rviews


def _target_name(target: admin_pb.Target) -> str:
    return rviews.target_text(target)


def _node_rows(nodes: list[admin_pb.GetNodeResponse], now: int, wide: bool) -> output.Rows:
    return views.nodes_rows([n.node for n in nodes], now, wide)


def domains(status: admin_pb.GetPowerStatusResponse) -> list[admin_pb.PowerDomain]:
    """The tree's domains, each parent before its children."""
    found: list[admin_pb.PowerDomain] = []

    def walk(domain: admin_pb.PowerDomain) -> None:
        found.append(domain)
        for child in domain.children:
            walk(child)

    if status.HasField("root"):
        walk(status.root)
    return found


LISTINGS: dict[str, listings.Listing] = {
    "nodes": listings.Listing("node", views.nodes_rows, lambda n: n.node_id, views.nodes_json, views.nodes_summary),
    "node": listings.Listing("node", _node_rows, lambda n: n.node.node_id),
    "events": listings.Listing("event", views.events_rows, lambda e: f"{e.node_id}/{e.event.seq}"),
    "incidents": listings.Listing("incident", rviews.incidents_rows, lambda i: i.incident_id),
    "repairs": listings.Listing("repair", rviews.repairs_rows, lambda r: r.ticket_id),
    "validations": listings.Listing("validation", rviews.validations_rows, lambda v: v.validation_id),
    "audit": listings.Listing("audit", rviews.audit_rows, lambda r: f"{r.at_unix_ns}/{r.action}"),
    "sdc": listings.Listing("gpu", rviews.sdc_rows, lambda g: _target_name(g.target)),
    "rma": listings.Listing("rma", rviews.rma_rows, lambda t: t.rma_id),
    "stragglers": listings.Listing("gpu", rviews.straggler_rows, lambda s: _target_name(s.target)),
}
"""Per command, how its items are shown."""


def power_listing() -> listings.Listing:
    """``get power``: items are the one answer (the tree), or for ``-o name`` its `domains`; wide is the table."""

    def rows(items: list[Any], now: int, wide: bool) -> output.Rows:
        return power_views.status_rows(items[0])

    return listings.Listing(
        "domain",
        rows,
        lambda domain: domain.domain_id,
        lambda items: output.message_json(items[0]),  # type: ignore[arg-type,return-value]  # one object, as before
        lambda items, out: power_views.status_footer(items[0], out),
    )
