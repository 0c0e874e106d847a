"""``rasctl kmsg classify``: kernel log text in, one JSON object per event out, as the controller decides."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rasd.agent.core.kmsg import KmsgParser
from rasd.cli.kmsg import classify_event, classify_stream
from rasd.common import xid_catalog

FIXTURES = Path(__file__).parents[2] / "fixtures" / "kmsg"
CATALOG = xid_catalog.load_catalog()
KEYS = ["kind", "xid", "pci", "pid", "process", "message", "severity", "recommended_action", "mnemonic"]


def run(text: str) -> tuple[int, list[dict]]:
    out = io.StringIO()
    count = classify_stream(io.StringIO(text), out)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert count == len(records)
    return count, records


def test_a_pasted_dmesg_dump():
    count, records = run((FIXTURES / "dmesg_fallen_off_bus.txt").read_text())
    assert count == 4
    first = records[0]
    assert list(first)[: len(KEYS)] == KEYS
    assert {k: first[k] for k in KEYS} == {
        "kind": "xid",
        "xid": 79,
        "pci": "0000:91:00.0",
        "pid": None,
        "process": None,
        "message": "GPU has fallen off the bus.",
        "severity": "fatal",
        "recommended_action": "reboot_node",
        "mnemonic": "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
    }
    assert first["details"]["gpu_uuid"] == "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"
    assert [r["kind"] for r in records] == ["xid", "fallen_off_bus", "sxid", "sxid"]
    assert records[1]["xid"] is None
    assert records[2]["details"]["sxid"] == 20034


def test_every_kind_and_the_process_fields():
    text = "\n".join(
        [
            "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, "
            "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
            "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt",
            "Feb 14 05:03:41 gpu-1 kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN",
        ]
    )
    _, (xid, sxid, ib) = run(text)
    assert (xid["pid"], xid["process"], xid["recommended_action"]) == (1797828, "pt_main_thread", "reset_gpu")
    assert (sxid["kind"], sxid["severity"], sxid["mnemonic"]) == ("sxid", "warning", "")
    assert (ib["kind"], ib["pci"], ib["details"]["ib_device"], ib["details"]["ib_port"]) == (
        "ib_link",
        "0000:ab:00.0",
        "mlx5_5",
        1,
    )
    assert ib["details"]["ib_state"] == "DOWN"


def test_xid_154_and_nvlink5_details():
    _, records = run((FIXTURES / "kmsg_records.txt").read_text())
    by_xid = {r["xid"]: r for r in records if r["kind"] == "xid"}
    assert by_xid[154]["details"]["recovery_action"] == "NODE_REBOOT"  # the last 154 wins the dict
    assert by_xid[154]["recommended_action"] == "reboot_node"
    assert by_xid[144]["details"]["registers"][:2] == ["0x00000001", "0x00000008"]
    assert by_xid[144]["severity"] == "info"
    assert "NVLink5 decode" in by_xid[144]["details"]["reason"]


def test_lines_that_are_not_events_print_nothing():
    out = io.StringIO()
    assert classify_stream((FIXTURES / "noise.txt").read_text().splitlines(keepends=True), out) == 0
    assert out.getvalue() == ""
    assert classify_stream([], out) == 0


def test_output_is_one_json_object_per_line_even_for_odd_text():
    out = io.StringIO()
    classify_stream(['NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a"b\\c, caf\u00e9\tdone\n'], out)
    (line,) = out.getvalue().splitlines()
    record = json.loads(line)
    assert record["process"] == 'a"b\\c'
    assert record["message"] == "caf\u00e9\tdone"


def test_works_on_stdin_in_a_subprocess():
    # What `rasctl kmsg classify < dmesg.txt` does once cli/main.py wires the subcommand.
    code = "import sys; from rasd.cli.kmsg import classify_stream; classify_stream(sys.stdin, sys.stdout)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=(FIXTURES / "dmesg_probe_fallen_off.txt").read_text(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    (record,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert (record["kind"], record["pci"], record["recommended_action"]) == (
        "fallen_off_bus",
        "0000:b3:00.0",
        "reboot_node",
    )


XID_149 = (
    "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 "
    "(0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)


@pytest.mark.parametrize(
    ("line", "severity", "action", "mnemonic"),
    [
        (
            "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            "fatal",
            "reboot_node",
            "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        ),
        (
            "NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, "
            "errorString CTX SWITCH TIMEOUT, Info 0x58005",
            "fatal",
            "reset_gpu",
            "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
        ),
        (
            "NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=p, Ch 1 caused by previous Xid 149",
            "warning",
            "none",
            "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        ),
        (
            "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
            "fatal",
            "reboot_node",
            "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        ),
        (
            "NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x0 (None) "
            "to 0x2 (Node Reboot Required)",
            "fatal",
            "reboot_node",
            "GPU_RECOVERY_ACTION_CHANGED",
        ),
        (
            "NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) "
            "to 0x0 (None)",
            "info",
            "none",
            "GPU_RECOVERY_ACTION_CHANGED",
        ),
        (XID_149, "fatal", "reset_gpu", "NVLINK_NETIR_ERROR"),
        (
            "NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 "
            "(0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)",
            "info",
            "none",
            "NVLINK_SAW_ERROR",
        ),
        ("NVRM: Xid (PCI:0000:01:00): 149, garbled", "fatal", "reset_gpu", "NVLINK_NETIR_ERROR"),  # catalog default
        ("NVRM: Xid (PCI:0000:01:00): 4242, unknown code", "warning", "investigate", ""),
        # The controller's rules for what follows (the agent's own classifier, before there was one
        # classifier, said reboot_node / none for the SXids and investigate for the port going DOWN):
        # an SXid is a person's look at the switch tray, at ERROR when the driver says "Fatal"...
        ("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up", "error", "investigate", ""),
        (
            "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt",
            "warning",
            "investigate",
            "",
        ),
        # ... and one IB port state change alone is below the flap limit.
        ("mlx5_core 0000:0a:00.0 mlx5_0: Port: 1 Link DOWN", "info", "none", ""),
        ("mlx5_core 0000:0a:00.0 mlx5_0: Port: 1 Link ACTIVE", "info", "none", ""),
    ],
)
def test_each_line_gets_the_controllers_classification(line, severity, action, mnemonic):
    (record,) = run(line)[1]
    assert (record["severity"], record["recommended_action"], record["mnemonic"]) == (severity, action, mnemonic)
    assert record["details"]["reason"]
    (event,) = KmsgParser().feed(line)
    classification = classify_event(event, CATALOG)
    assert (classification.severity.name.lower(), classification.action.value) == (severity, action)


def test_the_nvlink5_decode_decides_and_says_so():
    _, (record,) = run(XID_149)
    assert record["details"]["registers"][:2] == ["0x025001c6", "0x00000000"]
    assert record["details"]["reason"] == (
        "Xid 149 NETIR_LINK_EVT (Link Fatal, V1 registers): NVIDIA's NVLink5 decode bucket RESET_GPU → reset_gpu"
    )
    assert (record["details"]["component"], record["details"]["fault_key"]) == ("nvlink", "xid:149")
