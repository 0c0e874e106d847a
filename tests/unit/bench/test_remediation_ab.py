"""bench/remediation_ab.py reads the burst figures out of bench/remediation.py's tables by their headers."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "bench"))
import remediation_ab  # bench/ is scripts, not a package

TABLES = """
| round | backend | commits | path | events | wall s | events/s | ms/event | CPU s (controller) | CPU s (PostgreSQL) |
|---:|---|---|---|---:|---:|---:|---:|---:|---:|
| 1 | sqlite | process | on_events only | 1,491 | 4.0 | 372 | 2.7 | 4.0 | – |

| round | backend | commits | run | offered | done | events/s achieved | decision p50 ms | decision p99 ms | decisions |
|---:|---|---|---|---:|---:|---:|---:|---:|---:|
| 1 | sqlite | process | paced 10/s (on_events only) | 50 | 50 | 10 | 7.5 | 15.0 | 19 |
| 1 | sqlite | process | burst 2,000/s (on_events) | 10,000 | 10,000 | 1,988 | 58.5 | 1,354.4 | 3,772 |
"""


def test_the_burst_rows_p50_and_p99_are_read_by_their_headers():
    assert remediation_ab.burst_figures(TABLES) == (58.5, 1354.4)
    reordered = TABLES.replace("decision p50 ms | decision p99 ms", "decision p99 ms | decision p50 ms")
    assert remediation_ab.burst_figures(reordered) == (1354.4, 58.5), "columns are found by name, not place"


def test_output_without_a_burst_row_is_an_error_that_shows_it():
    with pytest.raises(ValueError, match=r"no burst row in bench/remediation\.py.s output"):
        remediation_ab.burst_figures(TABLES.split("| 1 | sqlite | process | burst")[0])
