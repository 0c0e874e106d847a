"""`rasd.common.logging`: JSON lines that a log collector can parse, whatever a call carries."""

from __future__ import annotations

import io
import json
import sys

import structlog

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


def test_a_console_log_line_cannot_be_forged_or_hijack_the_terminal(monkeypatch):
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
