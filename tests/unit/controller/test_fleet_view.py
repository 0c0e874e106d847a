"""Pure fleet view: node state, telemetry merging and the fleet power window."""

from __future__ import annotations

import sys

import pytest

from rasd.controller.core import fleet

S = fleet.ComponentState


@pytest.mark.parametrize(
    ("stored", "connected", "shown"),
    [
        (S.HEALTHY, True, S.HEALTHY),
        (S.HEALTHY, False, S.OFFLINE),
        (S.OFFLINE, True, S.HEALTHY),
        (S.QUARANTINED, False, S.QUARANTINED),
        (S.RMA, True, S.RMA),
        (S.DEGRADED, True, S.DEGRADED),
    ],
)
def test_effective_node_state(stored, connected, shown):
    assert fleet.effective_node_state(stored, connected=connected) is shown


def test_a_power_reading_older_than_the_stale_limit_is_forgotten_and_its_cap_kept():
    latest = fleet.GpuLatest(power_w=650.0, power_sample_unix_ns=100 * 10**9, enforced_power_limit_w=700)
    assert fleet.drop_stale_power(latest, now_s=105.0, stale_after_s=5.0) == latest
    stale = fleet.drop_stale_power(latest, now_s=105.5, stale_after_s=5.0)
    assert stale.power_w is None and stale.enforced_power_limit_w == 700


def test_older_telemetry_never_overwrites_newer():
    newer = fleet.GpuLatest(power_w=600.0, power_sample_unix_ns=200, enforced_power_limit_w=650, counters_unix_ns=200)
    older = fleet.GpuLatest(power_w=100.0, power_sample_unix_ns=100, enforced_power_limit_w=700, counters_unix_ns=100)
    assert fleet.merge_latest(newer, older) == newer


def test_power_and_counters_merge_independently():
    power_only = fleet.GpuLatest(power_w=500.0, power_sample_unix_ns=300)
    counters_only = fleet.GpuLatest(enforced_power_limit_w=600, temperature_c=70, counters_unix_ns=250)
    merged = fleet.merge_latest(power_only, counters_only)
    assert merged.power_w == 500.0 and merged.enforced_power_limit_w == 600 and merged.temperature_c == 70


def test_power_window_sums_one_sample_per_gpu_per_bucket():
    window = fleet.PowerWindow(bucket_ms=100, span_s=10)
    window.add("a", 0, 100, [100.0, 200.0, 300.0])
    window.add("b", 50_000_000, 100, [10.0, 20.0, 30.0])
    assert window.series() == [(0, 110.0, 2), (100_000_000, 220.0, 2), (200_000_000, 330.0, 2)]


def test_power_window_is_bounded():
    window = fleet.PowerWindow(bucket_ms=100, span_s=1)
    window.add("a", 0, 100, [1.0] * 50)
    rows = window.series()
    assert len(rows) == 10
    assert rows[-1][0] == 49 * 100_000_000


def test_summary_ignores_partial_buckets():
    rows = [(0, 100.0, 1), (1, 1000.0, 4), (2, 400.0, 4)]
    summary = fleet.summarize_power(rows, min_gpus=4)
    assert summary == {"buckets": 2, "mean_w": 700.0, "min_w": 400.0, "max_w": 1000.0, "p2p_w": 600.0}
    assert fleet.summarize_power([], min_gpus=1) == {"buckets": 0}


def test_node_totals_count_unsampled_gpus_at_their_default_limit():
    record = fleet.GpuRecord("GPU-1", "H100", "0:1", 200, 700, 700, node_id="n")
    node = fleet.NodeStatus(
        node_id="n",
        state=S.HEALTHY,
        connected=True,
        last_seen_unix_ns=1,
        boot_id="b",
        agent_version="v",
        backend="simulated",
        hostname="n",
        labels={},
        gpus=(
            fleet.GpuStatus(record, S.HEALTHY, fleet.GpuLatest(power_w=300.0, enforced_power_limit_w=500)),
            fleet.GpuStatus(record, S.HEALTHY, fleet.GpuLatest()),
        ),
    )
    assert node.power_draw_w == 300.0
    assert node.power_cap_w == 1200


def test_power_window_never_counts_a_resent_or_reordered_series_twice():
    window = fleet.PowerWindow(bucket_ms=100, span_s=10)
    window.add("a", 0, 100, [100.0, 200.0, 300.0])
    assert window.add("a", 0, 100, [100.0, 200.0, 300.0]) == 1  # resent after a reconnect: only the newest bucket
    assert window.add("a", 0, 100, [999.0]) == 0  # an old batch arriving late is dropped, not misplaced
    assert window.series() == [(0, 100.0, 1), (100_000_000, 200.0, 1), (200_000_000, 300.0, 1)]
    window.add("a", 250_000_000, 100, [310.0])  # the same bucket again: the GPU's latest sample wins
    assert window.series()[-1] == (200_000_000, 310.0, 1)


def test_power_window_memory_does_not_grow_with_gpus_times_buckets():
    window = fleet.PowerWindow(bucket_ms=100, span_s=2, detail_s=1)
    for second in range(30):
        for gpu in range(200):
            window.add(f"g{gpu}", second * 1_000_000_000, 100, [500.0 + gpu] * 10)
    rows = window.series()
    assert len(rows) == 20 and all(count == 200 for _, _, count in rows)
    assert len(window._sums) <= 20
    assert all(len(peaks) <= 1 for _buckets, peaks in window._peaks.values())


def test_gpu_max_w_is_each_gpus_peak_over_recent_series():
    window = fleet.PowerWindow(bucket_ms=100, span_s=60, detail_s=10)
    window.add("a", 0, 100, [100.0, 650.0, 120.0])
    window.add("a", 1_000_000_000, 100, [110.0, 600.0])
    window.add("b", 1_000_000_000, 100, [300.0])
    assert window.gpu_max_w(0) == {"a": 650.0, "b": 300.0}
    assert window.gpu_max_w(1_000_000_000) == {"a": 600.0, "b": 300.0}
    assert window.gpu_max_w(5_000_000_000) == {}


def test_tracked_gpus_are_summed_on_their_own():
    window = fleet.PowerWindow(bucket_ms=100, span_s=1)
    window.add("a", 0, 100, [100.0])
    window.track({"b"})
    window.add("a", 100_000_000, 100, [100.0, 100.0])
    window.add("b", 100_000_000, 100, [600.0, 150.0])
    window.add("b", 250_000_000, 100, [170.0])  # a newer sample in the same bucket replaces the older
    assert window.series(tracked=True) == [(100_000_000, 600.0, 1), (200_000_000, 170.0, 1)]
    assert window.series()[1:] == [(100_000_000, 700.0, 2), (200_000_000, 270.0, 2)]
    window.add("b", 300_000_000, 100, [500.0] * 20)  # the span trims the tracked sums too
    assert len(window.series(tracked=True)) <= 11
    window.track({"a"})
    assert window.series(tracked=True) == [], "a new set starts afresh"


def test_a_gpus_peaks_are_kept_flat_in_a_few_hundred_bytes():
    window = fleet.PowerWindow(bucket_ms=100, span_s=60, detail_s=10)
    for second in range(30):
        window.add_peak("g0", second * 1_000_000_000, 400.0 + second)
    buckets, peaks = window._peaks["g0"]
    # 16,384 GPUs keep 30 s each: a deque of (bucket, W) tuples was about 4 KiB per GPU.
    assert sys.getsizeof(buckets) + sys.getsizeof(peaks) <= 2 * (64 + 8 * 10 * 2)
    assert list(buckets) == [s * 10 for s in range(20, 30)]  # detail_s: the last 10 s of buckets
    assert window.gpu_max_w(25 * 1_000_000_000) == {"g0": 429.0}


def test_a_reordered_peak_takes_its_place_in_time():
    window = fleet.PowerWindow(bucket_ms=100, span_s=60, detail_s=10)
    window.add_peak("g0", 20_000_000_000, 300.0)
    window.add_peak("g0", 12_000_000_000, 900.0)  # older: arrived late, after a reconnect
    window.add_peak("g0", 15_000_000_000, 500.0)
    assert list(window._peaks["g0"][0]) == [120, 150, 200]
    assert window.gpu_max_w(15_000_000_000) == {"g0": 500.0}  # the late, older peak is before the window
    assert window.gpu_max_w(0) == {"g0": 900.0}
    window.add_peak("g0", 25_000_000_000, 100.0)
    assert list(window._peaks["g0"][0]) == [200, 250]  # 10 s back from the newest
