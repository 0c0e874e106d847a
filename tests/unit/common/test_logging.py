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
