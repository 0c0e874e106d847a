"""``rasctl kmsg classify``: read kernel log text, print one JSON object per detected event.

Operators paste any dmesg, ``journalctl -k`` or /dev/kmsg dump into it; lines that are not events
print nothing. It runs locally (no controller needed) with the same parser and classification the
agent uses (``rasd.agent.kmsg``), so what it prints is what the agent would report.

Each output line is a JSON object with the keys ``kind`` (xid | fallen_off_bus | sxid | ib_link),
``xid``, ``pci``, ``pid``, ``process``, ``message``, ``severity``, ``recommended_action`` and
``mnemonic`` (NVIDIA's catalog name; "" for events that are not Xids), plus ``details`` holding
whatever else the message said (NVLink registers, recovery action, SXid number, IB port/state...).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TextIO

from rasd.agent import kmsg
from rasd.common import xid_catalog


def event_record(event: kmsg.KernelEvent, classification: kmsg.Classification) -> dict[str, object]:
    """The JSON object printed for one event.

    Args:
        event: the parsed event.
        classification: ``kmsg.classify(event)``.

    Returns:
        A JSON-serialisable dict with the documented keys first.
    """
    details: dict[str, object] = {
        "gpu_uuid": event.gpu_uuid or None,
        "kernel_time_us": event.kernel_time_us,
        "gpu_instance": event.gpu_instance,
        "compute_instance": event.compute_instance,
        "nvlink": event.nvlink,
        "nvlink_subcode": event.nvlink_subcode or None,
        "nvlink_fatal": event.nvlink_fatal,
        "registers": [f"0x{r:08x}" for r in event.registers] or None,
        "recovery_action": event.recovery_action.name if event.recovery_action is not None else None,
        "previous_recovery_action": (
            event.previous_recovery_action.name if event.previous_recovery_action is not None else None
        ),
        "sxid": event.sxid,
        "sxid_fatal": event.sxid_fatal,
        "nvswitch": event.nvswitch or None,
        "ib_device": event.ib_device or None,
        "ib_port": event.ib_port,
        "ib_state": event.ib_state or None,
        "reason": classification.reason,
    }
    return {
        "kind": event.kind.value,
        "xid": event.xid,
        "pci": event.pci,
        "pid": event.pid,
        "process": event.process,
        "message": event.message,
        "severity": classification.severity,
        "recommended_action": classification.recommended_action,
        "mnemonic": classification.mnemonic,
        "details": {k: v for k, v in details.items() if v is not None},
    }


def classify_stream(lines: Iterable[str], out: TextIO) -> int:
    """Parse ``lines`` and write one JSON object per event to ``out``.

    Args:
        lines: kernel log text, one line per item (e.g. ``sys.stdin``).
        out: where the JSON lines go.

    Returns:
        The number of events written.
    """
    catalog = xid_catalog.load_catalog()
    rules = xid_catalog.load_nvlink5_rules()
    parser = kmsg.KmsgParser()
    count = 0
    for line in lines:
        for event in parser.feed(line):
            record = event_record(event, kmsg.classify(event, catalog, rules))
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count
