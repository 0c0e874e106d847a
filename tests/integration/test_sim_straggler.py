"""rasd-sim's straggler fault and its report line (issue #40): the built-in `straggler` scenario, end to end.

A power brake holds one GPU 5 % slow; the report's stragglers section must say it was localised,
within 20 steps, and that no clean GPU was named.
"""

from __future__ import annotations

import asyncio
import io

import pytest

from rasd.sim import fleet, report, scenario


@pytest.mark.slow
def test_the_straggler_scenario_localises_the_braked_gpu_and_names_no_other(tmp_path):
    settings = fleet.SimSettings(
        nodes=8,
        gpus_per_node=8,
        duration_s=40.0,
        seed=7,
        scenario=scenario.load("straggler"),
        out_dir=tmp_path,
        table_interval_s=0,
        tls=False,
    )
    result = asyncio.run(fleet.run(settings, out=io.StringIO()))
    built = report.build(result)
    found = built["stragglers"]
    assert (found["injected"], found["localised"], found["false_positives"]) == (1, 1, [])
    assert found["steps_to_localise_max"] <= 20
    assert built["faults"]["missed"] == 0  # a straggler is not a silent fault that validation must find
    assert "| stragglers injected / localised" in report.markdown(built)
