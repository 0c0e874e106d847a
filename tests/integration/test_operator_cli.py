"""The operator's view of a repair, through rasctl against a live controller and agent.

One story: an Xid 48 is repaired automatically, an operator quarantines and force-releases a GPU,
accuses another of SDC (the accusation suite fails it and an RMA opens), approves the RMA, pauses
and resumes automation, and reads it all back from the audit log.
"""

from __future__ import annotations

import json
import time

import fleetlib
from fleetlib import wait_for

from rasd.agent.gpu import simulated


def operator_fleet(tmp_path, port) -> fleetlib.ThreadedFleet:
    """A controller and one 4-GPU agent whose repairs really run (simulated)."""
    backend = simulated.SimulatedBackend("node-op", 4, 3, workload=simulated.StepWorkload())
    return fleetlib.ThreadedFleet(
        fleetlib.sqlite_settings(tmp_path, port), {"node-op": fleetlib.Node(backend, {"rack": "r1"})}
    )


def test_operator_story(tmp_path, free_port):
    with operator_fleet(tmp_path, free_port) as fleet:
        gpus = [g.uuid for g in fleet.backend.inventory()]
        fleet.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=0, xid=48))

        def repaired():
            code, out, _ = fleet.rasctl("repairs", "--json")
            return code == 0 and [r for r in json.loads(out) if r["state"] == "watching"]

        (repair,) = wait_for(repaired)
        assert repair["rung"] == "reset_gpu" and repair["target"]["gpu_uuid"] == gpus[0]
        code, out, _ = fleet.rasctl("incidents")
        assert code == 0 and "xid:48" in out
        code, out, _ = fleet.rasctl("node", "node-op")
        assert code == 0 and "repair ladder:" in out and "watching" in out

        # Manual quarantine: refused release without validation, then a forced (audited) one.
        assert fleet.rasctl("quarantine", f"node-op/{gpus[1]}", "--reason", "fan noise")[0] == 0
        code, _, err = fleet.rasctl("quarantine", f"node-op/{gpus[1]}", "--reason", "again")
        assert code == 1 and "already quarantined" in err
        code, _, err = fleet.rasctl("release", f"node-op/{gpus[1]}")
        assert code == 1 and "no passing validation" in err
        code, out, _ = fleet.rasctl("release", f"node-op/{gpus[1]}", "--force", "--reason", "ticket 123")
        assert code == 0 and "healthy" in out

        # SDC: the accused GPU fails the accusation suite and an RMA opens; approve it.
        fleet.fire(simulated.ScriptedFault(at_s=0, kind="sdc", gpu=2))
        time.sleep(0.3)
        assert fleet.rasctl("sdc", "accuse", f"node-op/{gpus[2]}", "--reason", "loss spike")[0] == 0

        def rma_open():
            code, out, _ = fleet.rasctl("rma", "list", "--json")
            return code == 0 and json.loads(out)

        (rma,) = wait_for(rma_open)
        assert rma["target"]["gpu_uuid"] == gpus[2] and rma["state"] == "pending"
        # The alert rules' queues (deploy/prometheus/rasd-rules.yaml): one ticket waits, one GPU is suspect.
        registry = fleet.controller.registry
        assert registry.get_sample_value("rasd_rma_pending") == 1
        assert registry.get_sample_value("rasd_sdc_suspects") == 1
        assert rma["gpus_per_technician_hour"] == 0.5
        code, out, _ = fleet.rasctl("rma", "show", rma["rma_id"])
        assert code == 0 and "evidence_json" in out
        assert fleet.rasctl("rma", "approve", rma["rma_id"])[0] == 0
        assert registry.get_sample_value("rasd_rma_pending") == 0
        code, _, err = fleet.rasctl("rma", "approve", rma["rma_id"])
        assert code == 1 and "not pending" in err
        code, out, _ = fleet.rasctl("validations")
        assert code == 0 and "fail" in out

        # Automation pause and resume, then the audit trail of everything above.
        assert fleet.rasctl("automation", "status") == (0, "automation running\n", "")
        code, out, _ = fleet.rasctl("automation", "pause", "--reason", "maintenance window")
        assert code == 0 and "paused" in out
        # Read only, from the store: status says who paused and why, and changes nothing.
        for _ in range(2):
            code, out, _ = fleet.rasctl("automation", "status")
            assert (code, out) == (0, "automation paused by an operator: maintenance window\n")
        code, out, _ = fleet.rasctl("automation", "status", "--json")
        assert json.loads(out) == {
            "paused": True,
            "breaker_tripped": False,
            "reason": "maintenance window",
            "since_unix_ns": "0",
        }
        code, out, _ = fleet.rasctl("automation", "resume")
        assert code == 0 and "running" in out
        assert fleet.rasctl("automation", "status")[:2] == (0, "automation running\n")
        code, out, _ = fleet.rasctl("audit", "--json", "--limit", "200")
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
        code, _, err = fleet.rasctl("quarantine", "nosuchnode", "--reason", "x")
        assert code == 1 and "never connected" in err
        code, _, err = fleet.rasctl("quarantine", "node-op/GPU-nope", "--reason", "x")
        assert code == 1 and "is not a GPU of node-op" in err


def test_a_repair_leaves_an_operators_quarantine_of_the_node_in_place(tmp_path, free_port):
    """An operator took the node out by hand; a GPU's reboot that passes validation does not put it back."""
    with operator_fleet(tmp_path, free_port) as fleet:
        assert fleet.rasctl("quarantine", "node-op", "--reason", "optics swap booked")[0] == 0
        fleet.fire(simulated.ScriptedFault(at_s=0, kind="xid", gpu=0, xid=79))

        def repaired():
            code, out, _ = fleet.rasctl("repairs", "--json")
            return code == 0 and [r for r in json.loads(out) if r["state"] == "watching"]

        (repair,) = wait_for(repaired)
        assert repair["rung"] == "reboot_node"
        assert "node stays quarantined, held by operator" in repair["reason"]
        code, out, _ = fleet.rasctl("node", "node-op", "--json")
        assert code == 0
        assert [(q["target"]["gpu_uuid"], q["reason"]) for q in json.loads(out)["quarantines"]] == [
            ("", "optics swap booked")
        ]
        # The repair's validation counts for the operator's release; their hold was the last.
        code, out, err = fleet.rasctl("release", "node-op", "--reason", "optics swapped")
        assert code == 0, err
        code, out, _ = fleet.rasctl("node", "node-op", "--json")
        assert code == 0 and json.loads(out)["quarantines"] == []
