"""NVLink5 Xids end to end: kernel log line → agent facts → gRPC → controller decode → the ladder's rung.

An agent follows a kernel-log file; two real Xid 144-150 lines (tests/fixtures/kmsg/kmsg_records.txt,
from gpud PRs #1160 and #1174, their PCI addresses set to this node's GPUs) are written into it. The
agent sends only what they say; the controller decodes their registers with NVIDIA's "XID 144-150
Decode" sheet (common/data/nvidia-xid-nvlink5-decode.csv):

- Xid 149 NETIR_LINK_EVT Fatal, IntrInfo 0x025001c6, ErrorStatus 0: RESET_GPU. An incident xid:149 on
  GPU 0 and a repair at the reset_gpu rung, whose history gives the decode as the reason.
- Xid 145 RLW_RXPIPE Nonfatal, IntrInfo 0x0409a0c2, ErrorStatus 0x8: IGNORE. Nothing to repair, where
  the catalog's default for Xid 145 (WORKFLOW_NVLINK5_ERR) would have reset GPU 1.
"""

from __future__ import annotations

import json

import fleetlib
import pytest
from fleetlib import wait_for

from rasd.agent.gpu import simulated

pytestmark = pytest.mark.slow

XID_145_GPU1 = (
    "4,1204,2201000300,-;NVRM: Xid (PCI:0000:28:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 "
    "(0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)"
)
XID_149_GPU0 = (
    "4,1205,2201000400,-;NVRM: Xid (PCI:0000:18:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 "
    "(0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)


def test_an_nvlink5_xid_in_the_kernel_log_is_decoded_into_its_repair(tmp_path, free_port):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    backend = simulated.SimulatedBackend("node-nvl", 2, 5, workload=simulated.StepWorkload())
    # Repairs answer DRY_RUN: the ticket stays at the rung the decode chose (a real reset would be refused
    # while the workload runs, and the ladder would climb on).
    node = fleetlib.Node(backend, {"rack": "r1"}, node_ops=False, kmsg_path=kmsg)
    with fleetlib.ThreadedFleet(fleetlib.sqlite_settings(tmp_path, free_port), {"node-nvl": node}) as fleet:
        gpus = [g.uuid for g in backend.inventory()]
        with kmsg.open("a") as f:
            f.write(XID_145_GPU1 + "\n" + XID_149_GPU0 + "\n")

        def repair_of_gpu0():
            code, out, _ = fleet.rasctl("repairs", "--json")
            return code == 0 and [r for r in json.loads(out) if r["target"]["gpu_uuid"] == gpus[0]]

        (repair,) = wait_for(repair_of_gpu0, timeout_s=30)
        assert repair["rung"] == "reset_gpu"
        decode = (
            "Xid 149 NETIR_LINK_EVT (Link Fatal, V1 registers): NVIDIA's NVLink5 decode bucket RESET_GPU → reset_gpu"
        )
        assert any(decode in step["reason"] for step in repair["steps"]), repair["steps"]

        code, out, _ = fleet.rasctl("incidents", "--json")
        assert code == 0
        incidents = json.loads(out)
        assert [(i["target"]["gpu_uuid"], i["cause"]) for i in incidents] == [(gpus[0], "xid:149")]
        assert repair["incident_id"] == incidents[0]["incident_id"]

        # Both events were stored with the facts the agent read, and the Xid 145 opened nothing:
        # its decode says IGNORE.
        code, out, _ = fleet.rasctl("events", "--json")
        assert code == 0
        by_xid = {e["event"]["xid"]: e["event"] for e in json.loads(out)}
        assert by_xid[145]["gpu_uuid"] == gpus[1]
        assert by_xid[145]["attributes"]["registers"].startswith("0x0409a0c2 0x00000008")
        assert by_xid[145]["attributes"]["nvlink_subcode"] == "RLW_RXPIPE"
        assert by_xid[149]["severity"] == "SEVERITY_UNSPECIFIED"  # the agent rated nothing
