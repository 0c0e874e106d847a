"""The job-start cap ramp: park idle GPUs at a start cap, then raise them at the aggregate ramp limit.

This module owns one decision per control period: a *ceiling* on each GPU's cap that comes from
job start and stop, applied on top of the allocator's targets (`min(target, ceiling)`).

- **Parking.** A GPU idle (utilisation 0) for at least `job_start_idle_s` gets a ceiling at the
  start cap: `job_start_cap_w`, or its minimum limit when unset, never below that minimum. Parking
  only lowers a target, so the two-phase apply carries it like any other decrease.
- **Ramp.** When a parked GPU turns busy (its job started), its ceiling rises every period by
  `budget / n x u`, where n is the number of GPUs ramping together (they share the aggregate
  limit) and u a seeded random factor in [1 - raise_jitter_pct, 1] per GPU, so the ramp never
  moves every GPU by the same amount (G11). The budget is `ramp_limit_w_per_s x dt` (dt: time since
  the last period), less what the rises of the trailing `RAMP_WINDOW_S` already used: the caps move
  in one step per period and G3 measures |dP/dt| over 1 s windows, so no 1 s window may hold more
  than one window's worth of rises, however often the loop runs. The period that first sees a
  parked GPU busy does not raise it: its draw has just jumped from idle to the start cap (a jump no
  cap can limit, since a cap cannot go below the GPU's minimum); that jump is counted in the
  trailing window at the start cap (idle draw unknown here: an over-estimate, so it errs slow), and
  the first rise waits a period. A ceiling rises from the target delivered last period when that
  is lower (the allocator's own raises are slew-limited and jittered, so a target can trail the
  ceiling): a target that caught up with a ceiling run ahead would land more than one period's
  rise at once. A GPU's ramp ends when the allocator no longer raises its target (its demand is
  met, or no budget is left) or its ceiling reaches its maximum limit: from then on the allocator
  alone decides.

The ceiling never raises a target: the result is `min(target, ceiling)`, so every budget that held
for the targets holds for the result, and never below the GPU's minimum limit.

Pure: no I/O, no logging, no clock reads; `now_s` and a seeded `numpy.random.Generator` come in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from rasd.controller.core import power_policy

RAMP_WINDOW_S = 1.0
"""The window G3 measures the aggregate ramp over; one period's summed ceiling rise stays within it."""


@dataclasses.dataclass(frozen=True)
class RampState:
    """What the ramp remembers between periods (in memory; a restarted controller starts afresh)."""

    idle_since_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU -> when it was first seen idle in its current idle spell."""
    ceiling_w: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU -> its ceiling: parked at the start cap, or rising after its job started."""
    last_s: float | None = None
    """When the previous period ran."""
    recent_rises: tuple[tuple[float, float], ...] = ()
    """(when, summed ceiling rise W) of the periods within the trailing `RAMP_WINDOW_S`."""
    last_target_w: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU -> the target the ceiling let through last period (GPUs with a ceiling only)."""


@dataclasses.dataclass(frozen=True, eq=False)
class RampDecision:
    """One period's result."""

    state: RampState
    targets_w: np.ndarray
    """min(target, ceiling) per GPU, whole watts (int64), aligned with the input."""
    parked: int
    """GPUs held at the start cap (idle)."""
    ramping: int
    """GPUs whose ceiling rose this period (their job started)."""
    rise_w: float
    """Summed rise of the ceilings this period, W (with the trailing 1 s's, at most ramp_limit x 1 s)."""
    starting: int = 0
    """Busy GPUs still under a ceiling (just started or ramping): their draw is not the job's own."""


def start_cap_w(min_w: np.ndarray, policy: power_policy.PowerPolicy) -> np.ndarray:
    """The cap an idle GPU is parked at: `job_start_cap_w` (or its minimum), never below its minimum."""
    mins = np.asarray(min_w, dtype=np.float64)
    if policy.job_start_cap_w is None:
        return mins.copy()
    return np.maximum(mins, policy.job_start_cap_w)


def job_start_ramp(
    state: RampState,
    *,
    gpu_uuids: Sequence[str],
    idle: np.ndarray,
    targets_w: np.ndarray,
    min_w: np.ndarray,
    max_w: np.ndarray,
    now_s: float,
    policy: power_policy.PowerPolicy,
    rng: np.random.Generator,
) -> RampDecision:
    """Apply the job-start ceiling to one period's targets.

    Example: 4 GPUs parked at 200 W, all start their job, ramp limit 400 W/s, period 1 s, no jitter:
    each ceiling rises 100 W per period (200, 300, 400 ...) until it meets the target.

    Args:
        state: The previous period's ramp state.
        gpu_uuids: The GPUs, aligned with the arrays.
        idle: True where the GPU reports no utilisation (no job on it).
        targets_w: The allocator's targets (within every budget), W.
        min_w: Each GPU's minimum power limit, W.
        max_w: Each GPU's maximum power limit, W (a ceiling that reaches it is done).
        now_s: The period's time.
        policy: `ramp_limit_w_per_s`, `raise_jitter_pct`, `job_start_cap_w`, `job_start_idle_s`.
        rng: Seeded generator for the jitter.

    Returns:
        The decision; with `job_start_ramp_enabled` false, the targets unchanged and an empty state.
    """
    targets = np.asarray(targets_w, dtype=np.int64)
    if not policy.job_start_ramp_enabled:
        return RampDecision(RampState(last_s=now_s), targets.copy(), 0, 0, 0.0)
    mins = np.asarray(min_w, dtype=np.float64)
    parked_at = start_cap_w(mins, policy)
    idle_since: dict[str, float] = {}
    ceiling = np.full(len(gpu_uuids), np.inf)
    for i, gpu in enumerate(gpu_uuids):
        if idle[i]:
            idle_since[gpu] = state.idle_since_s.get(gpu, now_s)
        if gpu in state.ceiling_w:
            ceiling[i] = state.ceiling_w[gpu]
    for i, gpu in enumerate(gpu_uuids):
        if idle[i] and now_s - idle_since[gpu] >= policy.job_start_idle_s:
            ceiling[i] = parked_at[i]  # parked (again): the next job starts from here
    busy = ~np.asarray(idle, dtype=bool)
    just_started = np.array([gpu in state.idle_since_s for gpu in gpu_uuids], dtype=bool)
    ramping = busy & np.isfinite(ceiling) & ~just_started
    delivered = np.array([state.last_target_w.get(gpu, np.inf) for gpu in gpu_uuids])
    ceiling = np.where(ramping, np.minimum(ceiling, delivered), ceiling)
    n = int(ramping.sum())
    rise_w = 0.0
    recent = tuple((t, w) for t, w in state.recent_rises if now_s - t < RAMP_WINDOW_S)
    started = busy & just_started & np.isfinite(ceiling)
    if started.any():
        recent = (*recent, (now_s, float(ceiling[started].sum())))
    if n and state.last_s is not None:
        dt = max(now_s - state.last_s, 0.0)
        window_left_w = policy.ramp_limit_w_per_s * RAMP_WINDOW_S - sum(w for _, w in recent)
        budget_w = max(min(policy.ramp_limit_w_per_s * dt, window_left_w), 0.0)
        jitter = policy.raise_jitter_pct / 100.0
        factor = 1.0 - jitter * rng.random(n)
        rise = budget_w / n * factor
        ceiling[ramping] += rise
        rise_w = float(rise.sum())
        if rise_w > 0:
            recent = (*recent, (now_s, rise_w))
    # The allocator asks no more (demand met, or no budget left), or a ceiling at the maximum limit
    # can hold nothing back: the ramp of that GPU is done.
    done = ramping & ((targets <= delivered) | (ceiling >= np.asarray(max_w, dtype=np.float64)))
    ceiling[done] = np.inf
    limited = np.isfinite(ceiling)
    out = targets.copy()
    bound = np.maximum(np.floor(ceiling[limited]), np.ceil(mins[limited])).astype(np.int64)
    out[limited] = np.minimum(targets[limited], bound)
    kept = {gpu: float(ceiling[i]) for i, gpu in enumerate(gpu_uuids) if limited[i]}
    last_target = {gpu: float(out[i]) for i, gpu in enumerate(gpu_uuids) if limited[i]}
    return RampDecision(
        state=RampState(
            idle_since_s=idle_since, ceiling_w=kept, last_s=now_s, recent_rises=recent, last_target_w=last_target
        ),
        targets_w=out,
        parked=int((limited & np.asarray(idle, dtype=bool)).sum()),
        ramping=n,
        rise_w=rise_w,
        starting=int((limited & busy).sum()),
    )
