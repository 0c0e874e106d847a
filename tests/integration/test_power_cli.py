"""rasctl power against a live controller running the power loop and one simulated agent."""

from __future__ import annotations

import json
import time

import fleetlib
from fleetlib import wait_for

from rasd.agent.gpu import simulated

TREE = {
    "name": "cluster",
    "budget_w": 2400,
    "rows": [{"name": "row-0", "racks": [{"name": "rack-0", "nodes": [{"name": "node-p", "budget_w": 2600}]}]}],
}


def power_fleet(tmp_path, port) -> fleetlib.ThreadedFleet:
    """A controller with a [power] table and one 4-GPU agent stepping at 1 s."""
    settings = fleetlib.sqlite_settings(
        tmp_path, port, power={"tree": TREE, "policy": {"control_period_s": 0.5, "command_ttl_s": 1.0}}
    )
    backend = simulated.SimulatedBackend(
        "node-p", 4, 3, workload=simulated.StepWorkload(period_s=1.0, anchor_unix_s=time.time())
    )
    return fleetlib.ThreadedFleet(settings, {"node-p": fleetlib.Node(backend, node_ops=False)})


def _caps(fleet) -> int:
    return sum(c.enforced_power_limit_w for c in fleet.backend.read_counters(1))


def test_power_status_budget_and_policy_through_rasctl(tmp_path, free_port):
    with power_fleet(tmp_path, free_port) as fleet:
        # The loop brings the four 700 W defaults (2,800 W) under the 2,400 W cluster budget.
        wait_for(lambda: _caps(fleet) <= 2400)

        def status():
            code, out, _ = fleet.rasctl("power", "status", "--json")
            data = json.loads(out) if code == 0 else {}
            return data if data.get("root", {}).get("allocated_w") else None

        data = wait_for(status)
        assert data["root"]["domain_id"] == "cluster" and data["root"]["budget_w"] == "2400"
        node = data["root"]["children"][0]["children"][0]["children"][0]
        assert node["domain_id"] == "node-p" and node["level"] == "node"

        code, table, _ = fleet.rasctl("power", "status")
        assert code == 0
        assert "HEADROOM kW" in table and "      node-p" in table and "swing now:" in table

        code, out, _ = fleet.rasctl("power", "budget", "set", "node-p", "1600", "--reason", "feed work")
        assert (code, out.strip()) == (0, "node node-p: 1600 W")
        wait_for(lambda: _caps(fleet) <= 1600, timeout_s=5)

        code, out, err = fleet.rasctl("power", "budget", "set", "rack-9", "1000")
        assert code == 1 and "NOT_FOUND" in err
        code, out, err = fleet.rasctl("power", "budget", "set", "node-p", "500")
        assert code == 1 and "INVALID_ARGUMENT" in err and "minimum caps" in err

        code, out, _ = fleet.rasctl("power", "policy", "show")
        assert code == 0 and "control_period_s = 0.5" in out
        code, out, _ = fleet.rasctl("power", "policy", "set", "swing_target_pct=10", "peak_cap_enabled=true")
        assert code == 0 and "swing_target_pct = 10.0" in out and "peak_cap_enabled = true" in out
        code, out, _ = fleet.rasctl("power", "policy", "show", "--json")
        assert json.loads(out)["swing_target_pct"] == 10.0
        code, _, err = fleet.rasctl("power", "policy", "set", "control_period_z=1")
        assert code == 1 and "control_period_z" in err
        code, out, _ = fleet.rasctl("power", "policy", "set", "job_start_ramp_enabled=true", "job_start_cap_w=250")
        assert code == 0 and "job_start_ramp_enabled = true" in out and "job_start_cap_w = 250.0" in out
        code, _, err = fleet.rasctl("power", "policy", "set", "job_start_cap_w=0")
        assert code == 1 and "job_start_cap_w" in err
        # The start-smoothing knobs show and set like any other (the CLI iterates the policy).
        code, out, _ = fleet.rasctl("power", "policy", "set", "job_start_canary_gpus=4",
                                    "job_start_smoothing_release_s=12")  # fmt: skip
        assert code == 0 and "job_start_canary_gpus = 4.0" in out and "job_start_smoothing_release_s = 12.0" in out
        assert "job_start_smoothing_enabled = true" in out
        code, _, err = fleet.rasctl("power", "policy", "set", "job_start_canary_gpus=2.5")
        assert code == 1 and "job_start_canary_gpus" in err
        code, _, err = fleet.rasctl("power", "policy", "set", "oops")
        assert code == 2 and "KEY=VALUE" in err

        code, out, _ = fleet.rasctl("audit", "--json")
        actions = [r["action"] for r in json.loads(out)]
        assert "set_power_budget" in actions and "set_power_policy" in actions
