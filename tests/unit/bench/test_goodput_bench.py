"""bench/goodput.py: its section ends with the ETTR goal line, whichever way it went."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "bench"))
import goodput as goodput_bench  # bench/ is scripts, not a package


def test_the_section_names_its_command_and_ends_with_the_ettr_goal(capsys):
    assert goodput_bench.main(["--seeds", "1", "--checkpoints", "300", "--no-write"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == goodput_bench.SECTION
    assert lines[2].startswith("Command: `.venv/bin/python bench/goodput.py --seeds 1 --checkpoints 300`")
    assert lines[-1].startswith("Goal: ETTR ≥ 97 % with rasd's policy at the defaults (checkpoint 300 s)")
    assert lines[-1].endswith((": met", ": NOT met"))
    assert any(line.startswith("| 300 |") for line in lines)


def test_the_ceiling_gives_back_only_detection_and_repair_time():
    arm = {
        "ettr": 0.90,
        "wall_h": 100.0,
        "time_lost_h": {"detection": 1.5, "repair": 0.5, "restart": 4.0, "lost_work": 4.0},
    }
    assert goodput_bench._ceiling(arm) == pytest.approx(0.92)  # restarts and lost work stay lost
