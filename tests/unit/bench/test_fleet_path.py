"""bench/fleet_path.py: every step runs on the real code over every GPU, in each format, and the section says so."""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "bench"))
import fleet_path  # bench/ is scripts, not a package

from rasd.controller.core import aggregates


def test_each_layout_and_format_times_every_step_over_every_gpu_and_the_goal_reads_the_newest_format():
    rows = [
        fleet_path.measure(40, 2, 1, leader_holds_share=share, version=version)
        for share in (False, True)
        for version in aggregates.READ_FORMATS
    ]
    for row in rows:
        assert row["gpus"] == 40 * 8 and row["aggregates"] == 2 and row["kib"] > 0
        assert set(row["steps_ms"]) == set(fleet_path.STEPS) and min(row["steps_ms"].values()) >= 0
    assert rows[len(aggregates.READ_FORMATS)]["layout"] == "leader holds 1/3 of the nodes"
    assert rows[0]["layout"] == "leader holds no stream"
    args = argparse.Namespace(nodes=40, replicas=2, rounds=1, formats="1,2,3")
    text = fleet_path.render(rows, args, "a machine", "now")
    assert "--formats 1,2,3" in text and "in the format a leader of this version is shipped (3), worst layout" in text
    assert text.rstrip().splitlines()[-1].startswith("Goal: ")
    older = fleet_path.render([row for row in rows if row["format"] == 1], args, "a machine", "now")
    assert older.rstrip().endswith("shipped (3), not measured: NOT met"), "the goal is the newest format's"
