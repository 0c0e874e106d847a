"""A summary's compute -> communication edges (issue #40) at the controller's edge and into the ingest's message."""

from __future__ import annotations

import pytest

from rasd.agent.core import power_edges
from rasd.api.v1 import health_pb2 as health_pb
from rasd.controller.rpc import validate_input
from rasd.controller.wire import agent as wire
from rasd.controller.wire import stream as wire_stream

GPU = "GPU-00000000-0000-4000-8000-000000000001"
NOW = 1_800_000_000 * 10**9
MINE = validate_input.StreamIdentity(node_id="node-a", gpu_owners={GPU: "node-a"})
LIMITS = validate_input.InputLimits()


def _summary(edges):
    return health_pb.TelemetrySummary(
        gpus=[
            health_pb.GpuPowerSummary(
                gpu_uuid=GPU, samples=10, mean_w=400.0, min_w=120.0, max_w=680.0, last_w=120.0,
                last_sample_unix_ns=NOW, falling_edge_unix_ns=edges,
            )
        ]
    )  # fmt: skip


def test_edges_in_order_are_accepted_and_reach_the_ingest_message():
    message = _summary([NOW - 2_000_000_000, NOW - 10_000_000])
    validate_input.check_summary(message, MINE, LIMITS)
    converted = wire_stream.summary_from_wire(message, "node-a", frozenset({GPU}))
    assert converted.edges == {GPU: (NOW - 2_000_000_000, NOW - 10_000_000)}


@pytest.mark.parametrize(
    ("edges", "field", "says"),
    [
        ([NOW + i for i in range(9)], "summary.gpus[0].falling_edge_unix_ns", "9 entries, more than 8"),
        ([NOW, NOW - 1], "summary.gpus[0].falling_edge_unix_ns[1]", "is not after the edge before it"),
        ([NOW, NOW], "summary.gpus[0].falling_edge_unix_ns[1]", "is not after the edge before it"),
        ([-5], "summary.gpus[0].falling_edge_unix_ns[0]", "is not a unix time"),
        ([0], "summary.gpus[0].falling_edge_unix_ns[0]", "after the Unix epoch"),
        ([NOW, 2**62], "summary.gpus[0].falling_edge_unix_ns[1]", "is not a unix time"),
    ],
)
def test_bad_edges_are_refused_naming_the_field(edges, field, says):
    message = _summary(edges)
    assert not validate_input.summary_certainly_valid(message, MINE, LIMITS)
    with pytest.raises(wire.WireError) as caught:
        validate_input.check_summary(message, MINE, LIMITS)
    assert caught.value.field == field
    assert says in str(caught.value)


def test_the_agent_sends_no_more_edges_than_the_controller_accepts():
    assert power_edges.MAX_EDGES_PER_SUMMARY <= validate_input.MAX_SUMMARY_EDGES
