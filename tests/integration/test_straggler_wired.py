"""A straggler named end to end (issue #40): simulated GPUs in one step-synchronous job, real agents and controller.

Four nodes of four simulated GPUs run one `StepJob` (as rasd-sim's fleet does); one rank is capped
to be 10 % slower, a power brake the job cannot see. Each agent finds its GPUs' compute ->
communication edges in its own 10 Hz samples and sends them in its summaries; the controller cuts
them into steps and judges them. `rasctl get stragglers` names the slow GPU and no other, and the
controller's metrics show it.
"""

from __future__ import annotations

import functools
import json
import time

import fleetlib
import pytest
from prometheus_client import generate_latest

from rasd.agent.gpu import simulated, step_job

NODES, GPUS = 4, 4
SLOWDOWN = 0.10
wait_for = functools.partial(fleetlib.wait_for, timeout_s=60.0, poll_s=0.5)


def _fleet(tmp_path, port) -> tuple[fleetlib.ThreadedFleet, str]:
    """The fleet, and the UUID of its slow GPU (node 2's GPU 1)."""
    workload = simulated.StepWorkload(anchor_unix_s=time.time())
    job = step_job.StepJob(workload.shape(), seed=7)
    nodes = {}
    for index in range(NODES):
        node_id = f"step-{index}"
        backend = simulated.SimulatedBackend(node_id, GPUS, 7, workload=workload, job=job, clock=time.time_ns)
        nodes[node_id] = fleetlib.Node(backend, node_ops=False)
    slow_rank = 2 * GPUS + 1
    job.set_cap(slow_rank, float(job.compute_w[slow_rank]) / (1.0 + SLOWDOWN), at_s=time.time())
    slow_gpu = nodes["step-2"].backend.inventory()[1].uuid
    return fleetlib.ThreadedFleet(fleetlib.sqlite_settings(tmp_path, port), nodes), slow_gpu


@pytest.mark.slow
def test_the_slow_gpu_is_named_through_the_agents_summaries_and_no_clean_gpu_is(tmp_path, free_port):
    fleet, slow_gpu = _fleet(tmp_path, free_port)
    with fleet:

        def named():
            code, out, _ = fleet.rasctl("get", "stragglers", "-o", "json")
            return code == 0 and json.loads(out)

        (first,) = wait_for(named)
        assert (first["target"]["node_id"], first["target"]["gpu_uuid"]) == ("step-2", slow_gpu)
        assert first["mean_lag_s"] > 0.05
        assert "lags the job's median edge" in first["reason"]
        time.sleep(10.0)  # five more steps: still no clean GPU named
        code, out, _ = fleet.rasctl("get", "stragglers", "-o", "json")
        assert code == 0 and [s["target"]["gpu_uuid"] for s in json.loads(out)] == [slow_gpu]
        code, table, _ = fleet.rasctl("get", "stragglers")
        assert code == 0 and f"step-2/{slow_gpu}" in table and "LAG" in table
        exposition = generate_latest(fleet.controller.ingest.metrics.registry).decode()
        assert f'rasd_straggler_suspect{{gpu="{slow_gpu}",node="step-2"}} 1.0' in exposition
        assert fleet.controller.ingest.stragglers.steps_judged >= 5
