"""The order in which a technician should work the RMA and repair queue. Pure.

Some failures are worth more technician time than others: swapping one GPU of a node whose other
seven GPUs keep training returns one GPU of capacity, while fixing the part that holds a whole node
out of service returns all eight. The queue is ordered by capacity returned per technician hour,
then oldest first.

Worked example (defaults: GPU swap 2 h, node-level repair 4 h, optic or cable 0.5 h):

| ticket | what is out | GPUs back | hours | GPUs per hour |
|---|---|---|---|---|
| node-7 baseboard (node quarantined) | 8 GPUs | 8 | 4.0 | 2.0 |
| node-3 GPU 5 (node serving on 7 GPUs) | 1 GPU | 1 | 2.0 | 0.5 |
| node-9 GPU 2 (node also held out) | 8 GPUs | 8 | 2.0 | 4.0 |

→ node-9 first (a GPU swap that brings back a whole node), then node-7, then node-3.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping


@dataclasses.dataclass(frozen=True)
class RepairQueuePolicy:
    """Technician time per kind of repair, in hours (site-specific; these are HGX-class defaults)."""

    gpu_swap_h: float = 2.0
    """Replace one GPU (SXM module) of a node."""
    node_repair_h: float = 4.0
    """A repair of the node itself (baseboard, PSU, NVSwitch tray)."""
    port_repair_h: float = 0.5
    """Reseat or replace an optic or cable."""


@dataclasses.dataclass(frozen=True)
class QueueItem:
    """One open RMA or repair waiting for a technician."""

    ticket_id: str
    node_id: str
    gpu_uuid: str
    """Empty for a node-level repair."""
    port: str
    opened_unix_ns: int
    gpus_returned: int
    """GPUs that go back into service when this repair is done."""
    technician_h: float

    @property
    def gpus_per_hour(self) -> float:
        """Capacity returned per technician hour."""
        return self.gpus_returned / max(self.technician_h, 1e-6)


def build_items(
    tickets: Iterable[Mapping[str, object]],
    *,
    node_gpu_counts: Mapping[str, int],
    quarantined_nodes: Iterable[str],
    policy: RepairQueuePolicy = RepairQueuePolicy(),
) -> list[QueueItem]:
    """Queue items for open tickets (dicts with rma_id/ticket_id, node_id, gpu_uuid, port, opened_unix_ns).

    A GPU repair returns one GPU, or every GPU of the node when the node itself is held out of
    service; a node repair returns every GPU of the node; a port repair returns the node's GPUs
    when the node is held out for it, else none of them (the node keeps training on other ports).
    """
    held = frozenset(quarantined_nodes)
    items = []
    for ticket in tickets:
        node_id = str(ticket["node_id"])
        gpu_uuid = str(ticket.get("gpu_uuid") or "")
        port = str(ticket.get("port") or "")
        node_gpus = max(1, int(node_gpu_counts.get(node_id, 8)))
        if port:
            hours, returned = policy.port_repair_h, node_gpus if node_id in held else 0
        elif gpu_uuid:
            hours, returned = policy.gpu_swap_h, node_gpus if node_id in held else 1
        else:
            hours, returned = policy.node_repair_h, node_gpus
        items.append(
            QueueItem(
                ticket_id=str(ticket.get("rma_id") or ticket.get("ticket_id")),
                node_id=node_id,
                gpu_uuid=gpu_uuid,
                port=port,
                opened_unix_ns=int(ticket.get("opened_unix_ns") or 0),  # type: ignore[call-overload]
                gpus_returned=returned,
                technician_h=hours,
            )
        )
    return items


def order(items: Iterable[QueueItem]) -> list[QueueItem]:
    """Most capacity per technician hour first; ties go to the oldest ticket."""
    return sorted(items, key=lambda item: (-item.gpus_per_hour, item.opened_unix_ns, item.ticket_id))
