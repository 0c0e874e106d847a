"""rasd-validate's progress on stderr: one line as each check starts and ends, a live bar on a TTY.

A suite runs for minutes (quick 71 s, post-repair longer on a real node), and stdout carries only
the report (the table, or the ``--json`` object that the agent parses), so progress goes to stderr.
Where stderr is a file or a pipe (the agent, CI logs) each check gets two plain lines::

    rasd-validate: [2/7] V1 known-answer GEMM ...
    rasd-validate: [2/7] V1 known-answer GEMM: pass in 1.9 s

On a terminal the start line is a bar redrawn in place with the running check's elapsed time, and
each end line is printed above it as the check finishes; the bar is cleared when the suite ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TextIO

from rasd.validation.model import Verdict
from rasd.validation.runner import CheckFinished, CheckStarted, ProgressEvent

BAR_WIDTH = 20
"""Characters of the live bar."""
_CLEAR_LINE = "\r\x1b[K"


class ProgressPrinter:
    """The `run_suite` progress callback that writes to a stream; use it as a context manager.

    Args:
        stream: where the lines go (stderr).
        live: redraw a bar in place (a TTY); None: when stream is a TTY.
        clock: monotonic seconds, for the running check's elapsed time.
        refresh_s: how often the live bar is redrawn.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        refresh_s: float = 0.5,
    ) -> None:
        """Write to stream; nothing is shown until the first check starts."""
        self._stream = stream
        self._live = stream.isatty() if live is None else live
        self._clock = clock
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._running: CheckStarted | None = None
        self._running_since = 0.0
        self._done = 0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> ProgressPrinter:
        if self._live:
            self._ticker = threading.Thread(target=self._tick, name="rasd-validate-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __call__(self, event: ProgressEvent) -> None:
        """Show one progress event."""
        with self._lock:
            if isinstance(event, CheckStarted):
                self._running, self._running_since = event, self._clock()
                if self._live:
                    self._draw_bar()
                else:
                    self._write(f"rasd-validate: {_where(event)} {event.check} {event.title} ...\n")
                return
            self._running = None
            self._done = event.position
            line = f"rasd-validate: {_where(event)} {_ended(event)}\n"
            self._write(f"{_CLEAR_LINE}{line}" if self._live else line)

    def close(self) -> None:
        """Stop redrawing and clear the bar (a no-op for plain lines)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
            with self._lock:
                self._write(_CLEAR_LINE)

    def _tick(self) -> None:
        while not self._stop.wait(self._refresh_s):
            with self._lock:
                if self._running is not None:
                    self._draw_bar()

    def _draw_bar(self) -> None:
        running = self._running
        if running is None:
            return
        filled = BAR_WIDTH * self._done // max(1, running.total)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        elapsed_s = self._clock() - self._running_since
        self._write(f"{_CLEAR_LINE}[{bar}] {_where(running)} {running.check} {running.title} {elapsed_s:.0f} s")

    def _write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()


def _where(event: ProgressEvent) -> str:
    return f"[{event.position}/{event.total}]"


def _ended(event: CheckFinished) -> str:
    """`V1 known-answer GEMM: pass in 1.9 s`, with the reason when it did not pass."""
    result = event.result
    text = f"{result.check} {result.title}: {result.verdict.value} in {event.elapsed_s:.1f} s"
    if result.verdict is not Verdict.PASS and result.reason:
        text += f" ({result.reason})"
    return text
