"""bench/remediation_ab.py reads the burst figures out of bench/remediation.py's tables (by their headers) and notes."""

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

| round | backend | commits | run | offered | done | events/s achieved | decision p50 ms | decision p99 ms | decisions | CPU s (controller) |
|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|
| 1 | sqlite | process | paced 10/s (on_events only) | 50 | 50 | 10 | 7.5 | 15.0 | 19 | 0.5 |
| 1 | sqlite | process | burst 2,000/s (on_events) | 10,000 | 10,000 | 1,988 | 58.5 | 1,354.4 | 3,772 | 7.4 |

- round 1, sqlite, commits in a process: paced dispatched notify 1; the event loop's thread was busy 0.3 s of the burst's 5.0 s; garbage collector: no pause in the burst
- round 1, sqlite, commits in a process: burst dispatched notify 12, reset_gpu 825 (agent commands written to streams: 12,710); events stored 10,000; the event loop's thread was busy 3.6 s of the burst's 5.0 s; garbage collector: 3 pause(s) in the burst, 0 of them in quiet moments (no decision waiting), longest 1,084.3 ms, 1,100.0 ms in all
"""  # noqa: E501 (the bench's own lines, as it prints them)


def test_the_burst_rows_figures_are_read_by_their_headers_and_its_notes():
    figures = remediation_ab.burst_figures(TABLES)
    assert figures == remediation_ab.Burst(p50_ms=58.5, p99_ms=1354.4, cpu_s=7.4, loop_s=3.6, gc_longest_ms=1084.3)
    reordered = TABLES.replace("decision p50 ms | decision p99 ms", "decision p99 ms | decision p50 ms")
    swapped = remediation_ab.burst_figures(reordered)
    assert (swapped.p50_ms, swapped.p99_ms) == (1354.4, 58.5), "columns are found by name, not place"


def test_a_burst_without_a_pause_has_a_longest_pause_of_zero_and_an_older_bench_has_none():
    quiet = TABLES.replace("3 pause(s) in the burst, 0 of them in quiet moments (no decision waiting), longest "
                           "1,084.3 ms, 1,100.0 ms in all", "no pause in the burst")  # fmt: skip
    assert remediation_ab.burst_figures(quiet).gc_longest_ms == 0.0
    older = "\n".join(line for line in TABLES.splitlines() if not line.startswith("- round"))
    figures = remediation_ab.burst_figures(older)
    assert (figures.loop_s, figures.gc_longest_ms) == (None, None)


def test_output_without_a_burst_row_is_an_error_that_shows_it():
    with pytest.raises(ValueError, match=r"no burst row in bench/remediation\.py.s output"):
        remediation_ab.burst_figures(TABLES.split("| 1 | sqlite | process | burst")[0])
