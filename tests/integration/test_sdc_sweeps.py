"""Rolling SDC sweeps end to end: a live controller sweeps idle simulated nodes over gRPC.

Three idle nodes, one with a GPU that corrupts data. The sweep loop (not a test hook) takes the
nodes one at a time within the disruption budget; the healthy ones pass and go back to service;
the bad GPU fails the quick suite, becomes an accusation, fails the rerun (2 of 3) and ends as
an RMA candidate while its node's other GPUs return to service. `rasctl sdc list` ranks it first.
"""

from __future__ import annotations

import functools
import json
import time

import fleetlib
import pytest

from rasd.agent.gpu import simulated
from rasd.controller.core.remediation import policy

NODES = ("sweep-a", "sweep-b", "sweep-c")
wait_for = functools.partial(fleetlib.wait_for, timeout_s=45.0, poll_s=0.3)


def sweep_fleet(tmp_path, port) -> fleetlib.ThreadedFleet:
    """A controller with sweeps on and three idle agents; sweep-b's GPU 1 corrupts data from the start."""
    pol = policy.RemediationPolicy.from_mapping(
        {
            "sdc": {
                "sweep_enabled": True,
                "sweep_interval_s": 0.3,
                "sweep_share_pct": 100.0,
                "sweep_max_concurrent": 3,
                "sweep_reserve_slots": 0,
                "sweep_min_interval_s": 86400.0,
            },
            "disruption": {"storm_cooldown_s": 0.1},
        }
    )
    nodes = {n: fleetlib.Node(simulated.SimulatedBackend(n, 4, i + 1), {"rack": f"r-{n}"}) for i, n in enumerate(NODES)}
    # Nothing in its telemetry says so: only a validation run can find it.
    nodes["sweep-b"].backend.fire(simulated.ScriptedFault(at_s=0, kind="sdc", gpu=1), time.time_ns())
    return fleetlib.ThreadedFleet(fleetlib.sqlite_settings(tmp_path, port, remediation_policy=pol), nodes)


def test_rolling_sweep_finds_the_sdc_gpu_and_returns_the_rest(tmp_path, free_port):
    with sweep_fleet(tmp_path, free_port) as fleet:
        bad_gpu = fleet.nodes["sweep-b"].backend.inventory()[1].uuid

        def rma_opened():
            code, out, _ = fleet.rasctl("rma", "list", "--json")
            return code == 0 and json.loads(out)

        (rma,) = wait_for(rma_opened)
        assert (rma["target"]["node_id"], rma["target"]["gpu_uuid"]) == ("sweep-b", bad_gpu)

        def all_swept():
            _code, out, _ = fleet.rasctl("audit", "--json", "--limit", "500")
            swept = {r["target"]["node_id"] for r in json.loads(out) if r["action"] == "sdc_sweep"}
            return swept == set(NODES) and swept

        wait_for(all_swept)

        def settled():
            _code, out, _ = fleet.rasctl("validations", "--json")
            runs = json.loads(out)
            quarantines = fleet.rasctl("nodes", "--json")[1]
            return len(runs) >= 4 and runs, json.loads(quarantines)

        runs, _ = wait_for(lambda: settled()[0] and settled())
        by_node = {}
        for run in runs:
            by_node.setdefault(run["target"]["node_id"], []).append((run["suite"], run["verdict"]))
        assert sorted(by_node["sweep-a"]) == [("quick", "pass")]
        assert sorted(by_node["sweep-c"]) == [("quick", "pass")]
        # The bad node: the sweep fails, then the accusation suite confirms it (2 of 3).
        assert sorted(by_node["sweep-b"]) == [("accusation", "fail"), ("quick", "fail")]

        # Only the bad GPU stays out: the swept nodes and sweep-b itself are back in service.
        def quarantines_settled():
            quarantined = fleet.controller.remediation.budget.quarantined_nodes
            return not quarantined

        wait_for(quarantines_settled)
        code, out, _ = fleet.rasctl("sdc", "list", "--json")
        assert code == 0
        listed = json.loads(out)
        top = listed[0]
        assert (top["target"]["node_id"], top["target"]["gpu_uuid"]) == ("sweep-b", bad_gpu)
        assert (top["fails"], top["runs"], top["last_verdict"]) == (2, 2, "fail")
        assert top["suspicion"] == pytest.approx(6.0, abs=0.01)
        others = [g for g in listed[1:] if g["target"]["node_id"] != "sweep-b" or g["suspicion"] > 0]
        assert all(g["suspicion"] == 0 for g in others), listed
        code, table, _ = fleet.rasctl("sdc", "list")
        assert code == 0 and "SUSPICION" in table and bad_gpu in table.splitlines()[1]
