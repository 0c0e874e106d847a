"""The agent puts each GPU's edges into its TelemetrySummary entry (issue #40)."""

from __future__ import annotations

import array

from rasd.agent import wire
from rasd.agent.core import model, power_edges, summary

NS = 1_000_000_000


def test_the_interval_edges_ride_in_their_gpus_summary_entry_and_a_gpu_without_any_sends_none():
    watts = ([680.0] * 14 + [120.0] * 6) * 3
    times = array.array("q", (k * NS // 10 for k in range(len(watts))))
    swinging = model.PowerSamples("GPU-a", times, array.array("d", watts))
    steady = model.PowerSamples("GPU-b", times, array.array("d", [300.0] * len(watts)))
    power = summary.summarize([swinging, steady], carry=summary.GridCarry(), interval_ms=100, until_unix_ns=6 * NS)
    edges, _ = power_edges.interval_edges([swinging, steady], power_edges.EdgeCarry())
    message = wire.summary(power, {}, [], ["GPU-a", "GPU-b"], edges)
    by_gpu = {g.gpu_uuid: list(g.falling_edge_unix_ns) for g in message.summary.gpus}
    assert by_gpu == {"GPU-a": [1_350_000_000, 3_350_000_000, 5_350_000_000], "GPU-b": []}
