"""Slew-limited cap raises (`agent.core.cap_slew`): never faster than the rate, never past the target."""

from __future__ import annotations

import numpy as np
import pytest

from rasd.agent.core import cap_slew


def test_a_raise_moves_at_its_rate_and_stops_at_the_target():
    slew = cap_slew.begin(200, 350, 150.0, now_s=10.0)
    assert slew is not None
    slews = {"GPU-a": slew}
    limits = []
    for now in np.arange(10.1, 11.25, 0.1):
        slews, to_set = cap_slew.step(slews, float(now))
        limits.append(to_set.get("GPU-a"))
    assert limits[:3] == [215, 230, 245]
    assert limits[9] == 350 and slews == {}, "there at 11.0 s, and done"
    assert limits[10:] == [None, None], "nothing more to set"


def test_no_slew_for_a_decrease_no_change_or_no_rate():
    assert cap_slew.begin(400, 300, 150.0, now_s=0.0) is None, "decreases go at once"
    assert cap_slew.begin(400, 400, 150.0, now_s=0.0) is None
    assert cap_slew.begin(200, 400, 0.0, now_s=0.0) is None, "0: at once, as before"
    assert cap_slew.begin(200, 400, float("nan"), now_s=0.0) is None


def test_a_late_step_catches_up_but_never_beyond_the_rate_times_the_time():
    # A stalled loop steps late: the limit is where the rate allows by now, no more.
    slews = {"GPU-a": cap_slew.begin(200, 1000, 100.0, now_s=0.0)}
    slews, to_set = cap_slew.step(slews, 0.35)
    assert to_set == {"GPU-a": 235}
    slews, to_set = cap_slew.step(slews, 0.351)
    assert to_set == {}, "under a whole watt: no set"
    slews, to_set = cap_slew.step(slews, 2.0)
    assert to_set == {"GPU-a": 400}


@pytest.mark.parametrize("seed", range(5))
def test_any_1s_window_of_steps_rises_at_most_the_summed_rates(seed):
    # Many GPUs with their own rates and start times, stepped at jittered instants: the summed
    # limit never rises more than sum(rates) x 1 s over any 1 s (the aggregate ramp guarantee).
    rng = np.random.default_rng(seed)
    n = 32
    rates = rng.uniform(50.0, 150.0, n)
    starts = rng.uniform(0.0, 0.5, n)
    slews: dict[str, cap_slew.Slew] = {}
    limits = {f"g{i}": 200 for i in range(n)}
    samples = []
    now = 0.0
    while now < 12.0:
        for i in range(n):
            if f"g{i}" not in slews and starts[i] <= now and limits[f"g{i}"] < 700:
                slews[f"g{i}"] = cap_slew.begin(limits[f"g{i}"], 700, float(rates[i]), now)
        slews, to_set = cap_slew.step(slews, now)
        limits.update(to_set)
        samples.append((now, sum(limits.values())))
        now += float(rng.uniform(0.05, 0.15))
    for t0, p0 in samples:
        later = [p for t, p in samples if t0 < t <= t0 + 1.0]
        if later:
            assert max(later) - p0 <= rates.sum() * 1.0 + 1e-6
    assert samples[-1][1] == 700 * n
