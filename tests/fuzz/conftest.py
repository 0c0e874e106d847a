"""Fuzzing support: how many inputs each run tried, printed in pytest's terminal summary.

Fuzz tests report their counts with ``record_property("fuzz:<what>", n)``; this plugin adds them up
and prints them whether or not output capture is on. ``RASD_FUZZ_INPUTS`` sets the size of a run
(CI sets 10,000; a developer's ``make test`` runs 2,000).
"""

from __future__ import annotations

import os
import pathlib
import sys

_HERE = str(pathlib.Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # tests/ has no __init__.py: the strategies module is imported by name

FUZZ_INPUTS = int(os.environ.get("RASD_FUZZ_INPUTS", "2000"))
_counts: dict[str, int] = {}


def pytest_runtest_logreport(report):
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if isinstance(name, str) and name.startswith("fuzz:"):
            _counts[name.removeprefix("fuzz:")] = _counts.get(name.removeprefix("fuzz:"), 0) + int(value)


def pytest_terminal_summary(terminalreporter):
    if not _counts:
        return
    terminalreporter.section("fuzzing: inputs tried")
    for name in sorted(_counts):
        terminalreporter.write_line(f"{name}: {_counts[name]:,}")
