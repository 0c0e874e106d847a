"""rasctl views of the repair side: incidents, repairs, quarantines, validations, RMA, audit."""

from __future__ import annotations

from typing import TextIO

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.cli import output


def target_text(target: admin_pb.Target) -> str:
    """NODE or NODE/GPU."""
    return f"{target.node_id}/{target.gpu_uuid}" if target.gpu_uuid else target.node_id


def incidents_table(incidents: list[admin_pb.Incident], now: int, out: TextIO) -> None:
    """Incidents, newest first."""
    rows = [
        [output.age(now, i.opened_unix_ns), target_text(i.target), i.cause,
         health_pb.Severity.Name(i.severity).removeprefix("SEVERITY_").lower(), i.state]
        for i in incidents
    ]  # fmt: skip
    output.table(["OPENED", "TARGET", "CAUSE", "SEVERITY", "STATE"], rows, out)


def repairs_table(repairs: list[admin_pb.Repair], now: int, out: TextIO) -> None:
    """Repair tickets with their rung and the last reason."""
    rows = [
        [output.age(now, r.updated_unix_ns), target_text(r.target), r.state, r.rung or "-", r.reason[:70]]
        for r in repairs
    ]
    output.table(["UPDATED", "TARGET", "STATE", "RUNG", "WHY"], rows, out)


def repair_history(repairs: list[admin_pb.Repair], out: TextIO) -> None:
    """Each ticket's evidence trail, one line per fault, action and result."""
    shown = output.printable
    for repair in repairs:
        print(f"ticket {shown(repair.ticket_id)}: {shown(repair.state)} at rung {shown(repair.rung or '-')}", file=out)
        for step in repair.steps:
            print(f"  {shown(step.reason)}", file=out)


def quarantines_table(records: list[admin_pb.QuarantineRecord], now: int, out: TextIO) -> None:
    """Active quarantines."""
    rows = [
        [
            target_text(q.target) + (f" port {q.port}" if q.port else ""),
            q.source,
            output.age(now, q.since_unix_ns),
            q.reason[:70],
        ]
        for q in records
    ]
    output.table(["QUARANTINED", "BY", "SINCE", "REASON"], rows, out)


def validations_table(runs: list[admin_pb.Validation], now: int, out: TextIO) -> None:
    """Validation runs."""
    rows = [
        [output.age(now, v.started_unix_ns), target_text(v.target), v.suite or "-", v.verdict, v.validation_id]
        for v in runs
    ]
    output.table(["STARTED", "TARGET", "SUITE", "VERDICT", "ID"], rows, out)


def sdc_table(gpus: list[admin_pb.SdcGpu], now: int, out: TextIO) -> None:
    """GPUs with SDC history, most suspicious first, with their watch."""

    def watch(until_unix_ns: int) -> str:
        if until_unix_ns <= now:
            return "-"
        return f"{(until_unix_ns - now) / 86400e9:.1f}d left"

    rows = [
        [target_text(g.target), f"{g.suspicion:.2f}", g.accusations, f"{g.fails}/{g.runs}", g.suspects,
         g.last_verdict or "-", output.age(now, g.last_unix_ns), watch(g.watch_until_unix_ns)]
        for g in gpus
    ]  # fmt: skip
    output.table(["GPU", "SUSPICION", "ACCUSED", "FAILED/RUNS", "SUSPECT", "LAST", "WHEN", "WATCH"], rows, out)


def rma_table(tickets: list[admin_pb.RmaTicket], now: int, out: TextIO) -> None:
    """RMA tickets; pending ones in technician order (capacity returned per hour first)."""
    rows = [
        [t.rma_id, target_text(t.target), t.state, f"{t.gpus_per_technician_hour:.2f}" if t.state == "pending" else "-",
         output.age(now, t.opened_unix_ns), t.reason[:50]]
        for t in tickets
    ]  # fmt: skip
    output.table(["RMA", "TARGET", "STATE", "GPUS/H", "OPENED", "REASON"], rows, out)


def audit_table(records: list[admin_pb.AuditRecord], now: int, out: TextIO) -> None:
    """Audit records."""
    rows = [
        [output.age(now, r.at_unix_ns), r.actor, r.action, target_text(r.target) or "-", r.outcome, r.reason[:50]]
        for r in records
    ]
    output.table(["WHEN", "WHO", "ACTION", "TARGET", "OUTCOME", "REASON"], rows, out)
