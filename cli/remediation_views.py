"""rasctl views of the repair side: incidents, repairs, quarantines, validations, RMA, audit."""

from __future__ import annotations

from typing import Any, TextIO

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.cli import output
from rasd.common import text


def target_text(target: admin_pb.Target) -> str:
    """NODE or NODE/GPU."""
    return f"{target.node_id}/{target.gpu_uuid}" if target.gpu_uuid else target.node_id


def incidents_rows(incidents: list[admin_pb.Incident], now: int, wide: bool = False) -> output.Rows:
    """Incidents, newest first; wide adds the id, when it closed and its events' seqs."""
    headers = ["OPENED", "TARGET", "CAUSE", "SEVERITY", "STATE"]
    rows: list[list[Any]] = [
        [output.age(now, i.opened_unix_ns), target_text(i.target), i.cause,
         health_pb.Severity.Name(i.severity).removeprefix("SEVERITY_").lower(), i.state]
        for i in incidents
    ]  # fmt: skip
    if wide:
        headers += ["ID", "CLOSED", "EVENTS"]
        for row, i in zip(rows, incidents, strict=True):
            row += [i.incident_id, output.timestamp(i.closed_unix_ns), ",".join(map(str, i.event_seqs)) or "-"]
    return headers, rows


def incidents_table(incidents: list[admin_pb.Incident], now: int, out: TextIO) -> None:
    """Incidents, newest first."""
    output.table(*incidents_rows(incidents, now), out)


def repairs_rows(repairs: list[admin_pb.Repair], now: int, wide: bool = False) -> output.Rows:
    """Repair tickets with their rung and the last reason; wide adds the ticket, its incident and when it opened."""
    headers = ["UPDATED", "TARGET", "STATE", "RUNG", "WHY"]
    rows: list[list[Any]] = [
        [output.age(now, r.updated_unix_ns), target_text(r.target), r.state, r.rung or "-",
         r.reason if wide else r.reason[:70]]
        for r in repairs
    ]  # fmt: skip
    if wide:
        headers += ["TICKET", "INCIDENT", "OPENED"]
        for row, r in zip(rows, repairs, strict=True):
            row += [r.ticket_id, r.incident_id or "-", output.timestamp(r.opened_unix_ns)]
    return headers, rows


def repairs_table(repairs: list[admin_pb.Repair], now: int, out: TextIO) -> None:
    """Repair tickets with their rung and the last reason."""
    output.table(*repairs_rows(repairs, now), out)


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


def validations_rows(runs: list[admin_pb.Validation], now: int, wide: bool = False) -> output.Rows:
    """Validation runs; wide adds when each started and finished."""
    headers = ["STARTED", "TARGET", "SUITE", "VERDICT", "ID"]
    rows: list[list[Any]] = [
        [output.age(now, v.started_unix_ns), target_text(v.target), v.suite or "-", v.verdict, v.validation_id]
        for v in runs
    ]
    if wide:
        headers += ["STARTED AT", "FINISHED AT"]
        for row, v in zip(rows, runs, strict=True):
            row += [output.timestamp(v.started_unix_ns), output.timestamp(v.finished_unix_ns)]
    return headers, rows


def validations_table(runs: list[admin_pb.Validation], now: int, out: TextIO) -> None:
    """Validation runs."""
    output.table(*validations_rows(runs, now), out)


def sdc_rows(gpus: list[admin_pb.SdcGpu], now: int, wide: bool = False) -> output.Rows:
    """GPUs with SDC history, most suspicious first, with their watch; wide adds passing runs and the watch's end."""

    def watch(until_unix_ns: int) -> str:
        if until_unix_ns <= now:
            return "-"
        return f"{(until_unix_ns - now) / 86400e9:.1f}d left"

    rows = [
        [target_text(g.target), f"{g.suspicion:.2f}", g.accusations, f"{g.fails}/{g.runs}", g.suspects,
         g.last_verdict or "-", output.age(now, g.last_unix_ns), watch(g.watch_until_unix_ns)]
        for g in gpus
    ]  # fmt: skip
    headers = ["GPU", "SUSPICION", "ACCUSED", "FAILED/RUNS", "SUSPECT", "LAST", "WHEN", "WATCH"]
    if wide:
        headers += ["PASSED", "WATCH UNTIL"]
        for row, g in zip(rows, gpus, strict=True):
            row += [g.passes, output.timestamp(g.watch_until_unix_ns)]
    return headers, rows


def straggler_rows(stragglers: list[admin_pb.StragglerRecord], now: int, wide: bool = False) -> output.Rows:
    """GPUs named stragglers, in the order named, with their actions' rung; wide shows the whole reasons."""
    rows = [
        [target_text(s.target), f"{s.mean_lag_s * 1000:.0f}ms", f"{s.score:.0f}", s.steps,
         output.age(now, s.named_unix_ns), s.action or "-", s.reason if wide else s.reason.split("; ", 1)[-1][:60]]
        for s in stragglers
    ]  # fmt: skip
    headers = ["GPU", "LAG", "SCORE", "STEPS", "NAMED", "ACTION", "EVIDENCE" if not wide else "REASON"]
    if wide:
        headers.append("LAST ACTION")
        for row, s in zip(rows, stragglers, strict=True):
            row.append(s.action_reason or "-")
    return headers, rows


def stall_text(stall: admin_pb.JobStall, now: int) -> str:
    """A hung job's stall, one line: when it was named, the suspect, and why."""
    named = output.age(now, stall.named_unix_ns)
    return text.printable(f"rasctl: JOB STALLED, named {named}: {target_text(stall.suspect)}: {stall.reason}")


def rma_rows(tickets: list[admin_pb.RmaTicket], now: int, wide: bool = False) -> output.Rows:
    """RMA tickets; pending ones in technician order; wide adds the GPUs a repair returns and the whole reason."""
    rows: list[list[Any]] = [
        [t.rma_id, target_text(t.target), t.state, f"{t.gpus_per_technician_hour:.2f}" if t.state == "pending" else "-",
         output.age(now, t.opened_unix_ns), t.reason if wide else t.reason[:50]]
        for t in tickets
    ]  # fmt: skip
    headers = ["RMA", "TARGET", "STATE", "GPUS/H", "OPENED", "REASON"]
    if wide:
        headers.append("GPUS RETURNED")
        for row, t in zip(rows, tickets, strict=True):
            row.append(t.gpus_returned)
    return headers, rows


def rma_table(tickets: list[admin_pb.RmaTicket], now: int, out: TextIO) -> None:
    """RMA tickets; pending ones in technician order (capacity returned per hour first)."""
    output.table(*rma_rows(tickets, now), out)


def audit_rows(records: list[admin_pb.AuditRecord], now: int, wide: bool = False) -> output.Rows:
    """Audit records; wide adds the caller's address, the time and the whole reason."""
    rows: list[list[Any]] = [
        [output.age(now, r.at_unix_ns), r.actor, r.action, target_text(r.target) or "-", r.outcome,
         r.reason if wide else r.reason[:50]]
        for r in records
    ]  # fmt: skip
    headers = ["WHEN", "WHO", "ACTION", "TARGET", "OUTCOME", "REASON"]
    if wide:
        headers += ["PEER", "AT"]
        for row, r in zip(rows, records, strict=True):
            row += [r.peer or "-", output.timestamp(r.at_unix_ns)]
    return headers, rows


def audit_table(records: list[admin_pb.AuditRecord], now: int, out: TextIO) -> None:
    """Audit records."""
    output.table(*audit_rows(records, now), out)
