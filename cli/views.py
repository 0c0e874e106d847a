"""What rasctl shows for each AdminService answer. Shared with rasd-sim's live fleet table."""

from __future__ import annotations

from typing import Any, TextIO

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.cli import output


def _state_name(value: int) -> str:
    return admin_pb.ComponentState.Name(value).removeprefix("COMPONENT_STATE_").lower()


def nodes_rows(nodes: list[admin_pb.NodeStatus], now_unix_ns: int, wide: bool = False) -> output.Rows:
    """The fleet: node, GPUs, state, last seen, draw and cap; wide adds connection, agent, backend and labels."""
    headers = ["NODE", "GPUS", "STATE", "LAST SEEN", "DRAW W", "CAP W"]
    rows: list[list[Any]] = [
        [
            node.node_id,
            len(node.gpus),
            _state_name(node.state),
            output.age(now_unix_ns, node.last_seen_unix_ns),
            round(node.power_draw_w),
            int(node.power_cap_w),
        ]
        for node in nodes
    ]
    if wide:
        headers += ["CONNECTED", "AGENT", "BACKEND", "HOSTNAME", "LABELS"]
        for row, node in zip(rows, nodes, strict=True):
            labels = ",".join(f"{k}={v}" for k, v in sorted(node.labels.items()))
            row += [str(node.connected).lower(), node.agent_version or "-", node.backend or "-",
                    node.hostname or "-", labels or "-"]  # fmt: skip
    return headers, rows


def nodes_table(nodes: list[admin_pb.NodeStatus], now_unix_ns: int, out: TextIO, *, wide: bool = False) -> None:
    """The fleet as a table, then one line of totals."""
    output.table(*nodes_rows(nodes, now_unix_ns, wide), out)
    nodes_summary(nodes, out)


def nodes_summary(nodes: list[admin_pb.NodeStatus], out: TextIO) -> None:
    """One line: nodes, GPUs, draw and cap."""
    total_gpus = sum(len(n.gpus) for n in nodes)
    total_draw = sum(n.power_draw_w for n in nodes)
    total_cap = sum(n.power_cap_w for n in nodes)
    print(
        f"{len(nodes)} nodes, {total_gpus} GPUs, "
        f"drawing {total_draw / 1000:.1f} kW of {total_cap / 1000:.1f} kW capped",
        file=out,
    )


def nodes_json(nodes: list[admin_pb.NodeStatus]) -> list[dict[str, Any]]:
    """The fleet as JSON objects (proto field names; state as a lower-case word)."""
    result = []
    for node in nodes:
        data = output.message_json(node)
        data["state"] = _state_name(node.state)
        # proto3 JSON renders 64-bit integers as strings; machines reading rasctl want numbers.
        data["power_cap_w"] = int(node.power_cap_w)
        data["last_seen_unix_ns"] = int(node.last_seen_unix_ns)
        for gpu_data, gpu in zip(data.get("gpus", []), node.gpus, strict=True):
            gpu_data["state"] = _state_name(gpu.state)
            gpu_data["last_sample_unix_ns"] = int(gpu.last_sample_unix_ns)
        result.append(data)
    return result


def node_detail(response: admin_pb.GetNodeResponse, now_unix_ns: int, out: TextIO) -> None:
    """One node: header, GPU table, recent events."""
    node = response.node
    shown = output.printable
    print(
        f"node {shown(node.node_id)}  state {_state_name(node.state)}  connected {node.connected}  "
        f"last seen {output.age(now_unix_ns, node.last_seen_unix_ns)}  "
        f"agent {shown(node.agent_version)} ({shown(node.backend)})",
        file=out,
    )
    if node.labels:
        print("labels " + ", ".join(f"{shown(k)}={shown(v)}" for k, v in sorted(node.labels.items())), file=out)
    rows = [
        [
            gpu.uuid,
            gpu.pci_bus_id,
            _state_name(gpu.state),
            round(gpu.power_w) if gpu.HasField("power_w") else "-",
            gpu.power_limit_w if gpu.HasField("power_limit_w") else "-",
            f"{gpu.power_limit_min_w}-{gpu.power_limit_max_w}",
            gpu.temperature_c if gpu.HasField("temperature_c") else "-",
        ]
        for gpu in node.gpus
    ]
    output.table(["GPU", "PCI", "STATE", "DRAW W", "CAP W", "LIMITS W", "TEMP C"], rows, out)
    if response.recent_events:
        print("recent events:", file=out)
        events_table(list(response.recent_events), now_unix_ns, out)


def events_rows(events: list[admin_pb.StoredEvent], now_unix_ns: int, wide: bool = False) -> output.Rows:
    """Stored events, newest first; wide adds severity, source and the whole message, and the time received."""
    headers = ["RECEIVED", "NODE", "SEQ", "KIND", "XID", "GPU", "MESSAGE"]
    rows: list[list[Any]] = [
        [
            output.age(now_unix_ns, e.received_unix_ns),
            e.node_id,
            e.event.seq,
            health_pb.EventKind.Name(e.event.kind).removeprefix("EVENT_KIND_").lower(),
            e.event.xid if e.event.HasField("xid") else "-",
            e.event.gpu_uuid or "-",
            e.event.message if wide else e.event.message[:60],
        ]
        for e in events
    ]
    if wide:
        headers += ["SEVERITY", "SOURCE", "RECEIVED AT"]
        for row, e in zip(rows, events, strict=True):
            severity = health_pb.Severity.Name(e.event.severity).removeprefix("SEVERITY_").lower()
            row += [severity, e.event.source or "-", output.timestamp(e.received_unix_ns)]
    return headers, rows


def events_table(events: list[admin_pb.StoredEvent], now_unix_ns: int, out: TextIO) -> None:
    """Stored events, newest first."""
    output.table(*events_rows(events, now_unix_ns), out)
