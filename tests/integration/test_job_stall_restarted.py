"""A hung job restarted by rasd (issue #40, goodput): real agents and controller, simulated GPUs in one job.

Four nodes of four simulated GPUs run one `StepJob`; one rank's process stops issuing work
(rasd-sim's `job_hang`): the other ranks wait in the collective, their GPUs spinning at 100 %
utilization, and no step ends. The controller's straggler watch sees the job's edges stop while its
GPUs stay busy, names the stall and the rank that fell idle, and the ladder restarts that rank's
process; the job's launcher then restarts the job (the simulated job resumes) and its edges return.
Without rasd the job's collective timeout (10 minutes by default) would end the hang.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import time

import fleetlib
import pytest
from prometheus_client import generate_latest

from rasd.agent.gpu import simulated, step_job
from rasd.controller.core import stall
from rasd.sim import fleet as sim_fleet
from rasd.sim import report, scenario

NODES, GPUS = 4, 4
STALL = {"stall": {"min_steps": 5, "min_silence_s": 8.0, "silent_periods": 3.0}}
"""Shorter than the defaults (10 steps; 30 s or 5 periods), so the test takes seconds."""
wait_for = functools.partial(fleetlib.wait_for, timeout_s=60.0, poll_s=0.2)


@pytest.mark.slow
def test_a_hung_job_is_named_stalled_its_idle_rank_restarted_and_the_job_steps_again(tmp_path, free_port):
    from rasd.controller import stragglers
    from rasd.controller.ingest import service as ingest_mod

    workload = simulated.StepWorkload(anchor_unix_s=time.time())
    job = step_job.StepJob(workload.shape(), seed=7)
    nodes = {
        f"step-{i}": fleetlib.Node(
            simulated.SimulatedBackend(f"step-{i}", GPUS, 7, workload=workload, job=job, clock=time.time_ns)
        )
        for i in range(NODES)
    }
    settings = fleetlib.sqlite_settings(
        tmp_path,
        free_port,
        ingest=ingest_mod.IngestSettings(stragglers=stragglers.StragglerSettings.from_mapping(STALL)),
    )
    stuck_gpu = nodes["step-2"].backend.inventory()[1].uuid
    with fleetlib.ThreadedFleet(settings, nodes) as fleet:
        watch = fleet.controller.ingest.stragglers
        wait_for(lambda: watch.rhythm.steps_seen >= 6)
        fleet.fire(simulated.ScriptedFault(at_s=0.0, kind="job_hang", gpu=1), "step-2")
        wait_for(lambda: job.hung_since_s is not None)
        hung_at_s = job.hung_since_s
        verdict = wait_for(lambda: watch.stall)
        named_after_s = time.time() - hung_at_s
        assert verdict.suspect_gpu == stuck_gpu and verdict.idle_gpus == (stuck_gpu,)
        assert f"15 of {NODES * GPUS} GPUs still busy: a hung collective" in verdict.reason
        code, _, noted = fleet.rasctl("get", "stragglers")
        assert code == 0 and "JOB STALLED, named " in noted and f"step-2/{stuck_gpu}: the job's steps stopped" in noted
        wait_for(lambda: job.hung_since_s is None)  # the ladder restarted the rank: the launcher restarted the job
        restarted_after_s = time.time() - hung_at_s
        steps_before = watch.rhythm.steps_seen
        wait_for(lambda: watch.rhythm.steps_seen >= steps_before + 3 and watch.stall is None)
        audit = [
            (a["action"], a["node_id"], a["gpu_uuid"])
            for a in fleet.controller.remediation.store.audit(limit=1000)
            if a["actor"] == "straggler-watch"
        ]
        assert ("straggler_stall", "step-2", stuck_gpu) in audit and ("straggler_restart", "step-2", stuck_gpu) in audit
        exposition = generate_latest(fleet.controller.ingest.metrics.registry).decode()
        assert "rasd_job_stalls_total 1.0" in exposition and "rasd_job_stalled 0.0" in exposition
    # Named within the policy's silence (8 s here, from the last edge, which precedes the hang) plus a
    # few summaries; restarted within a few seconds more. The job's NCCL watchdog would wait 600 s.
    print(f"job stall: named {named_after_s:.1f} s, restarted {restarted_after_s:.1f} s after the hang")
    policy = stall.StallPolicy(**STALL["stall"])
    assert named_after_s < policy.min_silence_s + 6.0, named_after_s
    assert restarted_after_s < named_after_s + 10.0, (named_after_s, restarted_after_s)


@pytest.mark.slow
def test_rasd_sims_job_hang_scenario_shows_the_restart_its_expect_names(tmp_path):
    """sim/scenarios/job_hang.toml as `rasd-sim --scenario job_hang` runs it: its [expect] is met."""
    loaded = scenario.load("job_hang")
    assert loaded.stragglers.stall.min_steps == 5  # its [stragglers.stall] table reached the controller's settings
    settings = sim_fleet.SimSettings(
        nodes=4,
        gpus_per_node=4,
        duration_s=loaded.expect.run_s,
        seed=3,
        scenario=loaded,
        out_dir=tmp_path,
        table_interval_s=0,
        tls=False,
    )
    result = asyncio.run(sim_fleet.run(settings, io.StringIO()))
    checked = report.expectations(result)
    assert checked is not None and checked["met"], json.dumps(checked["unmet"], indent=1)
    built = report.build(result)
    assert built["events_lost"] == 0
    hangs = built["stragglers"]["job_hangs"]
    assert (hangs["injected"], hangs["named"], hangs["stalls_with_no_hang"]) == (1, 1, 0), hangs
    assert hangs["time_to_name_s_max"] < 10.0 + 2 * loaded.workload.period_s + 3.0  # silence, its last step, summaries
    assert "| job hangs injected / stalls named / time to name, max / stalls with no hang | 1 / 1 / " in (
        report.markdown(built)
    )


@pytest.mark.slow
def test_a_host_that_dies_under_the_job_is_quarantined_at_the_stall_not_after_the_full_silence(tmp_path, free_port):
    """Issue #40: a dead host hangs the job it runs. Its agent falls silent and its ranks stop; the
    others spin. The stall names the silent node and restarts no rank; the leader, asked at once,
    takes the node (silent over stalled_lost_after_s, 20 s) for lost and the ladder quarantines it,
    well before lost_after_s (60 s) and the check after it would."""
    from rasd.controller import stragglers
    from rasd.controller.core.remediation import policy as policy_mod
    from rasd.controller.ingest import service as ingest_mod

    workload = simulated.StepWorkload(anchor_unix_s=time.time())
    job = step_job.StepJob(workload.shape(), seed=7)
    nodes = {
        f"step-{i}": fleetlib.Node(
            simulated.SimulatedBackend(f"step-{i}", GPUS, 7, workload=workload, job=job, clock=time.time_ns)
        )
        for i in range(NODES)
    }
    stall_table = {"stall": {"min_steps": 5, "min_silence_s": 22.0, "silent_periods": 3.0}}
    settings = fleetlib.sqlite_settings(
        tmp_path,
        free_port,
        ingest=ingest_mod.IngestSettings(stragglers=stragglers.StragglerSettings.from_mapping(stall_table)),
        remediation_policy=policy_mod.RemediationPolicy(lost_nodes=policy_mod.LostNodePolicy(check_interval_s=30.0)),
    )
    dead = "step-3"
    dead_ranks = range(3 * GPUS, 4 * GPUS)  # the simulated backends add their ranks in node order
    with fleetlib.ThreadedFleet(settings, nodes) as fleet:
        watch = fleet.controller.ingest.stragglers
        wait_for(lambda: watch.rhythm.steps_seen >= 6)
        fleet.kill_agent(dead)
        died_at_s = time.time()
        job.hang(died_at_s, stuck_ranks=dead_ranks)
        store = fleet.controller.remediation.store
        wait_for(lambda: any(q["node_id"] == dead for q in store.quarantines()))
        quarantined_after_s = time.time() - died_at_s
        verdict = watch.stall
        assert verdict is not None and verdict.silent_nodes == (dead,)
        (ticket,) = [t for t in store.tickets(open_only=True) if t["node_id"] == dead]
        assert "while the job it runs is stalled" in ticket["steps"][0]
        code, _, noted = fleet.rasctl("get", "stragglers")  # the stall stays: the job is not restarted
        assert code == 0 and "JOB STALLED, named " in noted and "node step-3 fell silent" in noted, noted
        restarts = [c for c in store.commands() if c.kind == "restart_process"]
        assert restarts == []  # the job would hang again on the dead host: it is the scheduler's to replace
    print(f"dead host: quarantined {quarantined_after_s:.1f} s after it died")
    assert quarantined_after_s < 40.0  # the stall (22 s + a period) and one check; lost_after_s alone: 60 s + 30 s
