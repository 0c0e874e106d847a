"""The ladder's scenario library through rasd-sim: every rung and failure branch, end to end (issue #37).

Each scenario of sim/scenarios/ladder/ runs on a real controller with simulated agents on loopback
(2 nodes × 2 GPUs) for its ``[expect] run_s``, and must show what its ``[expect]`` says on its node:
the ladder's path (the repair commands in order, with their outcomes), the states of the node's open
tickets and what stays quarantined. Scenarios that need more than 5 s of simulated time are slow.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import io
import json

import pytest

from rasd.sim import fleet, report, scenario
from rasd.sim import main as sim_main

FAST_RUN_S = 5.0


def _params() -> list:
    out = []
    for name in scenario.library_names("ladder"):
        slow = scenario.load(name).expect.run_s > FAST_RUN_S
        out.append(pytest.param(name, id=name.removeprefix("ladder/"), marks=[pytest.mark.slow] if slow else []))
    return out


@pytest.mark.parametrize("name", _params())
def test_the_ladder_takes_the_path_the_scenario_expects(name, tmp_path):
    loaded = scenario.load(name)
    settings = fleet.SimSettings(
        nodes=2,
        gpus_per_node=2,
        duration_s=loaded.expect.run_s,
        seed=3,
        scenario=loaded,
        out_dir=tmp_path,
        table_interval_s=0,
        tls=False,
    )
    result = asyncio.run(fleet.run(settings, io.StringIO()))
    checked = report.expectations(result)
    assert checked is not None
    assert checked["met"], json.dumps(checked["unmet"], indent=1)
    built = report.build(result)
    assert built["events_lost"] == 0 and built["faults"]["missed"] == 0


def test_rasd_sim_runs_a_library_scenario_by_name_and_fails_on_an_unmet_expectation(tmp_path, capsys):
    args = ["--nodes", "2", "--gpus-per-node", "2", "--duration-s", "4", "--seed", "3", "--insecure",
            "--table-interval-s", "0"]  # fmt: skip
    assert sim_main.main([*args, "--scenario", "ladder/restart-ok", "--out", str(tmp_path / "ok")]) == 0
    printed = capsys.readouterr().out
    assert "ladder path on node-000 | restart_process:succeeded |" in printed
    assert "scenario expectations | met |" in printed

    wrong = tmp_path / "wrong.toml"
    text = importlib.resources.files("rasd.sim").joinpath("scenarios/ladder/restart-ok.toml").read_text()
    wrong.write_text(text.replace('path = ["restart_process:succeeded"]', 'path = ["reset_gpu:succeeded"]'))
    assert sim_main.main([*args, "--scenario", str(wrong), "--out", str(tmp_path / "wrong")]) == 1
    assert "the scenario's [expect] was not met" in capsys.readouterr().err
