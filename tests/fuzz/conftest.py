"""Fuzzing support: how many inputs each run tried, printed in pytest's terminal summary.

Fuzz tests report their counts with ``record_property("fuzz:<what>", n)``; tests/conftest.py adds
them up and prints them whether or not output capture is on (there because under pytest-xdist the
controller process loads only that conftest; the counts reach it in the workers' reports).
``RASD_FUZZ_INPUTS`` sets the size of a run (``make test-all`` and CI: 10,000; ``make test``: 2,000).
"""

from __future__ import annotations

import os
import pathlib
import sys

_HERE = str(pathlib.Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # tests/ has no __init__.py: the strategies module is imported by name

FUZZ_INPUTS = int(os.environ.get("RASD_FUZZ_INPUTS", "2000"))
