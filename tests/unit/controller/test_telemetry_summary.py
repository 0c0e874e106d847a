"""The summary wire format (TelemetrySummary) on the controller's side, and the raw batch beside it.

An agent that offers summaries gets them chosen in Welcome; one that does not (an agent before
summaries) sends TelemetryBatch, which is still accepted. Either way the power window and the latest
view end up with the same values for what the controller's loops read.
"""

from __future__ import annotations

import array
import math

import hypothesis
import pytest
from hypothesis import strategies as st

from rasd.agent import wire as agent_wire
from rasd.agent.core import model
from rasd.agent.core import summary as core_summary
from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core import fleet
from rasd.controller.rpc import validate_input
from rasd.controller.wire import agent as wire
from rasd.controller.wire import stream as wire_stream

GPU_A = "GPU-00000000-0000-4000-8000-00000000000a"
GPU_B = "GPU-00000000-0000-4000-8000-00000000000b"
OTHER = "GPU-00000000-0000-4000-8000-00000000000c"
KNOWN = frozenset({GPU_A, GPU_B})
MINE = validate_input.StreamIdentity(node_id="node-a", gpu_owners={GPU_A: "node-a", GPU_B: "node-a", OTHER: "node-b"})
LIMITS = validate_input.InputLimits()
T0 = 1_800_000_000 * 10**9
MS = 1_000_000


def _samples(gpu: str, watts: list[float], offset_ms: int = 50) -> model.PowerSamples:
    """One sample every 100 ms from T0 + offset_ms."""
    times = array.array("q", [T0 + (offset_ms + 100 * i) * MS for i in range(len(watts))])
    return model.PowerSamples(gpu, times, array.array("d", watts))


def _counters(gpu: str, **fields) -> model.GpuCounters:
    values = {"sample_unix_ns": T0 + 900 * MS, "enforced_power_limit_w": 500, "temperature_c": 61}
    values.update(fields)
    return model.GpuCounters(gpu_uuid=gpu, **values)


A_W = [300.0, 650.0, 310.0, 640.0, 305.0, 660.0, 300.0, 655.0, 310.0, 645.0]
B_W = [200.0, 210.0, 220.0, 230.0, 240.0, 250.0, 260.0, 270.0, 280.0, 290.0]


def _summary_message(full_rate: frozenset[str] = frozenset()) -> agent_pb.AgentMessage:
    power = core_summary.summarize(
        [_samples(GPU_A, A_W), _samples(GPU_B, B_W)],
        carry=core_summary.GridCarry(),
        interval_ms=100,
        until_unix_ns=T0 + 1000 * MS,
        full_rate=full_rate,
    )
    counters = [_counters(GPU_A, clock_event_reasons=0x4, utilization_gpu_pct=97), _counters(GPU_B)]
    return agent_wire.summary(power, {c.gpu_uuid: c for c in counters}, counters, (GPU_A, GPU_B))


def _raw_message() -> agent_pb.AgentMessage:
    counters = [_counters(GPU_A, clock_event_reasons=0x4, utilization_gpu_pct=97), _counters(GPU_B)]
    return agent_wire.telemetry([_samples(GPU_A, A_W), _samples(GPU_B, B_W)], counters, 100)


def _window_from_raw(message: agent_pb.AgentMessage) -> fleet.PowerWindow:
    telemetry = wire_stream.telemetry_from_wire(message.telemetry, KNOWN)
    window = fleet.PowerWindow(bucket_ms=100, span_s=60)
    for series in telemetry.power:
        window.add(series.gpu_uuid, series.first_sample_unix_ns, series.sample_interval_ms, series.power_w)
    return window


def _window_from_summary(summary: msgs.TelemetrySummary, tracked: frozenset[str] = frozenset()) -> fleet.PowerWindow:
    window = fleet.PowerWindow(bucket_ms=100, span_s=60)
    window.track(tracked)
    for peak in summary.peaks:
        window.add_peak(peak.gpu_uuid, peak.last_sample_unix_ns, peak.max_w)
    node = summary.node_power
    assert node is not None
    window.add_node(node.node_id, node.first_sample_unix_ns, node.sample_interval_ms, node.power_w, node.gpus)
    for series in summary.full_rate:
        window.add_tracked(series.gpu_uuid, series.first_sample_unix_ns, series.sample_interval_ms, series.power_w)
    return window


def test_a_summary_fills_the_power_window_as_the_raw_batch_of_the_same_samples():
    message = _summary_message()
    assert validate_input.check_message(message, MINE, LIMITS) == "summary"
    summary = wire_stream.summary_from_wire(message.summary, "node-a", KNOWN)
    raw = _window_from_raw(_raw_message())
    summarised = _window_from_summary(summary)
    assert summarised.series() == raw.series()
    assert len(raw.series()) == 10 and all(gpus == 2 for _, _, gpus in raw.series())
    assert summarised.gpu_max_w(T0) == raw.gpu_max_w(T0) == {GPU_A: 660.0, GPU_B: 290.0}
    assert summary.samples == 20


def test_a_summary_gives_the_latest_view_what_the_raw_batch_gives_the_power_loop():
    summary = wire_stream.summary_from_wire(_summary_message().summary, "node-a", KNOWN)
    raw = wire_stream.telemetry_from_wire(_raw_message().telemetry, KNOWN)
    for gpu in (GPU_A, GPU_B):
        assert fleet.merge_summary(None, summary.latest[gpu]) == fleet.merge_latest(None, raw.latest[gpu])
    assert summary.latest[GPU_A].clock_event_reasons == 0x4
    assert summary.latest[GPU_A].power_w == 645.0
    assert summary.newest_counters_unix_ns == raw.newest_counters_unix_ns == T0 + 900 * MS


def test_a_summary_without_whole_counters_keeps_the_temperature_it_had():
    previous = fleet.GpuLatest(temperature_c=70, power_smoothing_enabled=True, counters_unix_ns=T0)
    update = fleet.GpuLatest(
        power_w=400.0, power_sample_unix_ns=T0 + 2, enforced_power_limit_w=450, counters_unix_ns=T0 + 1
    )
    merged = fleet.merge_summary(previous, update)
    assert (merged.temperature_c, merged.power_smoothing_enabled) == (70, True)
    assert (merged.power_w, merged.enforced_power_limit_w) == (400.0, 450)


def test_the_pcie_link_reaches_the_latest_view_from_whole_counters_and_stays_while_summaries_lack_it():
    counters = [_counters(GPU_A, pcie_link_width=4, pcie_link_width_max=16, pcie_link_gen=5, pcie_link_gen_max=5)]
    power = core_summary.summarize(
        [_samples(GPU_A, A_W)], carry=core_summary.GridCarry(), interval_ms=100, until_unix_ns=T0 + 1000 * MS
    )
    message = agent_wire.summary(power, {GPU_A: counters[0]}, counters, (GPU_A,))
    assert validate_input.check_message(message, MINE, LIMITS) == "summary"
    latest = wire_stream.summary_from_wire(message.summary, "node-a", KNOWN).latest[GPU_A]
    assert latest.pcie_link == fleet.PcieLink(4, 16, 5, 5) and latest.pcie_link.downtrained
    raw = wire_stream.telemetry_from_wire(agent_wire.telemetry([], counters, 100).telemetry, KNOWN)
    assert raw.latest[GPU_A].pcie_link == fleet.PcieLink(4, 16, 5, 5)
    later = latest._replace(pcie_link=None, counters_unix_ns=latest.counters_unix_ns + 1)
    assert fleet.merge_summary(latest, later).pcie_link == fleet.PcieLink(4, 16, 5, 5)
    unsent = message.summary.counters[0]
    unsent.ClearField("pcie_link_gen_max")  # one value missing: no link, not a guess
    assert wire.latest_from_summary(message.summary)[GPU_A].pcie_link is None
    assert not fleet.PcieLink(16, 16, 5, 5).downtrained and fleet.PcieLink(16, 16, 4, 5).downtrained


def test_the_canaries_full_series_go_into_the_tracked_sums_alone():
    summary = wire_stream.summary_from_wire(_summary_message(frozenset({GPU_A})).summary, "node-a", KNOWN)
    assert [s.gpu_uuid for s in summary.full_rate] == [GPU_A]
    window = _window_from_summary(summary, tracked=frozenset({GPU_A}))
    assert [w for _, w, _ in window.series(tracked=True)] == A_W
    assert [w for _, w, _ in window.series()] == [a + b for a, b in zip(A_W, B_W, strict=True)]


def _bad_summary(edit) -> agent_pb.AgentMessage:
    message = _summary_message()
    edit(message.summary)
    return message


def _set(path: str, value):
    def edit(summary):
        target = summary
        *parents, name = path.split(".")
        for part in parents:
            target = getattr(target, part)[0] if part in ("gpus", "counters") else getattr(target, part)
        setattr(target, name, value)

    return edit


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (_set("gpus.mean_w", math.nan), "summary.gpus[0].mean_w"),
        (_set("gpus.min_w", math.nan), "summary.gpus[0].min_w"),
        (_set("gpus.last_w", -1.0), "summary.gpus[0].last_w"),
        (_set("gpus.max_w", 5001.0), "summary.gpus[0].max_w"),
        (_set("gpus.min_w", 700.0), "summary.gpus[0].max_w"),
        (_set("gpus.gpu_uuid", "GPU-nope"), "summary.gpus[0].gpu_uuid"),
        (_set("gpus.utilization_gpu_pct", 101), "summary.gpus[0].utilization_gpu_pct"),
        (_set("gpus.last_sample_unix_ns", -1), "summary.gpus[0].last_sample_unix_ns"),
        (_set("node_power.sample_interval_ms", 0), "summary.node_power.sample_interval_ms"),
        (lambda s: s.node_power.gpus.append(1), "summary.node_power.gpus"),
        (lambda s: s.node_power.power_w.__setitem__(3, -5.0), "summary.node_power.power_w[3]"),
        (lambda s: s.node_power.gpus.__setitem__(2, 10_000), "summary.node_power.gpus[2]"),
        (_set("counters.temperature_c", 500), "summary.counters[0].temperature_c"),
        (_set("counters.pcie_link_width", 0), "summary.counters[0].pcie_link_width"),
        (_set("counters.pcie_link_width_max", 33), "summary.counters[0].pcie_link_width_max"),
        (_set("counters.pcie_link_gen", 9), "summary.counters[0].pcie_link_gen"),
        (
            lambda s: s.full_rate.add(gpu_uuid=GPU_A, first_sample_unix_ns=T0, sample_interval_ms=0, power_w=[1.0]),
            "summary.full_rate[0].sample_interval_ms",
        ),
    ],
)
def test_each_malformed_summary_field_is_named(edit, field):
    message = _bad_summary(edit)
    with pytest.raises(wire.WireError) as raised:
        validate_input.check_message(message, MINE, LIMITS)
    assert raised.value.field == field
    assert not validate_input.summary_certainly_valid(message.summary, MINE, LIMITS)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (_set("gpus.gpu_uuid", OTHER), "summary.gpus[0].gpu_uuid"),
        (_set("counters.gpu_uuid", OTHER), "summary.counters[0].gpu_uuid"),
    ],
)
def test_a_certified_stream_cannot_summarise_another_nodes_gpu(edit, field):
    with pytest.raises(validate_input.IdentityError) as raised:
        validate_input.check_message(_bad_summary(edit), MINE, LIMITS)
    assert raised.value.field == field and "node-b" in str(raised.value)


def test_a_summary_naming_a_gpu_the_node_did_not_announce_is_refused():
    with pytest.raises(wire.WireError) as raised:
        wire_stream.summary_from_wire(_summary_message().summary, "node-a", frozenset({GPU_A}))
    assert raised.value.field == "summary.gpus[1].gpu_uuid"


def test_the_welcome_chooses_summaries_only_for_an_agent_that_offers_them():
    def hello(**kwargs) -> fleet.NodeHello:
        message = agent_wire.hello(
            node_id="node-a",
            boot_id="boot",
            agent_version="v",
            hostname="node-a",
            backend="simulated",
            gpus=[],
            labels={},
            spool_head_seq=0,
            **kwargs,
        ).hello
        return wire.hello_from_wire(message)

    assert hello(summaries=True).summaries_offered
    assert not hello(summaries=False).summaries_offered
    old_agent = agent_pb.Hello(node_id="node-a", boot_id="boot", agent_version="v", backend="simulated")
    assert not wire.hello_from_wire(old_agent).summaries_offered, "an agent before summaries lists no format"
    for summaries, chosen in ((True, health_pb.TELEMETRY_FORMAT_SUMMARY), (False, health_pb.TELEMETRY_FORMAT_RAW)):
        welcome = wire_stream.welcome_message(
            msgs.Welcome(session_id="s", acked_seq=0, controller_version="v", agent_config={}, summaries=summaries)
        )
        assert welcome.welcome.config.telemetry_format == chosen
        assert agent_wire.summaries_chosen(welcome.welcome.config) == summaries
    assert not agent_wire.summaries_chosen(agent_pb.AgentConfig()), "a controller before summaries: raw batches"


def test_the_agent_never_sends_a_longer_node_series_than_the_controller_accepts():
    assert core_summary.MAX_GRID_BUCKETS <= wire.MAX_SAMPLES_PER_SERIES


_maybe_int = st.none() | st.integers(0, 1000)


@st.composite
def _latest(draw):
    return fleet.GpuLatest(
        power_w=draw(st.none() | st.floats(0, 1000)),
        power_sample_unix_ns=draw(st.integers(0, 3)),
        enforced_power_limit_w=draw(_maybe_int),
        temperature_c=draw(_maybe_int),
        utilization_gpu_pct=draw(_maybe_int),
        clock_event_reasons=draw(_maybe_int),
        counters_unix_ns=draw(st.integers(0, 3)),
        power_smoothing_enabled=draw(st.none() | st.booleans()),
        power_limit_slew_target_w=draw(_maybe_int),
        pcie_link=draw(st.none() | st.builds(fleet.PcieLink, *[st.integers(1, 16)] * 4)),
    )


@hypothesis.given(previous=_latest(), update=_latest())
def test_merge_summary_is_merge_latest_keeping_what_a_summary_does_not_bring(previous, update):
    """One value built per GPU per second (the ingest's hot path), with `merge_latest`'s rule per family."""
    merged = fleet.merge_latest(previous, update)
    expected = merged._replace(
        temperature_c=previous.temperature_c if update.temperature_c is None else merged.temperature_c,
        power_smoothing_enabled=(
            previous.power_smoothing_enabled
            if update.power_smoothing_enabled is None
            else merged.power_smoothing_enabled
        ),
        pcie_link=previous.pcie_link if update.pcie_link is None else merged.pcie_link,
    )
    assert fleet.merge_summary(previous, update) == expected
    assert fleet.merge_summary(None, update) == update


@hypothesis.given(previous=_latest(), update=_latest())
def test_the_hot_paths_readings_are_whole_values_though_built_from_rows(previous, update):
    """The merge and the summary's conversion build readings from rows of values (`fleet.latest_row`):
    each is a whole `GpuLatest`, equal to the one the keyword constructor builds from its fields."""
    readings = [fleet.merge_summary(previous, update), fleet.merge_latest(previous, update)]
    readings.extend(wire.latest_from_summary(_summary_message().summary).values())
    for reading in readings:
        assert type(reading) is fleet.GpuLatest and len(reading) == len(fleet.LATEST_FIELDS)
        rebuilt = fleet.GpuLatest(**reading._asdict())
        assert reading == rebuilt and hash(reading) == hash(rebuilt) and repr(reading) == repr(rebuilt)
