"""rasctl power against a live controller running the power loop and one simulated agent."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time

import pytest

from rasd.agent import runtime, spool
from rasd.agent.gpu import simulated
from rasd.cli import main as rasctl
from rasd.controller import server

pytestmark = pytest.mark.slow

TREE = {
    "name": "cluster",
    "budget_w": 2400,
    "rows": [{"name": "row-0", "racks": [{"name": "rack-0", "nodes": [{"name": "node-p", "budget_w": 2600}]}]}],
}


class Fleet:
    """A controller with a [power] table and one 4-GPU agent, on their own event loop in a thread."""

    def __init__(self, tmp_path, port):
        self.address = f"127.0.0.1:{port}"
        self.settings = server.ControllerSettings(
            listen=self.address,
            db_url=f"sqlite:///{tmp_path / 'rasd.db'}",
            metrics_port=None,
            power={"tree": TREE, "policy": {"control_period_s": 0.5, "command_ttl_s": 1.0}},
        )
        self.backend = simulated.SimulatedBackend(
            "node-p", 4, 3, workload=simulated.StepWorkload(period_s=1.0, anchor_unix_s=time.time())
        )
        self.ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self):
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.controller = server.Controller(self.settings)
        await self.controller.start()
        agent = runtime.Agent(
            runtime.NodeIdentity("node-p", "boot", "node-p"),
            self.backend,
            spool.Spool(":memory:"),
            runtime.LinkSettings(controller_address=self.address, telemetry_send_interval_ms=200),
        )
        task = asyncio.create_task(agent.run(self._stop))
        while "node-p" not in self.controller.ingest.sessions:
            await asyncio.sleep(0.05)
        self.ready.set()
        await self._stop.wait()
        await task
        await self.controller.stop()

    def __enter__(self):
        self._thread.start()
        assert self.ready.wait(30)
        return self

    def __exit__(self, *exc):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def rasctl_run(fleet, *argv):
    out, err = io.StringIO(), io.StringIO()
    code = rasctl.run(["--controller", fleet.address, *argv], out, err)
    return code, out.getvalue(), err.getvalue()


def wait_for(predicate, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def _caps(fleet) -> int:
    return sum(c.enforced_power_limit_w for c in fleet.backend.read_counters(1))


def test_power_status_budget_and_policy_through_rasctl(tmp_path, free_port):
    with Fleet(tmp_path, free_port) as fleet:
        # The loop brings the four 700 W defaults (2,800 W) under the 2,400 W cluster budget.
        wait_for(lambda: _caps(fleet) <= 2400)

        def status():
            code, out, _ = rasctl_run(fleet, "power", "status", "--json")
            data = json.loads(out) if code == 0 else {}
            return data if data.get("root", {}).get("allocated_w") else None

        data = wait_for(status)
        assert data["root"]["domain_id"] == "cluster" and data["root"]["budget_w"] == "2400"
        node = data["root"]["children"][0]["children"][0]["children"][0]
        assert node["domain_id"] == "node-p" and node["level"] == "node"

        code, table, _ = rasctl_run(fleet, "power", "status")
        assert code == 0
        assert "HEADROOM kW" in table and "      node-p" in table and "swing now:" in table

        code, out, _ = rasctl_run(fleet, "power", "budget", "set", "node-p", "1600", "--reason", "feed work")
        assert (code, out.strip()) == (0, "node node-p: 1600 W")
        wait_for(lambda: _caps(fleet) <= 1600, timeout_s=5)

        code, out, err = rasctl_run(fleet, "power", "budget", "set", "rack-9", "1000")
        assert code == 1 and "NOT_FOUND" in err
        code, out, err = rasctl_run(fleet, "power", "budget", "set", "node-p", "500")
        assert code == 1 and "INVALID_ARGUMENT" in err and "minimum caps" in err

        code, out, _ = rasctl_run(fleet, "power", "policy", "show")
        assert code == 0 and "control_period_s = 0.5" in out
        code, out, _ = rasctl_run(fleet, "power", "policy", "set", "swing_target_pct=10", "peak_cap_enabled=true")
        assert code == 0 and "swing_target_pct = 10.0" in out and "peak_cap_enabled = true" in out
        code, out, _ = rasctl_run(fleet, "power", "policy", "show", "--json")
        assert json.loads(out)["swing_target_pct"] == 10.0
        code, _, err = rasctl_run(fleet, "power", "policy", "set", "control_period_z=1")
        assert code == 1 and "control_period_z" in err
        code, _, err = rasctl_run(fleet, "power", "policy", "set", "oops")
        assert code == 2 and "KEY=VALUE" in err

        code, out, _ = rasctl_run(fleet, "audit", "--json")
        actions = [r["action"] for r in json.loads(out)]
        assert "set_power_budget" in actions and "set_power_policy" in actions
