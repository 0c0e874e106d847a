"""The edge checks of AgentService: each malformed field is named, identity is enforced, pacing is fair."""

from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.agent import wire as agent_wire
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller.rpc import validate_input
from rasd.controller.wire import agent as wire

GPU = "GPU-00000000-0000-4000-8000-000000000001"
OTHER = "GPU-00000000-0000-4000-8000-000000000002"
NOW = 1_800_000_000 * 10**9
MINE = validate_input.StreamIdentity(node_id="node-a", gpu_owners={GPU: "node-a", OTHER: "node-b"})
PLAINTEXT = validate_input.StreamIdentity(node_id=None, gpu_owners={GPU: "node-a", OTHER: "node-b"})
LIMITS = validate_input.InputLimits()


def _event(**fields):
    values = {"seq": 1, "observed_unix_ns": NOW, "kind": health_pb.EVENT_KIND_XID, "gpu_uuid": GPU, "source": "kmsg"}
    values.update(fields)
    return agent_pb.AgentMessage(events=agent_pb.HealthEventBatch(events=[health_pb.HealthEvent(**values)]))


def _series(**fields):
    values = {"gpu_uuid": GPU, "first_sample_unix_ns": NOW, "sample_interval_ms": 100, "power_w": [300.0]}
    values.update(fields)
    return agent_pb.AgentMessage(telemetry=health_pb.TelemetryBatch(power=[health_pb.PowerSeries(**values)]))


def _counters(**fields):
    values = {"gpu_uuid": GPU, "sample_unix_ns": NOW}
    values.update(fields)
    return agent_pb.AgentMessage(telemetry=health_pb.TelemetryBatch(counters=[health_pb.GpuCounters(**values)]))


def _result(**fields):
    values = {"command_id": "c1", "outcome": commands_pb.ACTION_OUTCOME_SUCCEEDED}
    values.update(fields)
    return agent_pb.AgentMessage(action_result=commands_pb.ActionResult(**values))


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (_event(seq=0), "events.events[0].seq"),
        (_event(seq=2**63), "events.events[0].seq"),
        (_event(kind=0), "events.events[0].kind"),
        (_event(kind=999), "events.events[0].kind"),
        (_event(kind=health_pb.EVENT_KIND_NODE_LOST, gpu_uuid=""), "events.events[0].kind"),
        (_event(severity=42), "events.events[0].severity"),
        (_event(gpu_uuid="GPU-nope"), "events.events[0].gpu_uuid"),
        (_event(xid=0), "events.events[0].xid"),
        (_event(message="x" * 5000), "events.events[0].message"),
        (_event(message="a\x00b"), "events.events[0].message"),
        (_event(source="kmsg; rm -rf /"), "events.events[0].source"),
        (_event(observed_unix_ns=-1), "events.events[0].observed_unix_ns"),
        (_event(attributes={"raw": "r" * 254}), "events.events[0].attributes['raw']"),
        (_event(kernel_log=health_pb.KernelLogFacts(raw="r" * 5000)), "events.events[0].kernel_log.raw"),
        (
            _event(kernel_log=health_pb.KernelLogFacts(process_name="a\x00b")),
            "events.events[0].kernel_log.process_name",
        ),
        (_event(kernel_log=health_pb.KernelLogFacts(ib_device="d" * 254)), "events.events[0].kernel_log.ib_device"),
        (
            _event(kernel_log=health_pb.KernelLogFacts(nvlink_registers=[0] * 17)),
            "events.events[0].kernel_log.nvlink_registers",
        ),
        (_event(kernel_log=health_pb.KernelLogFacts(pid=2**63)), "events.events[0].kernel_log.pid"),
        (_series(power_w=[math.nan]), "telemetry.power[0].power_w[0]"),
        (_series(power_w=[300.0, math.inf]), "telemetry.power[0].power_w[1]"),
        (_series(power_w=[-1.0]), "telemetry.power[0].power_w[0]"),
        (_series(sample_interval_ms=0), "telemetry.power[0].sample_interval_ms"),
        (_series(first_sample_unix_ns=2**62), "telemetry.power[0].first_sample_unix_ns"),
        (_series(gpu_uuid=""), "telemetry.power[0].gpu_uuid"),
        (_counters(temperature_c=500), "telemetry.counters[0].temperature_c"),
        (_counters(utilization_gpu_pct=101), "telemetry.counters[0].utilization_gpu_pct"),
        (_counters(ecc_dbe_volatile=2**64 - 1), "telemetry.counters[0].ecc_dbe_volatile"),
        (_counters(recovery_action=9), "telemetry.counters[0].recovery_action"),
        (_counters(nvlinks=[health_pb.NvLinkCounters(link=99)]), "telemetry.counters[0].nvlinks[0].link"),
        (_result(outcome=0), "action_result.outcome"),
        (_result(command_id="c" * 200), "action_result.command_id"),
        (_result(started_unix_ns=-5), "action_result.started_unix_ns"),
        (
            _result(enforced_limits=[commands_pb.GpuPowerLimit(gpu_uuid=GPU, power_limit_w=99_999)]),
            "action_result.enforced_limits[0].power_limit_w",
        ),
        (
            _result(verdicts=[commands_pb.CheckVerdict(check="v1", verdict="pass", duration_s=math.nan)]),
            "action_result.verdicts[0].duration_s",
        ),
        (agent_pb.AgentMessage(heartbeat=agent_pb.Heartbeat(spool_depth=2**63)), "heartbeat.spool_depth"),
        (agent_pb.AgentMessage(), "payload"),
        (agent_pb.AgentMessage(hello=agent_pb.Hello(node_id="node-a")), "hello"),
    ],
)
def test_each_malformed_field_is_named(message, field):
    with pytest.raises(wire.WireError) as raised:
        validate_input.check_message(message, MINE, LIMITS)
    assert raised.value.field == field
    assert str(raised.value).startswith(field + ":")


def test_well_formed_messages_pass():
    for message in (
        _event(),
        _event(gpu_uuid="", xid=79, attributes={"raw": "r" * 253}),
        _event(xid=149, kernel_log=health_pb.KernelLogFacts(raw="r" * 4096, nvlink_registers=[0x025001C6, 0], pid=7)),
        _series(),
        _counters(temperature_c=-10, utilization_gpu_pct=100, recovery_action=2),
        _result(enforced_limits=[commands_pb.GpuPowerLimit(gpu_uuid=GPU, power_limit_w=450)]),
        agent_pb.AgentMessage(heartbeat=agent_pb.Heartbeat(sent_unix_ns=NOW, spool_depth=3)),
    ):
        assert validate_input.check_message(message, MINE, LIMITS) == message.WhichOneof("payload")


def test_batch_sizes_are_bounded():
    limits = validate_input.InputLimits(max_events_per_batch=2, max_series_per_batch=1)
    events = [health_pb.HealthEvent(seq=i + 1, kind=1, observed_unix_ns=NOW) for i in range(3)]
    with pytest.raises(wire.WireError, match="3 entries, more than 2") as raised:
        validate_input.check_message(
            agent_pb.AgentMessage(events=agent_pb.HealthEventBatch(events=events)), MINE, limits
        )
    assert raised.value.field == "events.events"
    series = [health_pb.PowerSeries(gpu_uuid=GPU, sample_interval_ms=100)] * 2
    with pytest.raises(wire.WireError) as raised:
        validate_input.check_message(
            agent_pb.AgentMessage(telemetry=health_pb.TelemetryBatch(power=series)), MINE, limits
        )
    assert raised.value.field == "telemetry.power"
    with pytest.raises(ValueError, match=r"limits\.burst_messages"):
        validate_input.InputLimits(burst_messages=0)


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (_event(gpu_uuid=OTHER), "events.events[0].gpu_uuid"),
        (_series(gpu_uuid=OTHER), "telemetry.power[0].gpu_uuid"),
        (_counters(gpu_uuid=OTHER), "telemetry.counters[0].gpu_uuid"),
        (
            _result(enforced_limits=[commands_pb.GpuPowerLimit(gpu_uuid=OTHER, power_limit_w=300)]),
            "action_result.enforced_limits[0].gpu_uuid",
        ),
    ],
)
def test_a_certified_stream_cannot_name_another_nodes_gpu(message, field):
    with pytest.raises(validate_input.IdentityError) as raised:
        validate_input.check_message(message, MINE, LIMITS)
    assert raised.value.field == field and "node-b" in str(raised.value)
    # Without a certificate there is no identity to hold it to (the ingest still checks the Hello's GPUs).
    validate_input.check_message(message, PLAINTEXT, LIMITS)


def test_hello_must_name_the_certificates_node_and_not_claim_another_nodes_gpu():
    hello = agent_pb.Hello(
        node_id="node-b", gpus=[health_pb.GpuInfo(uuid=GPU, power_limit_min_w=100, power_limit_max_w=700)]
    )
    with pytest.raises(validate_input.IdentityError, match=r"hello\.node_id"):
        validate_input.check_hello(hello, MINE)
    claim = agent_pb.Hello(
        node_id="node-a", gpus=[health_pb.GpuInfo(uuid=OTHER, power_limit_min_w=100, power_limit_max_w=700)]
    )
    # node-b's last Hello listed it: connected or not, a claim alone never moves it (issue #37 item 11;
    # it was taken once node-b had disconnected).
    with pytest.raises(validate_input.IdentityError, match=r"hello.gpus\[0\].uuid"):
        validate_input.check_hello(claim, MINE)
    with pytest.raises(wire.WireError, match=r"hello\.backend"):
        validate_input.check_hello(agent_pb.Hello(node_id="node-a", backend="nvml\x00"), MINE)
    with pytest.raises(wire.WireError, match=r"hello.gpus\[0\].power_limit_min_w"):
        validate_input.check_hello(
            agent_pb.Hello(
                node_id="node-a", gpus=[health_pb.GpuInfo(uuid=GPU, power_limit_min_w=800, power_limit_max_w=700)]
            ),
            MINE,
        )


def test_token_bucket_paces_a_flood_and_refills():
    bucket = validate_input.TokenBucket(rate_per_s=10.0, burst=3)
    assert [bucket.delay(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.delay(0.0) == pytest.approx(0.1)
    assert bucket.delay(0.0) == pytest.approx(0.2)
    assert bucket.delay(10.0) == 0.0  # refilled to the burst after a quiet spell


def test_the_agent_cuts_text_to_what_the_edge_accepts():
    assert agent_wire.MAX_MESSAGE_CHARS <= wire.MAX_TEXT
    assert agent_wire.MAX_ATTRIBUTE_CHARS <= validate_input.MAX_ATTRIBUTE_CHARS
    assert agent_wire.MAX_SOURCE_CHARS <= validate_input.MAX_SOURCE_CHARS
    assert agent_wire.MAX_ATTRIBUTES <= wire.MAX_LABELS
    assert agent_wire.MAX_EVIDENCE_CHARS <= validate_input.MAX_EVIDENCE_CHARS
    assert agent_wire.MAX_REGISTERS <= wire.MAX_REGISTERS
    assert agent_wire.MAX_ATTRIBUTE_CHARS <= wire.MAX_FACT_CHARS


# ---- the telemetry fast path never accepts what the field-by-field check refuses ----------------

_BOUNDARY_INTS = (
    -(2**40),
    -51,
    -1,
    0,
    1,
    4,
    5,
    63,
    64,
    100,
    101,
    200,
    201,
    3000,
    3001,
    60_000,
    60_001,
    2**62,
    2**63 - 1,
)
_BOUNDARY_FLOATS = (-1.0, -0.0, 0.0, 0.5, 700.0, 3000.0, 3000.5, math.inf, -math.inf, math.nan)
_POWER_INT_FIELDS = ("first_sample_unix_ns", "sample_interval_ms")
_COUNTER_INT_FIELDS = (
    "sample_unix_ns",
    "nvlink_sample_unix_ns",
    *(name for name, _, _ in validate_input._COUNTER_RANGES),
)


@given(
    power_edits=st.lists(
        st.tuples(st.sampled_from(_POWER_INT_FIELDS), st.sampled_from((*_BOUNDARY_INTS, NOW, 100))), max_size=3
    ),
    samples=st.lists(st.sampled_from((*_BOUNDARY_FLOATS, 300.0, 650.5)), max_size=12),
    counter_edits=st.lists(
        st.tuples(st.sampled_from(_COUNTER_INT_FIELDS), st.sampled_from((*_BOUNDARY_INTS, NOW, 50))), max_size=4
    ),
    links=st.lists(st.tuples(st.sampled_from(_BOUNDARY_INTS), st.sampled_from(_BOUNDARY_INTS)), max_size=3),
    gpu=st.sampled_from((GPU, OTHER, "GPU-nope", "")),
    identity=st.sampled_from((MINE, PLAINTEXT)),
)
@settings(max_examples=1500, deadline=None)
def test_the_telemetry_fast_path_implies_the_field_checks(power_edits, samples, counter_edits, links, gpu, identity):
    series = health_pb.PowerSeries(gpu_uuid=gpu, first_sample_unix_ns=NOW, sample_interval_ms=100, power_w=samples)
    counters = health_pb.GpuCounters(gpu_uuid=gpu, sample_unix_ns=NOW)
    for name, value in power_edits:
        with contextlib.suppress(ValueError):  # out of the proto field's own range: not representable
            setattr(series, name, value)
    for name, value in counter_edits:
        with contextlib.suppress(ValueError):
            setattr(counters, name, value)
    for link, crc in links:
        with contextlib.suppress(ValueError):
            counters.nvlinks.add(link=link, crc_errors=crc)
    batch = health_pb.TelemetryBatch(power=[series], counters=[counters])
    try:
        validate_input.check_telemetry_fields(batch, identity, LIMITS)
        refused = None
    except (wire.WireError, validate_input.IdentityError) as exc:
        refused = exc
    fast = validate_input.telemetry_certainly_valid(batch, identity, LIMITS)
    assert not (fast and refused), f"the fast path accepted what the field check refuses: {refused}"
    assert fast or refused is not None, "the fast path refused a valid batch (correct, but slow: keep them equal)"


@pytest.mark.parametrize(
    ("hello", "field"),
    [
        (agent_pb.Hello(node_id="node-a", sent_unix_ns=2**63 - 1), "hello.sent_unix_ns"),
        (agent_pb.Hello(node_id="node-a", sent_unix_ns=-1), "hello.sent_unix_ns"),
        (
            agent_pb.Hello(node_id="node-a", spool_head_seq=2**63 - 1, spool_acked_seq=2**63 - 1),
            "hello.spool_head_seq",
        ),
        (
            agent_pb.Hello(
                node_id="node-a",
                spool_head_seq=validate_input.MAX_SPOOL_SEQ + 1,
                spool_acked_seq=validate_input.MAX_SPOOL_SEQ + 1,
            ),
            "hello.spool_head_seq",
        ),
        (agent_pb.Hello(node_id="node-a", spool_head_seq=5, spool_acked_seq=6), "hello.spool_acked_seq"),
    ],
)
def test_hello_times_and_spool_positions_are_bounded(hello, field):
    """Issue #37 item 12: a Hello's send time overflowed a command deadline, its spool position the lost count."""
    with pytest.raises(wire.WireError) as raised:
        validate_input.check_hello(hello, MINE)
    assert raised.value.field == field


def test_event_seqs_stay_within_what_a_spool_can_reach():
    validate_input.check_message(_event(seq=validate_input.MAX_SPOOL_SEQ), MINE, LIMITS)
    with pytest.raises(wire.WireError, match=r"events\.events\[0\]\.seq"):
        validate_input.check_message(_event(seq=validate_input.MAX_SPOOL_SEQ + 1), MINE, LIMITS)
