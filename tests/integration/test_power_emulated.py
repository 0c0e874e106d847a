"""Emulated power smoothing end to end, on H100-class simulated GPUs (no smoothing hardware).

A real controller and real agents on loopback (`rasd-sim`'s fleet): the controller detects the
step-synchronous swing, finds that the GPUs have no firmware smoothing, and emulates it: with the
trough filler allowed, SetTroughFiller reaches every node's hook (the simulated one holds the
GPU's draw at the floor during communication phases); with only a peak cap allowed, the cap rides
on the power caps. Ground truth comes from the simulated GPUs, against an unmanaged twin of the same
seeded job (`rasd.sim.power_sim`).
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest

from rasd.sim import fleet, power_sim, scenario

pytestmark = pytest.mark.slow


def _run(tmp_path, policy: dict, *, nodes: int = 4, gpus: int = 8, duration_s: float = 24.0, stop_after_s=None):
    scen = scenario.parse(
        {
            "name": "emulated",
            "workload": {
                "period_s": 2.0,
                "compute_fraction": 0.7,
                "compute_w": [650.0, 700.0],
                "comm_w": [100.0, 150.0],
                **({"stop_after_s": stop_after_s} if stop_after_s is not None else {}),
            },
            "power": {
                "gpu_model": "h100",
                "cluster_budget_w": nodes * gpus * 700,
                "detect_window_s": 8.0,
                "draw_window_s": 6.0,
                "policy": {"control_period_s": 2.0, "command_ttl_s": 3.0, **policy},
            },
        },
        source="test",
    )
    settings = fleet.SimSettings(
        nodes=nodes,
        gpus_per_node=gpus,
        duration_s=duration_s,
        seed=3,
        scenario=scen,
        out_dir=tmp_path,
        table_interval_s=0,
        tls=False,
    )
    result = asyncio.run(fleet.run(settings, out=io.StringIO()))
    assert result.power_trace is not None and scen.power is not None
    until = stop_after_s if stop_after_s is not None else None
    return result, power_sim.report_section(result.power_trace, scen.power.policy, measure_until_s=until)


def test_the_trough_filler_hook_damps_the_swing_and_lands_softly_at_job_end(tmp_path):
    # 32 GPUs, aggregate ramp limit 1,600 W/s: 50 W/s per GPU, so the filler's floor (about 620 W)
    # takes about 11 s to come down to idle after the job stops at 20 s.
    stop_s = 20.0
    result, figures = _run(
        tmp_path,
        {"swing_target_pct": 10.0, "trough_filler_enabled": True, "ramp_limit_w_per_s": 1600.0},
        duration_s=30.0,
        stop_after_s=stop_s,
    )
    assert figures["smoothing_mode"] == "emulated"
    assert figures["swing_reduction_pct"] >= 70.0, figures
    assert figures["budget_violations"] == 0
    # A floor costs energy, not time: the step is as long as the unmanaged twin's.
    assert figures["step_time_cost_pct"] is not None and figures["step_time_cost_pct"] <= 1.0
    assert figures["energy_overhead_ratio_to_min"] is not None and figures["energy_overhead_ratio_to_min"] <= 1.1
    # The hook ran on every node: the GPUs hold the floor (none of them has a firmware profile).
    trace = result.power_trace
    assert trace is not None and trace.floor_w is not None

    # Job end: unmanaged power falls to idle at once; the filler holds its floor until the controller
    # sees the job gone, then lowers it at the job ramp instead of dropping 550 W per GPU at once.
    def per_gpu_w(series, at_s):
        return float(series[abs(trace.t_s - at_s).argmin()]) / 32

    assert per_gpu_w(trace.unmanaged_w, stop_s + 2.0) < 100
    assert per_gpu_w(trace.managed_w, stop_s + 2.0) > 400
    assert per_gpu_w(trace.managed_w, stop_s + 9.0) < per_gpu_w(trace.managed_w, stop_s + 5.0) - 100
    after = (trace.t_s > stop_s + 1.0) & (trace.t_s < stop_s + 9.0)
    steps_w = abs(np.diff(trace.managed_w[after])) / 32
    assert steps_w.max() < 50, "no cliff: under 50 W per GPU per 0.1 s sample (dropping to idle at once is 550 W)"


def test_a_peak_cap_alone_rides_on_the_caps_and_never_exceeds_the_allocation(tmp_path):
    # Without the trough filler the only lever is the peak: a cap, which costs step time.
    _, figures = _run(tmp_path, {"swing_target_pct": 50.0, "peak_cap_enabled": True}, nodes=2, gpus=4)
    assert figures["smoothing_mode"] == "emulated"
    assert figures["swing_reduction_pct"] >= 30.0, figures
    assert figures["step_time_cost_pct"] > 1.0, "a peak cap slows the compute phase"
    assert figures["budget_violations"] == 0
