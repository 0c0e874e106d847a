"""Spooled events go out in a form the controller accepts, whatever GPU they were spooled about."""

from __future__ import annotations

import dataclasses

import pytest

from rasd.agent import wire
from rasd.agent.core import kmsg, model
from rasd.api.v1 import health_pb2 as health_pb
from rasd.common import xid_catalog
from rasd.controller.core.remediation import classify, policy
from rasd.controller.core.remediation import events as health
from rasd.controller.rpc import validate_input
from rasd.controller.wire import agent as controller_wire

PRESENT = "GPU-00000000-0000-4000-8000-000000000001"
GONE = "GPU-00000000-0000-4000-8000-000000000002"
"""Fell off the bus before the agent restarted: NVML no longer enumerates it, the Hello omits it."""


def _spooled(seq: int, gpu_uuid: str, attributes: dict[str, str] | None = None) -> model.SpooledEvent:
    return model.SpooledEvent(
        seq,
        model.Observation(
            model.EventKind.FALLEN_OFF_BUS,
            1_000,
            "GPU has fallen off the bus",
            "kmsg",
            gpu_uuid=gpu_uuid,
            xid=79,
            severity=model.Severity.FATAL,
            attributes=attributes or {},
        ),
    )


def test_an_event_about_a_gpu_not_announced_goes_out_about_the_node_naming_the_gpu():
    batch = wire.events([_spooled(1, GONE, {"pid": "7"}), _spooled(2, PRESENT)], frozenset({PRESENT})).events.events

    assert batch[0].gpu_uuid == ""
    assert dict(batch[0].attributes) == {wire.UNANNOUNCED_GPU_ATTRIBUTE: GONE, "pid": "7"}
    assert (batch[0].seq, batch[0].xid, batch[0].severity) == (1, 79, int(model.Severity.FATAL))
    assert batch[1].gpu_uuid == PRESENT
    assert dict(batch[1].attributes) == {}


def test_the_gpu_attribute_survives_the_cut_to_the_attribute_limit():
    crowded = {f"key-{i:03d}": "v" for i in range(wire.MAX_ATTRIBUTES)}

    (event,) = wire.events([_spooled(1, GONE, crowded)], frozenset({PRESENT})).events.events

    assert len(event.attributes) == wire.MAX_ATTRIBUTES
    assert event.attributes[wire.UNANNOUNCED_GPU_ATTRIBUTE] == GONE


XID_149 = (
    "NVRM: Xid (PCI:0000:18:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 "
    "(0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)


def _kernel_event(line: str, seq: int = 1) -> model.SpooledEvent:
    (event,) = kmsg.KmsgParser().feed(line)
    return model.SpooledEvent(seq, dataclasses.replace(kmsg.to_observation(event, 1_000), gpu_uuid=PRESENT))


def test_a_kernel_event_goes_out_as_typed_facts_and_no_rating():
    (sent,) = wire.events([_kernel_event(XID_149)], frozenset({PRESENT})).events.events

    assert (sent.kind, sent.xid, sent.severity) == (health_pb.EVENT_KIND_XID, 149, health_pb.SEVERITY_UNSPECIFIED)
    assert dict(sent.attributes) == {}
    facts = sent.kernel_log
    assert list(facts.nvlink_registers) == [0x025001C6, 0, 0, 0, 0, 0]
    assert (facts.nvlink_subcode, facts.nvlink_fatal, facts.nvlink, facts.pci_bus_id) == (
        "NETIR_LINK_EVT",
        True,
        0,
        "0000:18:00.0",
    )
    assert facts.raw == XID_149
    assert not facts.HasField("pid") and not facts.HasField("sxid")


def test_numbers_the_wire_cannot_hold_are_left_out_rather_than_refused():
    line = "NVRM: Xid (PCI:0000:18:00): 13, pid=9999999999, name=p, Graphics Exception"
    (event,) = kmsg.KmsgParser().feed(line)
    huge = dataclasses.replace(event, registers=(2**40, 1), kernel_time_us=2**64)
    facts = wire.kernel_log_to_wire(huge)
    assert facts.pid == 9999999999
    assert not facts.HasField("kernel_time_us")
    assert list(facts.nvlink_registers) == []  # all or none: a register's meaning is its position


def test_the_controller_stores_the_facts_in_the_text_form_its_classifier_reads():
    batch = wire.events([_kernel_event(XID_149)], frozenset({PRESENT})).events
    validate_input.check_events(batch, validate_input.StreamIdentity(None, {}), validate_input.InputLimits())
    (stored,) = controller_wire.events_from_wire(batch, frozenset({PRESENT}), 5, "node-k")

    assert stored.attributes["kernel_event"] == "xid"
    assert stored.attributes["registers"].startswith("0x025001c6 0x00000000")
    event = health.HealthEvent(
        node_id="node-k", kind=health.EventKind(stored.kind), observed_at=0.0, gpu_uuid=stored.gpu_uuid,
        xid=stored.xid, message=stored.message, attributes=stored.attributes,
    )  # fmt: skip
    facts = health.kernel_log_of(event)
    assert facts is not None and facts.registers[:2] == (0x025001C6, 0) and facts.nvlink_subcode == "NETIR_LINK_EVT"
    result = classify.classify(event, catalog=xid_catalog.load_catalog(), policy=policy.ClassificationPolicy())
    assert "NVLink5 decode bucket RESET_GPU" in result.reason


@pytest.mark.parametrize(
    "line",
    [
        "[   49.261458] NVRM: GPU at 0000:18:00.0 has fallen off the bus.",  # older drivers, no Xid
        "<4>NVRM: GPU at 0000:18:00.0 has fallen off the bus.",
        "Dec  4 10:00:00 gpu-node-03 kernel: NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    ],
)
def test_a_gpu_lost_from_the_bus_without_an_xid_reaches_the_controller_as_a_reboot(line):
    """Issue #37 item 7: the facts of a fallen-off-bus line without an Xid number become a reboot decision."""
    batch = wire.events([_kernel_event(line)], frozenset({PRESENT})).events
    validate_input.check_events(batch, validate_input.StreamIdentity(None, {}), validate_input.InputLimits())
    (stored,) = controller_wire.events_from_wire(batch, frozenset({PRESENT}), 5, "node-k")

    assert (stored.kind, stored.xid, stored.gpu_uuid) == (health.EventKind.FALLEN_OFF_BUS, None, PRESENT)
    event = health.HealthEvent(
        node_id="node-k", kind=health.EventKind(stored.kind), observed_at=0.0, gpu_uuid=stored.gpu_uuid,
        xid=stored.xid, message=stored.message, attributes=stored.attributes,
    )  # fmt: skip
    facts = health.kernel_log_of(event)
    assert facts is not None and facts.pci == "0000:18:00.0"
    result = classify.classify(event, catalog=xid_catalog.load_catalog(), policy=policy.ClassificationPolicy())
    assert (result.severity, result.action, result.fault_key) == (
        classify.Severity.FATAL,
        classify.RecommendedAction.REBOOT_NODE,
        "off_bus",
    )
