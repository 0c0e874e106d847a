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
