"""bench/remediation_capacity.py: the capacity figure it reports, and the rates it accepts."""

from __future__ import annotations

import argparse
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "bench"))
import remediation_ab  # bench/ is scripts, not a package
import remediation_capacity


def _bursts(*p99s: float) -> list[remediation_ab.Burst]:
    return [remediation_ab.Burst(p50_ms=p99 / 4, p99_ms=p99, cpu_s=5.0, loop_s=3.0, gc_longest_ms=0.0) for p99 in p99s]


def test_the_capacity_is_the_highest_rate_within_the_goal_in_every_round():
    by_rate = {800.0: _bursts(20, 31), 1200.0: _bursts(44, 49.9), 1600.0: _bursts(48, 75), 2000.0: _bursts(300, 900)}
    assert remediation_capacity.highest_rate_within_goal(by_rate, 50.0) == 1200.0


def test_a_rate_above_a_miss_does_not_count_and_a_missed_lowest_rate_gives_none():
    by_rate = {800.0: _bursts(20), 1200.0: _bursts(60), 1600.0: _bursts(45)}  # 1,600 lucky once: not trusted
    assert remediation_capacity.highest_rate_within_goal(by_rate, 50.0) == 800.0
    assert remediation_capacity.highest_rate_within_goal({800.0: _bursts(51)}, 50.0) is None


def test_rates_are_numbers_separated_by_commas_and_positive():
    assert remediation_capacity._parse_rates("2000, 800,1200") == [800.0, 1200.0, 2000.0]
    with pytest.raises(argparse.ArgumentTypeError, match="numbers separated by commas"):
        remediation_capacity._parse_rates("800;1200")
    with pytest.raises(argparse.ArgumentTypeError, match="positive"):
        remediation_capacity._parse_rates("0,800")
