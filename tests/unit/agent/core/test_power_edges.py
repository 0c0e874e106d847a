"""Falling edges in sampled power: sub-sample crossings, one array per GPU."""

from __future__ import annotations

import numpy as np
import pytest

from rasd.agent.core import power_edges


def test_the_crossing_is_interpolated_between_the_samples_around_it():
    times = np.array([0.0, 0.1, 0.2, 0.3, 0.4])
    draws = np.array([[680.0, 680.0], [680.0, 680.0], [120.0, 540.0], [120.0, 120.0], [680.0, 680.0]])
    edges = power_edges.falling_edges(times, draws, np.array([400.0, 400.0]))
    assert edges[0] == pytest.approx([0.15])  # (680 - 400) / (680 - 120) of the way from 0.1 to 0.2
    assert edges[1] == pytest.approx([0.2 + 0.1 * (540 - 400) / (540 - 120)])


def test_a_rise_is_not_an_edge_and_each_fall_is_one():
    times = np.arange(8) * 0.1
    draws = np.array([120, 680, 120, 120, 680, 680, 120, 120], dtype=float)[:, None]
    (edges,) = power_edges.falling_edges(times, draws, power_edges.midpoint_w(draws))
    assert edges == pytest.approx([0.15, 0.55])


def test_the_midpoint_is_halfway_between_low_and_high():
    draws = np.array([680.0, 120.0] * 10)[:, None]
    assert power_edges.midpoint_w(draws) == pytest.approx([400.0])


def test_samples_and_times_that_do_not_match_are_refused():
    with pytest.raises(ValueError, match="must be \\(samples, gpus\\) with 3 samples"):
        power_edges.falling_edges(np.zeros(3), np.zeros((4, 2)), np.zeros(2))


def _samples(gpu: str, start_s: float, watts: list[float], dt_s: float = 0.1):
    import array

    from rasd.agent.core import model

    times = array.array("q", (round((start_s + i * dt_s) * 1e9) for i in range(len(watts))))
    return model.PowerSamples(gpu, times, array.array("d", watts))


def _step_trace(steps: int) -> list[float]:
    """2 s steps at 10 Hz: 14 samples at 680 W, 6 at 120 W."""
    return ([680.0] * 14 + [120.0] * 6) * steps


def test_an_edge_between_two_summaries_is_found_once_in_the_later_one():
    trace = _step_trace(5)  # falls between samples 13|14, 33|34, 53|54, 73|74, 93|94
    carry = power_edges.EdgeCarry()
    sent: list[int] = []
    for first, last in ((0, 54), (54, 74), (74, 100)):  # cuts right at the third and fourth falls
        edges, carry = power_edges.interval_edges([_samples("GPU-a", first * 0.1, trace[first:last])], carry)
        sent.extend(edges.get("GPU-a", ()))
    assert [round(e / 1e6) for e in sent] == [1350, 3350, 5350, 7350, 9350]  # ms: halfway between 680 and 120 W


def test_one_summary_of_compute_samples_alone_still_finds_the_edge_with_the_levels_carried():
    trace = _step_trace(3)
    carry = power_edges.EdgeCarry()
    _, carry = power_edges.interval_edges([_samples("GPU-a", 0.0, trace[:40])], carry)
    edges, carry = power_edges.interval_edges([_samples("GPU-a", 4.0, trace[40:54])], carry)  # compute only
    assert edges == {}
    edges, carry = power_edges.interval_edges([_samples("GPU-a", 5.4, trace[54:60])], carry)
    assert [round(e / 1e6) for e in edges["GPU-a"]] == [5350]


def test_no_edges_until_the_levels_rest_on_two_steps_of_samples():
    trace = _step_trace(2)
    edges, carry = power_edges.interval_edges([_samples("GPU-a", 0.0, trace[:30])], power_edges.EdgeCarry())
    assert edges == {}
    edges, _ = power_edges.interval_edges([_samples("GPU-a", 3.0, trace[30:40])], carry)
    assert [round(e / 1e6) for e in edges["GPU-a"]] == [3350]


def test_a_gpu_without_a_step_swing_sends_no_edges():
    noisy = [300.0 + (i % 3) * 8.0 for i in range(40)]
    edges, _ = power_edges.interval_edges([_samples("GPU-a", 0.0, noisy)], power_edges.EdgeCarry())
    assert edges == {}


def test_at_most_the_newest_edges_are_sent_per_summary():
    fast = [680.0, 120.0] * 20  # a fall every 0.2 s
    edges, _ = power_edges.interval_edges([_samples("GPU-a", 0.0, fast)], power_edges.EdgeCarry())
    assert len(edges["GPU-a"]) == power_edges.MAX_EDGES_PER_SUMMARY
    assert edges["GPU-a"][-1] == round(3.85e9)


def test_a_sampling_outage_is_not_bridged_into_an_edge():
    carry = power_edges.EdgeCarry()
    _, carry = power_edges.interval_edges([_samples("GPU-a", 0.0, _step_trace(2))], carry)
    _, carry = power_edges.interval_edges([_samples("GPU-a", 4.0, [680.0] * 5)], carry)
    edges, _ = power_edges.interval_edges([_samples("GPU-a", 7.0, [120.0] * 5)], carry)  # 2.6 s later
    assert edges == {}


@pytest.mark.parametrize("size", [1, 2, 7, 40, 100])
@pytest.mark.parametrize("q", [0.0, 10.0, 50.0, 90.0, 100.0])
def test_percentile_interpolates_as_numpy_does(size: int, q: float) -> None:
    # The agent takes a GPU's levels in Python (no numpy in its process): the same figures as numpy's.
    draws = np.random.default_rng(size).uniform(100.0, 700.0, size)
    assert power_edges.percentile(sorted(draws), q) == pytest.approx(float(np.percentile(draws, q)), abs=1e-9)
