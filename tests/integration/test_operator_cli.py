"""The operator's view of a repair, through rasctl against a live controller and agent.

One story: an Xid 48 is repaired automatically, an operator quarantines and force-releases a GPU,
accuses another of SDC (the accusation suite fails it and an RMA opens), approves the RMA, pauses
and resumes automation, and reads it all back from the audit log.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time

import pytest

from rasd.agent import actions, node_ops, runtime, spool
from rasd.agent.gpu import simulated
from rasd.cli import main as rasctl
from rasd.controller import server

pytestmark = pytest.mark.slow


class Fleet:
    """A controller and one agent on their own event loop in a thread."""

    def __init__(self, tmp_path, port):
        self.address = f"127.0.0.1:{port}"
        self.settings = server.ControllerSettings(
            listen=self.address, db_url=f"sqlite:///{tmp_path / 'rasd.db'}", metrics_port=None
        )
        self.backend = simulated.SimulatedBackend("node-op", 4, 3, workload=simulated.StepWorkload())
        self.ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self):
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.controller = server.Controller(self.settings)
        await self.controller.start()
        agent = runtime.Agent(
            runtime.NodeIdentity("node-op", "boot", "node-op", {"rack": "r1"}),
            self.backend,
            spool.Spool(":memory:"),
            runtime.LinkSettings(controller_address=self.address, telemetry_send_interval_ms=200),
            ops=node_ops.SimulatedNodeOps(self.backend),
            action_settings=actions.ActionSettings(destructive_enabled=True, kill_poll_s=0.0),
        )
        task = asyncio.create_task(agent.run(self._stop))
        while "node-op" not in self.controller.ingest.sessions:
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

    def fire(self, fault):
        self._loop.call_soon_threadsafe(self.backend.fire, fault, time.time_ns())


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


def test_operator_story(tmp_path, free_port):
    with Fleet(tmp_path, free_port) as fleet:
        gpus = [g.uuid for g in fleet.backend.inventory()]
        fleet.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=0, xid=48))

        def repaired():
            code, out, _ = rasctl_run(fleet, "repairs", "--json")
            return code == 0 and [r for r in json.loads(out) if r["state"] == "watching"]

        (repair,) = wait_for(repaired)
        assert repair["rung"] == "reset_gpu" and repair["target"]["gpu_uuid"] == gpus[0]
        code, out, _ = rasctl_run(fleet, "incidents")
        assert code == 0 and "xid:48" in out
        code, out, _ = rasctl_run(fleet, "node", "node-op")
        assert code == 0 and "repair ladder:" in out and "watching" in out

        # Manual quarantine: refused release without validation, then a forced (audited) one.
        assert rasctl_run(fleet, "quarantine", f"node-op/{gpus[1]}", "--reason", "fan noise")[0] == 0
        code, _, err = rasctl_run(fleet, "quarantine", f"node-op/{gpus[1]}", "--reason", "again")
        assert code == 1 and "already quarantined" in err
        code, _, err = rasctl_run(fleet, "release", f"node-op/{gpus[1]}")
        assert code == 1 and "no passing validation" in err
        code, out, _ = rasctl_run(fleet, "release", f"node-op/{gpus[1]}", "--force", "--reason", "ticket 123")
        assert code == 0 and "healthy" in out

        # SDC: the accused GPU fails the accusation suite and an RMA opens; approve it.
        fleet.fire(simulated.ScriptedFault(at_s=0, kind="sdc", gpu=2))
        time.sleep(0.3)
        assert rasctl_run(fleet, "sdc", "accuse", f"node-op/{gpus[2]}", "--reason", "loss spike")[0] == 0

        def rma_open():
            code, out, _ = rasctl_run(fleet, "rma", "list", "--json")
            return code == 0 and json.loads(out)

        (rma,) = wait_for(rma_open)
        assert rma["target"]["gpu_uuid"] == gpus[2] and rma["state"] == "pending"
        assert rma["gpus_per_technician_hour"] == 0.5
        code, out, _ = rasctl_run(fleet, "rma", "show", rma["rma_id"])
        assert code == 0 and "evidence_json" in out
        assert rasctl_run(fleet, "rma", "approve", rma["rma_id"])[0] == 0
        code, _, err = rasctl_run(fleet, "rma", "approve", rma["rma_id"])
        assert code == 1 and "not pending" in err
        code, out, _ = rasctl_run(fleet, "validations")
        assert code == 0 and "fail" in out

        # Automation pause and resume, then the audit trail of everything above.
        code, out, _ = rasctl_run(fleet, "automation", "pause", "--reason", "maintenance window")
        assert code == 0 and "paused" in out
        code, out, _ = rasctl_run(fleet, "automation", "resume")
        assert code == 0 and "running" in out
        code, out, _ = rasctl_run(fleet, "audit", "--json", "--limit", "200")
        actions_seen = {(r["actor"], r["action"]) for r in json.loads(out)}
        # A plaintext controller's callers are "anonymous"; tests/integration/test_security.py checks
        # that over mTLS the actor is the caller's certificate or token.
        for expected in [
            ("anonymous", "quarantine_gpu"),
            ("anonymous", "release"),
            ("anonymous", "accuse_sdc"),
            ("anonymous", "approve_rma"),
            ("anonymous", "pause"),
            ("anonymous", "resume"),
            ("automation", "reset_gpu"),
            ("automation", "open_rma"),
        ]:
            assert expected in actions_seen, expected

        # Bad input is named and changes nothing.
        code, _, err = rasctl_run(fleet, "quarantine", "nosuchnode", "--reason", "x")
        assert code == 1 and "never connected" in err
        code, _, err = rasctl_run(fleet, "quarantine", "node-op/GPU-nope", "--reason", "x")
        assert code == 1 and "is not a GPU of node-op" in err
