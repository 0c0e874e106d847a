"""The shared vocabulary is pinned to the wire contract: each enum maps one to one onto its proto enum."""

from __future__ import annotations

import dataclasses
import enum

import pytest

from rasd.agent.core import model
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.common import vocabulary
from rasd.controller.core import fleet
from rasd.controller.core.remediation import escalation
from rasd.controller.core.remediation import events as health

PINNED = [
    (vocabulary.Severity, health_pb.Severity, "SEVERITY_"),
    (vocabulary.EventKind, health_pb.EventKind, "EVENT_KIND_"),
    (vocabulary.ActionOutcome, commands_pb.ActionOutcome, "ACTION_OUTCOME_"),
]


@pytest.mark.parametrize(("ours", "wire", "prefix"), PINNED, ids=lambda p: getattr(p, "__name__", p))
def test_every_member_is_exactly_one_proto_value_and_back(ours: type[enum.IntEnum], wire, prefix: str):
    wire_values = {wire.Name(number): number for number in wire.values()}
    # Every member names one proto value, with the same number ...
    assert {prefix + member.name: int(member) for member in ours} == wire_values
    # ... and every proto value, a later one included, has its member: a new proto value fails here.
    for name, number in wire_values.items():
        assert ours(number).name == name.removeprefix(prefix)
    assert len({int(m) for m in ours}) == len(ours) == len(wire_values)


def test_gpu_info_has_the_fields_of_the_proto_message():
    ours = {field.name for field in dataclasses.fields(vocabulary.GpuInfo)}
    assert ours == set(health_pb.GpuInfo.DESCRIPTOR.fields_by_name)


def test_agent_and_controller_use_the_one_vocabulary_not_copies():
    assert model.Severity is health.Severity is vocabulary.Severity
    assert model.EventKind is health.EventKind is vocabulary.EventKind
    assert model.ActionOutcome is escalation.Outcome is vocabulary.ActionOutcome
    assert model.GpuInfo is vocabulary.GpuInfo
    assert issubclass(fleet.GpuRecord, vocabulary.GpuInfo)
    record = fleet.GpuRecord("GPU-1", "H100", "0000:18:00.0", 200, 700, 700, node_id="n1")
    assert (record.node_id, record.uuid, record.power_limit_max_w) == ("n1", "GPU-1", 700)
