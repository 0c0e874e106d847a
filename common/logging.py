"""Structured logging set-up, called once by each entry point's main().

One stream on stderr for everything the process logs: rasd's own structlog events and the records
other libraries write through the standard `logging` module (grpc, SQLAlchemy, alembic, kubernetes,
sushy). The latter go through structlog's `ProcessorFormatter` on the root logger, so they come out
with the same fields (timestamp, level, logger, event) and the same renderer: JSON lines when stderr
is not a TTY (systemd journal, Kubernetes), a readable console renderer when it is.

Under systemd (`JOURNAL_STREAM` names the stream stderr is), each line starts with its syslog
priority, `<3>` error, `<4>` warning, `<6>` info, `<7>` debug, which journald strips and stores as
the entry's priority: `journalctl -p warning -u rasd-agent` then shows only warnings and worse.

rasd's events keep their own fast path (structlog's WriteLogger, no `logging.LogRecord`): the
controller logs each decision on its decision thread. Both paths write whole lines in one write
call, so their lines never interleave. On the console renderer control characters in values are
escaped, so that no value can forge a line. Nothing configures logging at import time.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

import orjson
import structlog

from rasd.common import text

SYSLOG_PRIORITY = {"critical": 2, "error": 3, "exception": 3, "warning": 4, "warn": 4, "info": 6, "debug": 7}
"""syslog priority of each level name: the `<N>` prefix journald reads (sd-daemon(3))."""
JOURNAL_STREAM = "JOURNAL_STREAM"
"""Set by systemd to "device:inode" of the stream it connected to the service's stdout and stderr."""

Renderer = Callable[[Any, str, MutableMapping[str, Any]], str]

CHILD_LEVEL_VARIABLE = "RASD_CHILD_LOG_LEVEL"
"""Where a helper interpreter (`rasd.common.child_process`) finds the level its parent logs at."""
_configured_level = "info"


def configure(level: str = "info", *, json: bool | None = None) -> None:
    """Configure structlog and the stdlib root logger for this process.

    Args:
        level: minimum level name ("debug", "info", "warning", "error") of rasd's events; other
            libraries' records show from warning up (or from level, when that is higher).
        json: force JSON (True) or console (False) output; None picks JSON unless stderr is a TTY.
    """
    global _configured_level
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    _configured_level = level.lower()
    use_json = (not sys.stderr.isatty()) if json is None else json
    escape: list[structlog.types.Processor] = [] if use_json else [_printable_strings]
    renderer: Renderer = (
        structlog.processors.JSONRenderer(serializer=_json_line)
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    if stderr_is_journal():
        renderer = _JournalPriority(renderer)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, *escape, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(_CurrentStderr())
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                *escape,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    # Third-party libraries log through stdlib logging: warnings and worse only, whatever level.
    root.setLevel(max(numeric, logging.WARNING))


def stderr_is_journal() -> bool:
    """Whether stderr is the journal stream systemd connected (JOURNAL_STREAM matches its device and inode).

    A child process inherits JOURNAL_STREAM even when its stderr goes elsewhere (a pipe, a file), so
    the variable alone is not enough: systemd.exec(5) says to compare it with stderr's fstat.
    """
    value = os.environ.get(JOURNAL_STREAM, "")
    device, _, inode = value.partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        info = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):  # no stderr, closed, or a stream without a descriptor
        return False
    return (info.st_dev, info.st_ino) == (int(device), int(inode))


class _JournalPriority:
    """Wraps a renderer so that each line starts with its syslog priority (`<4>{...}`) for journald."""

    def __init__(self, renderer: Renderer) -> None:
        self._renderer = renderer

    def __call__(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> str:
        level = str(event_dict.get("level", method_name)).lower()
        return f"<{SYSLOG_PRIORITY.get(level, 6)}>{self._renderer(logger, method_name, event_dict)}"


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

    The controller logs each decision on its decision thread, where orjson takes less than half
    the standard encoder's time a line. A log call must never raise.
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


def configured_level() -> str:
    """The level `configure` was last called with in this process ("info" before any call)."""
    return _configured_level


def configure_child() -> None:
    """`configure` in a helper interpreter, at the level its parent passed (`CHILD_LEVEL_VARIABLE`)."""
    configure(os.environ.get(CHILD_LEVEL_VARIABLE) or "info")
