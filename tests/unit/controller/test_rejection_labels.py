"""Metric labels come from a fixed set, whatever field name or fault a sender provokes (issue #37 item 14)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.controller.observability import metrics
from rasd.controller.rpc import validate_input
from rasd.controller.wire import agent as wire
from rasd.controller.wire import fields

IDENTITY = validate_input.StreamIdentity(node_id=None, gpu_owners={})


def _rejected_field(hello: agent_pb.Hello) -> str:
    with pytest.raises(wire.WireError) as raised:
        validate_input.check_hello(hello, IDENTITY)
    return raised.value.field


@pytest.mark.parametrize(
    ("field", "label"),
    [
        ("events.events[3].seq", "events.events[].seq"),
        ("telemetry.power[0].power_w[17]", "telemetry.power[].power_w[]"),
        ("hello.labels['rack']", "hello.labels[]"),
        ("hello.labels['x]y']", "hello.labels[]"),
        ('hello.gpus[2].labels["a\']b"]', "hello.gpus[].labels[]"),
        ("events.events[0].attributes['k.e.y']", "events.events[].attributes[]"),
        ("events.events[0].kernel_log.nvlink_registers", "events.events[].kernel_log.nvlink_registers"),
        ("payload", "payload"),
        ("hello", "hello"),
        ("hello.labels]]]", "other"),
        ("\x1b[31mred", "other"),
    ],
)
def test_a_field_name_is_labelled_by_its_place_in_the_message(field, label):
    assert fields.rejection_label(field) == label


def test_label_keys_built_to_mint_series_add_none():
    """22,000 streams each with its own `]`-broken label key made 22,032 series; now one."""
    registry = CollectorRegistry()
    controller_metrics = metrics.ControllerMetrics(registry)
    for index in range(500):
        key = f"x]{index}\x00"
        controller_metrics.rejected(_rejected_field(agent_pb.Hello(node_id="node-a", labels={key: "v"})))
        controller_metrics.rejected(
            _rejected_field(agent_pb.Hello(node_id="node-a", labels={"k": f"v]{index}" + "x" * 300}))
        )
    series = [
        sample.labels["field"]
        for family in registry.collect()
        if family.name == "rasd_wire_rejections"
        for sample in family.samples
        if sample.name == "rasd_wire_rejections_total"
    ]
    assert series == ["hello.labels[]"]
    assert registry.get_sample_value("rasd_wire_rejections_total", {"field": "hello.labels[]"}) == 1000


def test_every_label_is_a_field_of_the_agent_message_or_other():
    known = fields.agent_message_fields()
    assert {"hello.gpus[].uuid", "telemetry.counters[].nvlinks[].crc_errors", "action_result.verdicts[]"} <= known
    assert all(fields.rejection_label(name) == name for name in known)


@pytest.mark.parametrize(
    ("fault_key", "label"),
    [
        ("xid:79", "xid:79"),
        ("xid:99999", "xid:other"),
        ("xid:", "xid:other"),
        ("ib_flap:mlx5_0/1", "ib_flap"),
        ("ib_state:\x1b]0;pwned\x07", "ib_state"),
        ("nvlink_down:17", "nvlink_down"),
        ("off_bus", "off_bus"),
        ("Evil Key", "other"),
    ],
)
def test_an_incident_cause_is_labelled_by_its_kind(fault_key, label):
    """A node chose the part after the colon (any Xid to 99,999, any port name): one series per value before."""
    assert metrics.incident_cause_label(fault_key) == label
