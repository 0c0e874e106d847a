"""Structured logging set-up, called once by each entry point's main().

JSON lines when stderr is not a TTY (systemd journal, Kubernetes), a readable console renderer
when it is, with control characters in values escaped so that no value can forge a line. Nothing
configures logging at import time.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import orjson
import structlog

from rasd.common import text


def configure(level: str = "info", *, json: bool | None = None) -> None:
    """Configure structlog and the stdlib root logger for this process.

    Args:
        level: minimum level name ("debug", "info", "warning", "error").
        json: force JSON (True) or console (False) output; None picks JSON unless stderr is a TTY.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    use_json = (not sys.stderr.isatty()) if json is None else json
    renderers: list[structlog.types.Processor] = (
        [structlog.processors.JSONRenderer(serializer=_json_line)]
        if use_json
        else [_printable_strings, structlog.dev.ConsoleRenderer(colors=False)]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            *renderers,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=False,
    )
    # Third-party libraries log through stdlib logging; keep them quiet unless debugging.
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr, force=True)


def _printable_strings(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Escape control characters in string values before the console renderer prints them raw.

    A node's hostname, an event's text or a caller's reason with a newline forged a log line, and
    an ESC sequence reached the terminal (`rasd.common.text`). JSON lines need none of it: JSON
    escapes control characters and cannot span lines. Other values are printed with ``repr``,
    which escapes them already; a traceback keeps its own line breaks.
    """
    return {
        key: text.printable(value, keep_newlines=key == "exception") if isinstance(value, str) else value
        for key, value in event_dict.items()
    }


def _json_line(event: Any, **kw: Any) -> str:
    """One JSON log line, by orjson; what orjson refuses (an int wider than 64 bits) by the standard encoder.

    The controller logs each decision on its decision thread: the standard encoder took 33 µs a
    line there, orjson 14 µs. A log call must never raise.
    """
    try:
        return orjson.dumps(event, default=kw.get("default"), option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(event, **kw)


class _CurrentStderr:
    """Writes to whatever sys.stderr is at the moment of writing.

    Binding the stream object at configure time breaks when it is replaced later (pytest's capture
    closes the one it handed out; a daemon may redirect stderr), and a log call must never raise.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()
