"""A power-braked straggler's cap raised by the power loop, within the budget (issue #40 item 3).

Four nodes of four simulated B200s run one `StepJob` under a real controller with its power loop
and ladder; one rank suffers rasd-sim's `straggler` fault (a power brake: 10 % slower, the HW
power-brake clock reason set). The watch names it with the brake as evidence, sizes a raise to the
room the power loop published, and the ladder's straggler actions hand it to the loop as a floor;
the loop's next period sends the raise, and the GPU enforces it. At every sampled moment the limits
the GPUs report enforcing (their telemetry, as the controller holds it) stay within the budget.
"""

from __future__ import annotations

import functools
import re
import threading
import time

import fleetlib
import pytest

from rasd.agent.gpu import simulated, step_job

NODES, GPUS = 4, 4
BUDGET_W = 12_800
"""Under the GPUs' 16 x 1,000 W boot limits (the loop cuts first), over what the job draws (room to raise)."""
TREE = {
    "name": "cluster",
    "budget_w": BUDGET_W,
    "rows": [{"name": "row", "racks": [{"name": "rack", "nodes": [{"name": f"step-{i}"} for i in range(NODES)]}]}],
}
POWER = {
    "tree": TREE,
    # No swing plan or start profile within the test: smoothing raises the troughs and hides the edges.
    # Steps of 5 % of the range (40 W): rasd-sim's braked GPU flips between donor and capped (its SW
    # power cap bit follows its unbraked demand), and a capped step of 50 % (400 W) took its cap to
    # 995 W of 1,000 W in one run, so the verdict, landing in that phase, found 5 W of room and
    # refused the raise. Small steps keep its cap far under its max whichever phase the verdict meets.
    "policy": {
        "control_period_s": 0.5,
        "command_ttl_s": 2.0,
        "job_start_smoothing_enabled": False,
        "max_step_pct_of_range": 5.0,
    },
    "detect_window_s": 600.0,
}
# Only the raise: a validation would hold the GPU (and take its floor) before the test looks.
ACTIONS = {"actions": {"validate": False, "quarantine": False}}
wait_for = functools.partial(fleetlib.wait_for, timeout_s=90.0, poll_s=0.2)


def _fleet(tmp_path, port) -> tuple[fleetlib.ThreadedFleet, dict[str, simulated.SimulatedBackend], str]:
    from rasd.controller import stragglers
    from rasd.controller.ingest import service as ingest_mod

    workload = simulated.StepWorkload(anchor_unix_s=time.time())
    job = step_job.StepJob(workload.shape(), seed=7)
    backends = {
        f"step-{i}": simulated.SimulatedBackend(
            f"step-{i}", GPUS, 7, workload=workload, job=job, clock=time.time_ns, gpu_model=simulated.B200
        )
        for i in range(NODES)
    }
    settings = fleetlib.sqlite_settings(
        tmp_path,
        port,
        power=POWER,
        ingest=ingest_mod.IngestSettings(stragglers=stragglers.StragglerSettings.from_mapping(ACTIONS)),
    )
    nodes = {n: fleetlib.Node(b, node_ops=False) for n, b in backends.items()}
    slow_gpu = backends["step-2"].inventory()[1].uuid
    return fleetlib.ThreadedFleet(settings, nodes), backends, slow_gpu


@pytest.mark.slow
def test_a_braked_stragglers_cap_is_raised_by_the_power_loop_within_the_budget(tmp_path, free_port):
    fleet, _, slow_gpu = _fleet(tmp_path, free_port)
    peak = {"w": 0}
    done = threading.Event()

    def limits_w() -> dict[str, int]:
        latest = dict(fleet.controller.ingest.latest)  # read from this thread: a copy, then its values
        return {gpu: int(r.enforced_power_limit_w or 0) for gpu, r in latest.items()}

    def sample() -> None:  # the invariant on the GPUs themselves, while the loop works
        while not done.is_set():
            peak["w"] = max(peak["w"], sum(limits_w().values()))
            time.sleep(0.1)

    with fleet:
        power = fleet.controller.power
        assert power is not None
        wait_for(lambda: len(limits_w()) == NODES * GPUS and sum(limits_w().values()) <= BUDGET_W)  # cut first
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        fleet.fire(simulated.ScriptedFault(at_s=0.0, kind="straggler", gpu=1, slowdown=0.10), "step-2")
        watch = fleet.controller.ingest.stragglers
        try:
            floor = wait_for(lambda: power.floors.get(slow_gpu))
        except AssertionError:
            raise AssertionError(
                f"no floor: {watch.steps_judged} steps judged, suspects "
                f"{[(s.verdict.gpu_uuid, s.action, s.action_reason) for s in watch.listing()]}, slow {slow_gpu}"
            ) from None
        raised = re.search(r"power-throttled: cap raised (\d+) → (\d+) W within the budget", floor.reason)
        assert floor.node_id == "step-2" and raised is not None, floor.reason
        assert int(raised[1]) < int(raised[2]) == floor.floor_w <= 1_000
        wait_for(lambda: limits_w()[slow_gpu] >= floor.floor_w)  # the loop's own command raised it
        (suspect,) = fleet.controller.ingest.stragglers.listing()
        assert suspect.verdict.gpu_uuid == slow_gpu and "hardware power brake" in suspect.verdict.reason
        assert suspect.action == "cap_raised"
        audit = [
            (a["action"], a["outcome"])
            for a in fleet.controller.remediation.store.audit()
            if a["actor"] == "straggler-watch" and a["gpu_uuid"] == slow_gpu
        ]
        assert ("straggler_raise_cap", f"applied as a floor of {floor.floor_w:.0f} W") in audit
        done.set()
        sampler.join()
    assert 0 < peak["w"] <= BUDGET_W
