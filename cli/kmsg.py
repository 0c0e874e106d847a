"""``rasctl kmsg classify``: read kernel log text, print one JSON object per detected event.

Operators paste any dmesg, ``journalctl -k`` or /dev/kmsg dump into it; lines that are not events
print nothing. It runs locally (no controller needed): the agent's parser (``rasd.agent.core.kmsg``)
finds the facts, and the controller's classifier (``rasd.controller.core.remediation.classify``) with
its default policy decides, so what it prints is what a controller would decide about each event on its
own. (A controller also folds an event with the others it has seen: a burst is one incident, and an IB
port that changes state often enough within ``ib_flap_window_s`` is a flap storm.)

Each output line is a JSON object with the keys ``kind`` (xid | fallen_off_bus | sxid | ib_link),
``xid``, ``pci``, ``pid``, ``process``, ``message``, ``severity``, ``recommended_action`` and
``mnemonic`` (NVIDIA's catalog name; "" for events that are not Xids), plus ``details`` holding
whatever else the message said (NVLink registers, recovery action, SXid number, IB port/state...) and
the classifier's ``component``, ``fault_key`` and ``reason``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TextIO

from rasd.agent.core import kmsg
from rasd.common import kernel_log, xid_catalog
from rasd.common.kernel_log import KernelEvent, KernelEventKind
from rasd.controller.core.remediation import classify, policy
from rasd.controller.core.remediation import events as health

_FALLEN_OFF_BUS_XID = 79
"""A fallen-off-the-bus message without an Xid is the fault of Xid 79; it shows that mnemonic."""


def classify_event(
    event: KernelEvent,
    catalog: xid_catalog.XidCatalog,
    classification_policy: policy.ClassificationPolicy | None = None,
) -> classify.Classification:
    """What the controller's classifier decides about one parsed event, alone.

    Args:
        event: a parsed event.
        catalog: NVIDIA's XID catalog with its NVLink5 decode sheet.
        classification_policy: the controller's thresholds; its defaults when None.

    Returns:
        The classification.
    """
    health_event = health.HealthEvent(
        node_id="rasctl",
        kind=kernel_log.event_kind(event),
        observed_at=0.0,
        gpu_uuid=event.gpu_uuid,
        xid=event.xid,
        message=event.message,
        source=kmsg.OBSERVATION_SOURCE,
        kernel_log=event,
    )
    return classify.classify(
        health_event,
        catalog=catalog,
        policy=classification_policy or policy.ClassificationPolicy(),
        ib_state_changes_in_window=1,  # this event; the controller counts the port's others too
    )


def event_record(
    event: KernelEvent, classification: classify.Classification, catalog: xid_catalog.XidCatalog
) -> dict[str, object]:
    """The JSON object printed for one event.

    Args:
        event: the parsed event.
        classification: ``classify_event(event, catalog)``.
        catalog: NVIDIA's XID catalog, for the mnemonic.

    Returns:
        A JSON-serialisable dict with the documented keys first.
    """
    xid = _FALLEN_OFF_BUS_XID if event.kind is KernelEventKind.FALLEN_OFF_BUS else event.xid
    entry = catalog.get(xid) if xid is not None else None
    facts = kernel_log.facts(event)
    for key in ("pci", "pid", "process"):
        facts.pop(key, None)  # top-level keys
    details: dict[str, object] = {
        **({"gpu_uuid": event.gpu_uuid} if event.gpu_uuid else {}),
        **facts,
        "component": classification.component.value,
        "fault_key": classification.fault_key,
        "reason": classification.reason,
    }
    return {
        "kind": event.kind.value,
        "xid": event.xid,
        "pci": event.pci,
        "pid": event.pid,
        "process": event.process,
        "message": event.message,
        "severity": classification.severity.name.lower(),
        "recommended_action": classification.action.value,
        "mnemonic": entry.mnemonic if entry is not None else "",
        "details": details,
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
    parser = kmsg.KmsgParser()
    count = 0
    for line in lines:
        for event in parser.feed(line):
            record = event_record(event, classify_event(event, catalog), catalog)
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count
