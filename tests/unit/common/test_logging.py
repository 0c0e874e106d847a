"""`rasd.common.logging`: JSON lines that a log collector can parse, whatever a call carries; other
libraries' records in the same stream; journald priorities under systemd."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys

import structlog

from rasd.common import child_process
from rasd.common import logging as rasd_logging


def test_a_json_log_line_parses_and_never_raises_on_odd_values(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    rasd_logging.configure("info", json=True)
    try:
        log = structlog.get_logger("rasd.test")
        log.info("decided", node="n-1", actions=["reset_gpu"], reason='quoted "é"', keyed={7: "x"})
        log.info("odd", wide=2**70, thing=object())  # orjson refuses the int: the standard encoder writes it
        log.debug("hidden")
    finally:
        structlog.reset_defaults()
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["event"] == "decided" and first["level"] == "info" and first["timestamp"].endswith("Z")
    assert first["reason"] == 'quoted "é"' and first["keyed"] == {"7": "x"} and first["actions"] == ["reset_gpu"]
    assert second["wide"] == 2**70 and second["thing"].startswith("<object object at")


def test_other_libraries_records_come_out_in_the_same_json_stream(monkeypatch, restore_logging):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    rasd_logging.configure("info", json=True)
    structlog.get_logger("rasd.controller").warning("store_slow", commit_ms=900)
    logging.getLogger("sqlalchemy.pool").warning("pool %s exhausted after %d s", "main", 30)
    logging.getLogger("grpc._server").info("not shown: other libraries' records from warning up")
    try:
        raise RuntimeError("lost the lease")
    except RuntimeError:
        logging.getLogger("kubernetes.client.rest").exception("patch failed")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]  # every line is JSON, none plain text
    assert [(line.get("logger"), line["level"], line["event"]) for line in lines] == [
        (None, "warning", "store_slow"),
        ("sqlalchemy.pool", "warning", "pool main exhausted after 30 s"),
        ("kubernetes.client.rest", "error", "patch failed"),
    ]
    assert all(line["timestamp"].endswith("Z") for line in lines)
    assert "RuntimeError: lost the lease" in lines[2]["exception"]


def _journal_file(tmp_path, monkeypatch):
    """A file standing in for the journal's stream: stderr goes to it and JOURNAL_STREAM names it."""
    stream = open(tmp_path / "journal-stream", "w", buffering=1)  # noqa: SIM115  (closed by the caller)
    info = os.fstat(stream.fileno())
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setenv("JOURNAL_STREAM", f"{info.st_dev}:{info.st_ino}")
    return stream


def test_under_systemd_each_line_starts_with_its_syslog_priority(tmp_path, monkeypatch, restore_logging):
    stream = _journal_file(tmp_path, monkeypatch)
    try:
        rasd_logging.configure("debug")
        assert rasd_logging.stderr_is_journal()
        log = structlog.get_logger("rasd.agent")
        log.debug("sampled")
        log.info("agent_started")
        log.warning("controller_unreachable")
        log.error("spool_write_failed")
        logging.getLogger("grpc").warning("keepalive watchdog timeout")
        logging.getLogger("alembic").error("migration failed")
    finally:
        stream.close()
    lines = (tmp_path / "journal-stream").read_text().splitlines()
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>", "<4>", "<3>"]
    assert [json.loads(line[3:])["event"] for line in lines] == [
        "sampled", "agent_started", "controller_unreachable", "spool_write_failed",
        "keepalive watchdog timeout", "migration failed",
    ]  # fmt: skip


def test_a_journal_stream_that_is_not_stderr_adds_no_prefix(tmp_path, monkeypatch, restore_logging):
    """A child inherits JOURNAL_STREAM while its stderr goes to a pipe or file: no priorities there."""
    stream = _journal_file(tmp_path, monkeypatch)
    other = tmp_path / "elsewhere"
    other.write_text("")
    info = os.stat(other)
    monkeypatch.setenv("JOURNAL_STREAM", f"{info.st_dev}:{info.st_ino}")
    try:
        rasd_logging.configure("info")
        structlog.get_logger().warning("plain")
    finally:
        stream.close()
    (line,) = (tmp_path / "journal-stream").read_text().splitlines()
    assert json.loads(line)["event"] == "plain"


def test_a_console_log_line_cannot_be_forged_or_hijack_the_terminal(monkeypatch, restore_logging):
    """Issue #37 item 15: the console renderer printed a node's text raw; a newline in it forged a log line."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    rasd_logging.configure("info", json=False)
    try:
        log = structlog.get_logger("rasd.test")
        hostile = "x\n2026-01-01T00:00:00Z [error    ] forged\x1b[2J\r\x07\u202eevil"
        log.info("agent_connected", node=hostile, hostname=hostile, labels={"k": hostile})
        log.info(f"event\n{hostile}")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed", why=hostile)
    finally:
        structlog.reset_defaults()
    printed = out.getvalue()
    for character in ("\x1b", "\r", "\x07", "\u202e"):
        assert character not in printed
    lines = printed.splitlines()
    assert not any(line.startswith("2026-01-01T00:00:00Z") for line in lines)
    assert sum(1 for line in lines if "[info" in line or "[error" in line) == 3
    assert any(line.startswith("Traceback") for line in lines)  # a traceback keeps its own lines


def test_a_helper_interpreter_logs_at_its_parents_level(restore_logging):
    """The Kubernetes adapter's child (`child_process.spawn`) logged at info whatever --log-level said."""
    rasd_logging.configure("warning", json=True)
    environ = child_process.child_environment()
    assert environ[rasd_logging.CHILD_LEVEL_VARIABLE] == "warning"
    program = (
        "import structlog\n"
        "from rasd.common import logging as rasd_logging\n"
        "rasd_logging.configure_child()\n"
        "log = structlog.get_logger('rasd.test')\n"
        "log.info('below_the_parents_level')\n"
        "log.warning('at_the_parents_level')\n"
    )
    child = subprocess.run([sys.executable, "-c", program], env=environ, capture_output=True, text=True, check=True)
    assert "at_the_parents_level" in child.stderr
    assert "below_the_parents_level" not in child.stderr
    rasd_logging.configure("info", json=True)
