"""rasd-sim's straggler fault and its report line (issue #40): the built-in `straggler` scenario, end to end.

A power brake holds one GPU 5 % slow; the report's stragglers section must say it was localised,
within 20 steps, and that no clean GPU was named; then the actions (issue #40 item 3) climb: notify,
validation (which passes: the brake is no fault a suite finds), quarantine, and with the GPU replaced
the job's step time comes back within 1 % of its clean twin's (the issue's acceptance).
"""

from __future__ import annotations

import asyncio
import io

import pytest

from rasd.sim import fleet, report, scenario


@pytest.mark.slow
def test_the_straggler_scenario_localises_the_braked_gpu_names_no_other_and_its_quarantine_restores_step_time(
    tmp_path,
):
    settings = fleet.SimSettings(
        nodes=8,
        gpus_per_node=8,
        duration_s=90.0,
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
    kinds = [c["kind"] for c in result.outbox]
    assert kinds.count("quarantine_gpu") == 2 and "run_validation" in kinds  # validation's hold, then the last rung
    assert built["remediation"]["wrong_actions"] == 0
    (cost,) = found["step_time"]
    assert cost["action"] == "quarantine_gpu"
    assert cost["step_time_cost_pct_before"] > 2.0  # 5 % of a compute phase of 70 % of the step: 3.5 %
    assert cost["steps_after"] >= 5 and cost["step_s_after"] <= 1.01 * cost["clean_step_s_after"]
    assert "step-time cost vs clean twin before / after quarantine_gpu" in report.markdown(built)
