"""Slew-limited cap raises: where a GPU's power limit should be now while a raise moves to its target.

This module owns the arithmetic of the agent's cap slews. The controller sends a raise with a
maximum rate (`SetPowerCap` with `max_raise_w_per_s`, its share of the aggregate ramp limit); the
agent then moves the limit up in small steps, never faster than that rate, so the aggregate of the
limits that *land* on the GPUs rises no faster than the sum of the rates, however late or bunched
the commands arrive. A raise is measured from where the limit is when the command runs:

    limit(t) = min(target, floor(from + rate x (t - started)))

- A new command for the same GPU replaces the slew in progress (the executor drops the old one
  first): slews never stack, so a GPU never moves faster than its latest rate.
- A decrease, a limit already at the target, or a rate of 0 is no slew (`begin` returns None):
  the executor sets it at once, as before. Decreases must be immediate and confirmed (DESIGN.md
  §2.1).
- Whole watts, like the backend's `set_power_limit`; a step is taken only when the limit moved by
  at least one watt.

Pure: no I/O, no clock reads; times come in as seconds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Slew:
    """One GPU's raise in progress."""

    from_w: int
    """The limit when the raise began, W."""
    target_w: int
    """Where the limit goes, W."""
    rate_w_per_s: float
    """The fastest the limit may rise, W/s (> 0)."""
    started_s: float
    """When the raise began (the agent's clock), s."""
    set_w: int
    """The limit last set, W."""


def begin(current_w: int, target_w: int, rate_w_per_s: float, now_s: float) -> Slew | None:
    """A slew from `current_w` to `target_w`, or None when the new limit goes at once.

    Example: 200 W to 350 W at 150 W/s from t = 10 s reaches 215 W at 10.1 s and 350 W at 11 s.

    Args:
        current_w: The limit in force now, W.
        target_w: The commanded limit, W.
        rate_w_per_s: The command's maximum raise rate, W/s; 0 (or not finite) means no slew.
        now_s: The agent's clock, s.

    Returns:
        The slew; None for a decrease, no change, or no rate (set at once).
    """
    if target_w <= current_w or not math.isfinite(rate_w_per_s) or rate_w_per_s <= 0:
        return None
    return Slew(int(current_w), int(target_w), float(rate_w_per_s), float(now_s), int(current_w))


def position_w(slew: Slew, now_s: float) -> int:
    """The limit the slew allows at `now_s`, W: never above the target, never below where it began."""
    elapsed_s = max(now_s - slew.started_s, 0.0)
    # (1 mW of slack, NVML's resolution: unix seconds as floats resolve ~0.2 µs, so 0.1 s can read
    # 0.0999998 s and fall a step short of a whole watt.)
    return min(slew.target_w, math.floor(slew.from_w + slew.rate_w_per_s * elapsed_s + 1e-3))


def step(slews: Mapping[str, Slew], now_s: float) -> tuple[dict[str, Slew], dict[str, int]]:
    """Advance every slew to `now_s`.

    Args:
        slews: GPU uuid -> its slew in progress.
        now_s: The agent's clock, s.

    Returns:
        (the slews still moving, GPU uuid -> the limit to set now). A slew whose limit reached its
        target is set there and dropped; one that has not moved a whole watt is left as it is.
    """
    remaining: dict[str, Slew] = {}
    to_set: dict[str, int] = {}
    for gpu_uuid, slew in slews.items():
        limit_w = position_w(slew, now_s)
        if limit_w > slew.set_w:
            to_set[gpu_uuid] = limit_w
        if limit_w < slew.target_w:
            remaining[gpu_uuid] = dataclasses.replace(slew, set_w=max(limit_w, slew.set_w))
    return remaining, to_set
