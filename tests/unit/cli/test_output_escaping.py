"""rasctl prints what others wrote (event text, labels, reasons, names) with controls escaped (issue #37 item 15).

ESC, CR/LF, BEL and bidirectional overrides in a field would move the cursor, recolour or clear the
operator's terminal, reorder what they read, or (a newline in a reason) forge a row of ``rasctl audit``.
"""

from __future__ import annotations

import io

import pytest

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.cli import remediation_views as rviews
from rasd.cli import views
from rasd.common import text

NOW = 1_800_000_000 * 10**9
HOSTILE = "ok\x1b[2J\rgone\x07\u202etxt.exe\u2066\nFORGED"
"""ESC (clear the screen), CR, BEL, RIGHT-TO-LEFT OVERRIDE, a bidi isolate and a newline."""
FORBIDDEN = ("\x1b", "\r", "\x07", "\u202e", "\u2066", "\x00", "\x9b")


def _clean(printed: str) -> None:
    for character in FORBIDDEN:
        assert character not in printed, f"{character!r} printed raw"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text, ünïcode ok", "plain text, ünïcode ok"),
        ("a\nb", "a\\nb"),
        ("a\rb\tc", "a\\rb\\tc"),
        ("\x1b[31m", "\\x1b[31m"),
        ("\x07\x00\x7f\x9b", "\\x07\\x00\\x7f\\x9b"),
        (
            "\u202eevil\u202c \u2066\u2069 \u200f\u061c \u2028",
            "\\u202eevil\\u202c \\u2066\\u2069 \\u200f\\u061c \\u2028",
        ),
    ],
)
def test_printable_escapes_what_a_terminal_would_act_on(raw, shown):
    assert text.printable(raw) == shown


def test_a_newline_in_a_reason_cannot_forge_an_audit_row():
    records = [
        admin_pb.AuditRecord(
            at_unix_ns=NOW, actor="cert:dev-operator", action="Quarantine", outcome="OK",
            target=admin_pb.Target(node_id="node-a"), reason="x\n1s ago  cert:dev-admin  Release  node-a  OK  fine",
        ),
        admin_pb.AuditRecord(at_unix_ns=NOW, actor=f"token:{HOSTILE}", action="List", outcome="no", reason=HOSTILE),
    ]  # fmt: skip
    out = io.StringIO()
    rviews.audit_table(records, NOW, out)
    assert len(out.getvalue().splitlines()) == 1 + len(records)
    _clean(out.getvalue())


def test_event_text_node_labels_and_repairs_print_escaped():
    event = admin_pb.StoredEvent(
        node_id="node-a",
        received_unix_ns=NOW,
        event=health_pb.HealthEvent(seq=1, kind=health_pb.EVENT_KIND_XID, xid=79, message=HOSTILE, gpu_uuid=""),
    )
    node = admin_pb.NodeStatus(
        node_id="node-a", agent_version=HOSTILE, backend=HOSTILE, labels={"rack": HOSTILE, HOSTILE: "v"}
    )
    repair = admin_pb.Repair(
        ticket_id="t1", state=HOSTILE, rung=HOSTILE, reason=HOSTILE, steps=[admin_pb.RepairStep(reason=HOSTILE)]
    )
    quarantine = admin_pb.QuarantineRecord(target=admin_pb.Target(node_id="node-a"), source=HOSTILE, reason=HOSTILE)
    out = io.StringIO()
    views.events_table([event], NOW, out)
    views.node_detail(admin_pb.GetNodeResponse(node=node, recent_events=[event]), NOW, out)
    rviews.repairs_table([repair], NOW, out)
    rviews.repair_history([repair], out)
    rviews.quarantines_table([quarantine], NOW, out)
    rviews.incidents_table([admin_pb.Incident(cause=HOSTILE, state=HOSTILE)], NOW, out)
    rviews.rma_table([admin_pb.RmaTicket(rma_id=HOSTILE, state=HOSTILE, reason=HOSTILE)], NOW, out)
    rviews.validations_table([admin_pb.Validation(verdict=HOSTILE, validation_id=HOSTILE)], NOW, out)
    _clean(out.getvalue())
    assert not any(line.startswith("FORGED") for line in out.getvalue().splitlines())


def test_a_job_stall_prints_on_one_line_escaped():
    stall = admin_pb.JobStall(
        named_unix_ns=NOW - 5 * 10**9, suspect=admin_pb.Target(node_id=HOSTILE, gpu_uuid="GPU-1"), reason=HOSTILE
    )
    line = rviews.stall_text(stall, NOW)
    assert line.startswith("rasctl: JOB STALLED, named 5s ago: ok") and "\n" not in line
    _clean(line)
