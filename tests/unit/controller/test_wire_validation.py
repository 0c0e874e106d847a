"""Inbound validation names the bad field."""

from __future__ import annotations

import pytest

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller.wire import agent as wire

GPU = "GPU-00000000-0000-4000-8000-00000000000a"


def _hello(**overrides):
    gpu = health_pb.GpuInfo(uuid=GPU, model="H100", power_limit_min_w=200, power_limit_max_w=700)
    fields = {"node_id": "node-1", "boot_id": "b", "gpus": [gpu]}
    fields.update(overrides)
    return agent_pb.Hello(**fields)


def test_good_hello_converts():
    hello = wire.hello_from_wire(_hello())
    assert hello.node_id == "node-1"
    assert hello.gpus[0].power_limit_default_w == 700


@pytest.mark.parametrize(
    ("hello", "field"),
    [
        (_hello(node_id=""), "hello.node_id"),
        (_hello(node_id="bad id with spaces"), "hello.node_id"),
        (_hello(gpus=[health_pb.GpuInfo(uuid="0", power_limit_min_w=1, power_limit_max_w=2)]), "hello.gpus[0].uuid"),
        (
            _hello(gpus=[health_pb.GpuInfo(uuid=GPU, power_limit_min_w=800, power_limit_max_w=700)]),
            "hello.gpus[0].power_limit_min_w",
        ),
        (_hello(hostname="h" * 300), "hello.hostname"),
    ],
)
def test_bad_hello_names_the_field(hello, field):
    with pytest.raises(wire.WireError) as raised:
        wire.hello_from_wire(hello)
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("series", "field"),
    [
        (
            health_pb.PowerSeries(gpu_uuid="GPU-other", sample_interval_ms=100, power_w=[1.0]),
            "telemetry.power[0].gpu_uuid",
        ),
        (
            health_pb.PowerSeries(gpu_uuid=GPU, sample_interval_ms=0, power_w=[1.0]),
            "telemetry.power[0].sample_interval_ms",
        ),
        (
            health_pb.PowerSeries(gpu_uuid=GPU, sample_interval_ms=100, power_w=[1.0, float("nan")]),
            "telemetry.power[0].power_w[1]",
        ),
        (health_pb.PowerSeries(gpu_uuid=GPU, sample_interval_ms=100, power_w=[-5.0]), "telemetry.power[0].power_w[0]"),
    ],
)
def test_bad_telemetry_names_the_field(series, field):
    with pytest.raises(wire.WireError) as raised:
        wire.check_telemetry(health_pb.TelemetryBatch(power=[series]), frozenset({GPU}))
    assert raised.value.field == field


def test_event_with_unknown_kind_is_rejected():
    batch = agent_pb.HealthEventBatch(events=[health_pb.HealthEvent(seq=1, kind=999)])
    with pytest.raises(wire.WireError, match=r"events.events\[0\].kind"):
        wire.events_from_wire(batch, frozenset({GPU}), 0, "node-1")


def test_latest_takes_the_last_sample_of_each_series():
    batch = health_pb.TelemetryBatch(
        power=[
            health_pb.PowerSeries(gpu_uuid=GPU, first_sample_unix_ns=1_000, sample_interval_ms=100, power_w=[1, 2, 3])
        ]
    )
    latest = wire.latest_from_telemetry(batch)[GPU]
    assert latest.power_w == 3.0
    assert latest.power_sample_unix_ns == 1_000 + 200_000_000
