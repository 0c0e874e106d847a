"""bench/remediation.py: the CPU pinning options and what the section says about them."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "bench"))
import remediation  # bench/ is scripts, not a package


def test_the_section_names_the_cpus_each_side_ran_on():
    args = remediation._parser().parse_args(["--quarantine", "kubernetes", "--decider-cpu", "0", "--aside-cpu", "1"])
    text = remediation._pinning_text(args)
    assert "commit writer on CPU 0" in text and "fake API server pinned to CPU 1" in text


def test_no_pinning_says_nothing_and_aside_needs_the_kubernetes_adapter():
    assert remediation._pinning_text(remediation._parser().parse_args([])) == ""
    record = remediation._parser().parse_args(["--aside-cpu", "1"])
    assert remediation._pinning_text(record) == ""  # nothing runs aside with the record adapter
