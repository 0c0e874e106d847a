"""rasd-validate's progress: a line on stderr as each check starts and ends, a live bar on a TTY,
and stdout (the --json report the agent parses) untouched.

The printer is tested on its own with the runner's events (no torch needed); the runner's events and
the CLI's streams need torch (the CPU build: CI installs it, .ci/run).
"""

from __future__ import annotations

import io
import json
import time

import pytest

from rasd.validation.model import CheckResult, Verdict
from rasd.validation.progress import ProgressPrinter
from rasd.validation.runner import CheckFinished, CheckStarted


def _finished(check, title, verdict, position, total, elapsed_s, reason=""):
    return CheckFinished(CheckResult(check, title, verdict, reason), position, total, elapsed_s=elapsed_s)


def test_plain_stream_gets_one_line_as_each_check_starts_and_ends():
    out = io.StringIO()
    with ProgressPrinter(out, live=False) as progress:
        progress(CheckStarted("V1", "known-answer GEMM", 1, 2))
        progress(_finished("V1", "known-answer GEMM", Verdict.PASS, 1, 2, 1.94))
        progress(CheckStarted("V2", "bitwise GEMM", 2, 2))
        progress(_finished("V2", "bitwise GEMM", Verdict.FAIL, 2, 2, 0.25, reason="gpu 2 differs from peers"))
    assert out.getvalue().splitlines() == [
        "rasd-validate: [1/2] V1 known-answer GEMM ...",
        "rasd-validate: [1/2] V1 known-answer GEMM: pass in 1.9 s",
        "rasd-validate: [2/2] V2 bitwise GEMM ...",
        "rasd-validate: [2/2] V2 bitwise GEMM: fail in 0.2 s (gpu 2 differs from peers)",
    ]


def test_a_check_the_budget_never_started_ends_without_starting():
    out = io.StringIO()
    with ProgressPrinter(out, live=False) as progress:
        progress(
            _finished("V6", "collectives", Verdict.INCOMPLETE, 7, 7, 0.0, reason="incomplete: budget (not started)")
        )
    assert out.getvalue() == (
        "rasd-validate: [7/7] V6 collectives: incomplete in 0.0 s (incomplete: budget (not started))\n"
    )


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_tty_a_bar_is_redrawn_in_place_and_cleared_at_the_end():
    out = _Tty()
    now = [100.0]
    with ProgressPrinter(out, clock=lambda: now[0], refresh_s=0.01) as progress:
        progress(CheckStarted("V1", "known-answer GEMM", 1, 4))
        assert out.getvalue().endswith("\r\x1b[K[--------------------] [1/4] V1 known-answer GEMM 0 s")
        now[0] = 107.0
        deadline = time.monotonic() + 5
        while "V1 known-answer GEMM 7 s" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)  # the ticker thread redraws every refresh_s
        assert out.getvalue().endswith("V1 known-answer GEMM 7 s")
        progress(_finished("V1", "known-answer GEMM", Verdict.PASS, 1, 4, 7.0))
        progress(CheckStarted("V2", "bitwise GEMM", 2, 4))
        assert out.getvalue().endswith("\r\x1b[K[#####---------------] [2/4] V2 bitwise GEMM 0 s")
    text = out.getvalue()
    # The end line replaced the bar on its own line; the bar is wiped when the suite ends.
    assert "\r\x1b[Krasd-validate: [1/4] V1 known-answer GEMM: pass in 7.0 s\n" in text
    assert text.endswith("\r\x1b[K")
    assert "\n" not in text.split("pass in 7.0 s\n", 1)[1]  # the running bar never leaves a line behind


def test_the_runner_tells_the_progress_of_every_check_in_order():
    pytest.importorskip("torch")
    from rasd.validation.runner import run_suite

    events = []
    report = run_suite("quick", "cpu", [0, 1, 2], seed=3, only=["V1", "V2"], progress=events.append)
    assert [(type(e).__name__, getattr(e, "check", None) or e.result.check, e.position, e.total) for e in events] == [
        ("CheckStarted", "V1", 1, 2),
        ("CheckFinished", "V1", 1, 2),
        ("CheckStarted", "V2", 2, 2),
        ("CheckFinished", "V2", 2, 2),
    ]
    assert [e.result for e in events if isinstance(e, CheckFinished)] == list(report.checks)
    assert all(e.elapsed_s > 0 for e in events if isinstance(e, CheckFinished))


def test_checks_the_budget_left_out_are_told_as_ended():
    pytest.importorskip("torch")
    from rasd.validation.runner import run_suite

    events = []
    report = run_suite("quick", "cpu", [0, 1, 2], only=["V1", "V2"], time_budget_s=0.5, progress=events.append)
    assert [type(e).__name__ for e in events] == ["CheckFinished", "CheckFinished"]
    assert (
        [e.result.verdict for e in events]
        == [Verdict.INCOMPLETE, Verdict.INCOMPLETE]
        == [c.verdict for c in report.checks]
    )


def test_the_cli_keeps_json_on_stdout_and_progress_on_stderr(capsys):
    pytest.importorskip("torch")
    from rasd.validation.main import main

    code = main(["--device", "cpu", "--checks", "V1,V2", "--json", "--seed", "4"])
    captured = capsys.readouterr()
    assert code == 0
    assert [c["check"] for c in json.loads(captured.out)["checks"]] == ["V1", "V2"]
    assert [line.split(":")[1].strip() for line in captured.err.splitlines()] == [
        "[1/2] V1 known-answer GEMM ...",
        "[1/2] V1 known-answer GEMM",
        "[2/2] V2 bitwise GEMM vs golden and peers ...",
        "[2/2] V2 bitwise GEMM vs golden and peers",
    ]
    ended = captured.err.splitlines()[1::2]
    assert all(": pass in " in line and line.endswith(" s") for line in ended), ended
