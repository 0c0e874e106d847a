"""The job-start cap ramp end to end (issue #5, G3): real controller and agents on loopback (`rasd-sim`).

The GPUs idle before the job starts; the controller parks their caps at the start cap (their
minimum limit) and, when the job starts, raises them at the aggregate ramp limit shared by all of
them. Ground truth comes from the simulated GPUs against an unmanaged twin of the same seeded job
(`rasd.sim.power_sim`), which jumps from idle to full power at once.

The first tests' job draws the same in compute and communication (a steady load), so that the 1 s
aggregate ramp measures the start alone. With a step-synchronous swing the step's own swing under
the rising cap would dominate that measure; on GPUs with smoothing hardware (B200-class) the
start profiles hold it (`rasd.controller.core.power.start_smoothing`): the last tests run that job, and
a steady one whose start profiles are released when no swing shows up.

Each ramping GPU's raise goes out with its share of the limit as a rate, and the agent slews the
limit at it, so the ramp holds over the limits that *land*, however late or bunched the commands
arrive: one run delivers every controller message through a proxy that delays it by 0-450 ms in
order (`rasd.sim.netdelay`), which bunches consecutive periods' commands together.
"""

from __future__ import annotations

import asyncio
import io

import pytest

from rasd.sim import fleet, power_sim, scenario

NODES, GPUS = 4, 8
START_S = 10.0
LIMIT_W_PER_S = 10_000.0


def _run(tmp_path, policy: dict, *, duration_s: float = 22.0, downlink_delay_s=None, gpu_model="h100", comm_w=None):
    scen = scenario.parse(
        {
            "name": "job-start",
            "workload": {
                "period_s": 2.0,
                "compute_fraction": 0.7,
                "compute_w": [650.0, 700.0],
                "comm_w": comm_w or [650.0, 700.0],
                "start_after_s": START_S,
            },
            "power": {
                "gpu_model": gpu_model,
                "cluster_budget_w": NODES * GPUS * 700,
                "detect_window_s": 8.0,
                "draw_window_s": 4.0,
                "policy": {
                    "control_period_s": 1.0,
                    "command_ttl_s": 3.0,
                    "ramp_limit_w_per_s": LIMIT_W_PER_S,
                    "job_start_idle_s": 3.0,
                    **policy,
                },
            },
        },
        source="test",
    )
    settings = fleet.SimSettings(
        nodes=NODES,
        gpus_per_node=GPUS,
        duration_s=duration_s,
        seed=5,
        scenario=scen,
        out_dir=tmp_path,
        table_interval_s=0,
        tls=False,
        downlink_delay_s=downlink_delay_s,
    )
    result = asyncio.run(fleet.run(settings, out=io.StringIO()))
    trace = result.power_trace
    assert trace is not None and scen.power is not None
    return trace, power_sim.job_start_section(trace, period_s=2.0), power_sim.report_section(trace, scen.power.policy)


def test_the_job_start_ramp_keeps_the_1s_aggregate_ramp_under_the_limit(tmp_path):
    trace, start, figures = _run(tmp_path, {"job_start_ramp_enabled": True})
    n = NODES * GPUS
    assert start["job_start_parked_gpus"] == n, start
    assert start["job_start_ramp_end_s"] is not None, "the ramp ran"
    # Unmanaged: idle to full power within one sample; managed: within the limit over every 1 s.
    assert start["job_start_ramp_1s_w_per_s_unmanaged"] > 1.5 * LIMIT_W_PER_S, start
    assert start["job_start_ramp_1s_w_per_s_managed"] <= LIMIT_W_PER_S, start
    # Over the whole run too (nothing else moves this steady load).
    assert figures["max_ramp_w_per_s"] <= LIMIT_W_PER_S, figures
    assert figures["budget_violations"] == 0
    # The ramp ends: the managed job draws what the unmanaged one does by the end of the run.
    assert trace.managed_w[-1] >= 0.98 * trace.unmanaged_w[-1]
    assert start["full_speed_after_s"] is not None and start["job_start_delay_s"] >= 0


@pytest.mark.slow
def test_the_landed_ramp_holds_the_limit_under_delivery_jitter(tmp_path):
    trace, start, figures = _run(tmp_path, {"job_start_ramp_enabled": True}, downlink_delay_s=(0.0, 0.45))
    assert start["job_start_parked_gpus"] == NODES * GPUS, start
    # The limits the GPUs enforce rose at most at the limit over every 1 s (the landed cap changes),
    # and so did the draw, start jump included.
    assert 0.5 * LIMIT_W_PER_S <= start["job_start_cap_ramp_1s_w_per_s"] <= LIMIT_W_PER_S, start
    assert start["job_start_ramp_1s_w_per_s_managed"] <= LIMIT_W_PER_S, start
    assert figures["max_ramp_w_per_s"] <= LIMIT_W_PER_S, figures
    assert figures["budget_violations"] == 0
    assert trace.managed_w[-1] >= 0.98 * trace.unmanaged_w[-1], "the ramp ended"


@pytest.mark.slow
def test_start_profiles_hold_the_step_swing_from_the_start_and_hand_over_to_the_swing_plan(tmp_path):
    # 32 GPUs swinging 550 W in phase: 17.6 kW within 0.1 s unmanaged, against a 10 kW/s limit.
    policy = {"job_start_ramp_enabled": True, "swing_target_pct": 10.0, "job_start_smoothing_release_s": 6.0}
    _, start, figures = _run(tmp_path, policy, duration_s=32.0, gpu_model="b200", comm_w=[100.0, 150.0])
    n = NODES * GPUS
    assert start["job_start_parked_gpus"] == n, start
    assert start["job_start_ramp_1s_w_per_s_unmanaged"] > 1.5 * LIMIT_W_PER_S, start
    # Canaries (5: their maximum limits take half the limit) keep no profile, every other GPU does.
    assert start["job_start_smoothing_gpus"] == n - 5, start
    assert start["job_start_smoothing_from_s"] <= START_S + 3.0, start
    # The swing plan took over from the start profiles (sized from the canaries: the unmanaged
    # swing), in the period after the last one with a start profile: no gap.
    assert start["swing_plan_from_s"] is not None, start
    assert 0.0 < start["swing_plan_from_s"] - start["job_start_smoothing_until_s"] <= 1.5, start
    assert figures["smoothing_mode"] == "firmware" and figures["floor_w_per_gpu"] > 500.0, figures
    # The raw 1 s aggregate ramp held from before the start to the end of the run, hand-over included.
    assert start["job_start_ramp_1s_w_per_s_to_end_managed"] <= LIMIT_W_PER_S, start
    assert figures["budget_violations"] == 0


@pytest.mark.slow
def test_start_profiles_are_released_when_no_swing_shows_up(tmp_path):
    policy = {"job_start_ramp_enabled": True, "job_start_smoothing_release_s": 4.0}
    trace, start, figures = _run(tmp_path, policy, duration_s=26.0, gpu_model="b200")
    assert start["job_start_smoothing_gpus"] > 0, start
    assert start["swing_plan_from_s"] is None, "a steady load needs no swing plan"
    # Released 4 s after the cap ramp ended (within a period or two), well before the run ended.
    ended = start["job_start_ramp_end_s"]
    assert ended + 3.0 <= start["job_start_smoothing_until_s"] <= ended + 7.0, start
    assert trace.t_s[-1] > start["job_start_smoothing_until_s"] + 2.0
    assert figures["max_ramp_w_per_s"] <= LIMIT_W_PER_S, figures
    assert figures["budget_violations"] == 0
