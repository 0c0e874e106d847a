"""bench/lost_nodes.py: its section gives both parts' figures and ends with their goal lines, met or not."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "bench"))
import lost_nodes as lost_nodes_bench  # bench/ is scripts, not a package


def _cost(**changes) -> lost_nodes_bench.Cost:
    values = {
        "first_named": ("node-00000", "node-00100", "node-00200"),
        "first_ms": 31.6,
        "steady_ms": [7.0, 8.0, 15.1],
        "storm_named": (),
        "storm_ms": 10.8,
        "quarantined": 3,
        **changes,
    }
    return lost_nodes_bench.Cost(**values)


def test_the_section_ends_with_both_goals_met_when_every_figure_is_inside_its_bound():
    text, met = lost_nodes_bench._section(_cost(), 12_500, [("follower", 23.9), ("leader", 30.1)], [], "cmd")
    lines = text.strip().splitlines()
    assert lines[0] == lost_nodes_bench.SECTION and met
    assert lines[-2].endswith("the lost nodes named and the storm's none: met")
    assert lines[-1].endswith("no live node quarantined: met")
    assert "| 2 | leader | 30.1 |" in lines


def test_a_slow_check_a_late_quarantine_or_a_live_node_held_is_not_met():
    slow, met = lost_nodes_bench._section(_cost(storm_ms=140.0), 12_500, [("leader", 20.0)], [], "cmd")
    assert not met and slow.strip().splitlines()[-2].endswith(": NOT met")
    late, met = lost_nodes_bench._section(_cost(), 12_500, [("leader", 36.0)], [], "cmd")
    assert not met and late.strip().splitlines()[-1].endswith(": NOT met")
    held, met = lost_nodes_bench._section(_cost(), 12_500, [("leader", 20.0)], ["node-5"], "cmd")
    assert not met and "Live nodes quarantined: 1 (node-5)" in held
