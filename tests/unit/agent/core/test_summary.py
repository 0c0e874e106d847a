"""Summaries on the node: per-GPU draw, the node's summed draw per bucket, canary series, counters on change."""

from __future__ import annotations

import array
import dataclasses

import pytest

from rasd.agent.core import model, summary

MS = 1_000_000
S = 1_000_000_000


def _samples(gpu: str, points: list[tuple[float, float]]) -> model.PowerSamples:
    """Samples at (seconds, W)."""
    return model.PowerSamples(
        gpu, array.array("q", [round(t * S) for t, _ in points]), array.array("d", [w for _, w in points])
    )


def test_the_module_example_holds():
    out = summary.summarize(
        [_samples("A", [(0.05, 300.0), (0.15, 310.0)]), _samples("B", [(0.06, 200.0)])],
        carry=summary.GridCarry(),
        interval_ms=100,
        until_unix_ns=200 * MS,
    )
    assert out.node is not None
    assert out.node.first_sample_unix_ns == 0
    assert list(out.node.power_w) == [500.0, 510.0]
    assert list(out.node.gpus) == [2, 2]


def test_each_gpu_draw_is_mean_min_max_and_last_of_its_samples():
    out = summary.summarize(
        [_samples("A", [(0.0, 100.0), (0.1, 700.0), (0.2, 400.0)])],
        carry=summary.GridCarry(),
        interval_ms=100,
        until_unix_ns=300 * MS,
    )
    (a,) = out.draws
    assert (a.samples, a.mean_w, a.min_w, a.max_w, a.last_w) == (3, 400.0, 100.0, 700.0, 400.0)
    assert a.last_sample_unix_ns == 200 * MS


def test_a_bucket_counts_each_gpu_once_with_its_last_sample_there():
    # Two ticks of A fell into bucket 0 (jitter): A counts once there, with the later one.
    out = summary.summarize(
        [_samples("A", [(0.01, 100.0), (0.09, 120.0), (0.15, 130.0)]), _samples("B", [(0.05, 50.0), (0.12, 60.0)])],
        carry=summary.GridCarry(),
        interval_ms=100,
        until_unix_ns=200 * MS,
    )
    assert out.node is not None
    assert list(out.node.power_w) == [170.0, 190.0]
    assert list(out.node.gpus) == [2, 2]


def test_the_incomplete_bucket_waits_for_the_next_summary_with_its_newest_sample():
    carry = summary.GridCarry()
    first = summary.summarize(
        [_samples("A", [(0.05, 100.0), (0.18, 200.0)])], carry=carry, interval_ms=100, until_unix_ns=190 * MS
    )
    assert first.node is not None
    assert list(first.node.power_w) == [100.0]  # bucket 1 (0.1–0.2 s) is not over at 0.19 s
    second = summary.summarize(
        [_samples("A", [(0.21, 300.0)])], carry=first.carry, interval_ms=100, until_unix_ns=300 * MS
    )
    assert second.node is not None
    assert second.node.first_sample_unix_ns == 100 * MS
    assert list(second.node.power_w) == [200.0, 300.0]  # bucket 1 from the carried sample


def test_a_gpu_without_a_sample_is_held_for_two_buckets_then_drops_out():
    out = summary.summarize(
        [_samples("A", [(0.0, 100.0), (0.1, 100.0), (0.2, 100.0), (0.3, 100.0), (0.4, 100.0)]),
         _samples("B", [(0.0, 50.0)])],
        carry=summary.GridCarry(),
        interval_ms=100,
        until_unix_ns=500 * MS,
    )  # fmt: skip
    assert out.node is not None
    assert list(out.node.gpus) == [2, 2, 2, 1, 1]
    assert list(out.node.power_w) == [150.0, 150.0, 150.0, 100.0, 100.0]


def test_a_held_sample_carries_into_the_next_summary_but_not_past_its_hold():
    first = summary.summarize(
        [_samples("A", [(0.0, 80.0)]), _samples("B", [(0.0, 20.0)])],
        carry=summary.GridCarry(),
        interval_ms=100,
        until_unix_ns=100 * MS,
    )
    second = summary.summarize(
        [_samples("A", [(0.1, 80.0), (0.2, 80.0), (0.3, 80.0)])],
        carry=first.carry,
        interval_ms=100,
        until_unix_ns=400 * MS,
    )
    assert second.node is not None
    assert list(second.node.gpus) == [2, 2, 1]
    assert "B" not in second.carry.held  # too old to count again


def test_full_rate_series_are_only_for_the_asked_gpus_and_split_at_gaps():
    out = summary.summarize(
        [_samples("A", [(0.0, 1.0), (0.1, 2.0), (0.5, 3.0)]), _samples("B", [(0.0, 9.0)])],
        carry=summary.GridCarry(),
        interval_ms=100,
        until_unix_ns=600 * MS,
        full_rate={"A"},
    )
    assert [(s.gpu_uuid, s.first_sample_unix_ns, list(s.power_w)) for s in out.full_rate] == [
        ("A", 0, [1.0, 2.0, 2.0, 2.0]),  # held two buckets, then a gap at bucket 4
        ("A", 500 * MS, [3.0]),
    ]


def test_nothing_complete_gives_no_node_series_and_keeps_the_grid_start():
    out = summary.summarize(
        [_samples("A", [(1.05, 100.0)])], carry=summary.GridCarry(), interval_ms=100, until_unix_ns=1_080 * MS
    )
    assert out.node is None
    assert out.carry.next_bucket == 10
    assert out.carry.held == {"A": (10, 100.0)}


def test_a_long_backlog_is_cut_to_the_newest_buckets():
    out = summary.summarize(
        [_samples("A", [(0.0, 1.0), (1_000.0, 2.0)])], carry=summary.GridCarry(), interval_ms=100,
        until_unix_ns=1_000_100 * MS,
    )  # fmt: skip
    assert out.node is not None
    assert len(out.node.power_w) == summary.MAX_GRID_BUCKETS


def test_after_a_gap_longer_than_the_hold_the_grid_resumes_at_the_oldest_sample():
    first = summary.summarize(
        [_samples("A", [(0.05, 1.0)])], carry=summary.GridCarry(), interval_ms=100, until_unix_ns=100 * MS
    )
    later = summary.summarize(
        [_samples("A", [(60.05, 2.0)])], carry=first.carry, interval_ms=100, until_unix_ns=60_100 * MS
    )
    assert later.node is not None
    assert later.node.first_sample_unix_ns == 60_000 * MS
    assert list(later.node.power_w) == [2.0]


def test_a_sample_older_than_one_already_placed_is_not_placed():
    out = summary.summarize(
        [_samples("A", [(0.25, 5.0), (0.05, 7.0)])], carry=summary.GridCarry(), interval_ms=100, until_unix_ns=300 * MS
    )
    assert out.node is not None
    assert list(out.node.power_w) == [5.0]  # bucket 2 only: the stepped-back sample is dropped


def test_samples_out_of_time_order_are_placed_one_by_one():
    # A clock stepped back mid-interval: 0.35 s comes after 0.05 s and 0.15 s, then 0.12 s (dropped:
    # bucket 1 was already passed), then 0.45 s.
    out = summary.summarize(
        [_samples("A", [(0.05, 1.0), (0.35, 3.0), (0.12, 9.0), (0.45, 4.0)])],
        carry=summary.GridCarry(),
        interval_ms=100,
        until_unix_ns=500 * MS,
    )
    assert out.node is not None
    assert list(out.node.power_w) == [1.0, 1.0, 1.0, 3.0, 4.0]


@pytest.mark.parametrize("per_bucket", [1, 2, 5])
def test_bucketing_by_bisection_agrees_with_placing_every_sample(per_bucket):
    points = [(i / (10 * per_bucket) + 0.003, float(i)) for i in range(50)]
    out = summary.summarize(
        [_samples("A", points)], carry=summary.GridCarry(), interval_ms=100, until_unix_ns=5_000 * MS
    )
    expected = {}
    for t, w in points:
        expected[int(t * 10)] = w  # the last sample of each bucket
    assert out.node is not None
    got = dict(zip(range(len(out.node.power_w)), out.node.power_w, strict=True))
    assert {b: got[b] for b in expected} == expected


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_ms"):
        summary.summarize([], carry=summary.GridCarry(), interval_ms=0, until_unix_ns=0)


def _counters(**fields) -> model.GpuCounters:
    return model.GpuCounters(gpu_uuid="A", sample_unix_ns=1, ecc_dbe_volatile=0, temperature_c=40, **fields)


def test_counters_are_sent_first_and_then_only_when_something_happened():
    sent = _counters(utilization_gpu_pct=97, total_energy_mj=5, clock_event_reasons=4)
    assert summary.counters_changed(None, sent)
    moving = dataclasses.replace(
        sent, sample_unix_ns=2, temperature_c=41, utilization_gpu_pct=12, total_energy_mj=9, clock_event_reasons=0
    )
    assert not summary.counters_changed(sent, moving)
    assert summary.counters_changed(sent, dataclasses.replace(sent, ecc_dbe_volatile=1))
    assert summary.counters_changed(sent, dataclasses.replace(sent, enforced_power_limit_w=500))
    link_down = dataclasses.replace(sent, nvlinks=(model.NvLinkCounters(0, False),))
    assert summary.counters_changed(sent, link_down)
