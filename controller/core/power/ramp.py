"""The job-start cap ramp: park idle GPUs at a start cap, then raise them at the aggregate ramp limit.

This module owns one decision per control period: a *ceiling* on each GPU's cap that comes from
job start and stop, applied on top of the allocator's targets (`min(target, ceiling)`).

- **Parking.** A GPU idle (utilisation 0) for at least `job_start_idle_s` gets a ceiling at the
  start cap: `job_start_cap_w`, or its minimum limit when unset, never below that minimum. Parking
  only lowers a target, so the two-phase apply carries it like any other decrease.
- **Ramp.** When a parked GPU turns busy (its job started), it gets a raise *rate*: its share of the
  aggregate limit, `ramp_limit_w_per_s / n x u`, where n is the number of GPUs ramping together
  (they share the limit; a GPU whose ramp ended less than `RAMP_WINDOW_S + RAMP_LEAD_S` ago still
  counts, since its last raise may still be moving) and u a seeded random factor in
  [1 - raise_jitter_pct, 1] per GPU, so the ramp never moves every GPU by the same amount (G11). Its
  ceiling rises by that rate x dt every period (dt: time since the last period, at most
  `RAMP_WINDOW_S`), and the raise goes out with the rate (`SetPowerCap.max_raise_w_per_s`), aimed
  `RAMP_LEAD_S` at that rate past the ceiling: the agent moves the limit up no faster than the rate
  (`rasd.agent.core.cap_slew`), and the next period's command replaces the raise in progress before
  it gets there, so the limit keeps moving however late that command is. So the caps that *land*
  rise at most at the sum of the rates, the limit, whatever the delivery jitter: a raise decided
  late or delivered early cannot bunch with the next one inside a 1 s window (budgeting rises when
  they were decided did: two periods' rises landed within one window, 218 kW/s against 150 kW/s at
  1,024 GPUs). The period that first sees a parked GPU busy gives it no rate: its draw has just
  jumped from idle to the start cap (a jump no cap can limit, since a cap cannot go below the GPU's
  minimum). That jump counts against the aggregate rate for `RAMP_WINDOW_S` from that period, at the
  start cap (idle draw unknown here: an over-estimate, so it errs slow), so any 1 s window that
  holds the jump holds at most `limit x 1 s` of jump and raises together. A ceiling rises from the
  target delivered last period when that is lower (the allocator's own raises are jittered and
  limited, so a target can trail the ceiling). A GPU's ramp ends when the allocator no longer raises
  its target (its demand is met, or no budget is left) or its ceiling reaches its maximum limit:
  from then on the allocator alone decides.

The ceiling never raises a target: the result is `min(target, ceiling + rate x RAMP_LEAD_S)` (the
rate is 0 where the GPU is not ramping), so every budget that held for the targets holds for the
result, and never below the GPU's minimum limit.

The cap ramp shapes only the envelope: in a step-synchronous job the step's own swing rides under
the rising cap. Where the GPUs have smoothing hardware, `core.power.start_smoothing` holds that swing from
the job's first moment with a power-smoothing profile on the GPUs this module reports as started
(`RampDecision.started`); the ramp leaves it its part of the aggregate limit (`reserved_w_per_s`:
the canary GPUs it keeps unprofiled, and the start profiles of GPUs whose cap ramp is over), so a
GPU's cap rises no faster than its firmware lets its draw move.

Pure: no I/O, no logging, no clock reads; `now_s` and a seeded `numpy.random.Generator` come in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from rasd.controller.core.power import policy as power_policy

RAMP_WINDOW_S = 1.0
"""The window G3 measures the aggregate ramp over: a start jump holds the ramp back for this long,
and no period's ceiling rise covers more than this much time."""

RAMP_LEAD_S = 0.5
"""How far ahead of its ceiling a ramping GPU's command aims, in seconds at its rate: the agent
slews at the rate either way, and a lead lets a raise keep moving until the next period's command
replaces it even when that one arrives later (commands are delivered with jitter). Without it the
limit stops at each ceiling and waits for the next command, and the ramp runs slower than its
limit allows."""


@dataclasses.dataclass(frozen=True)
class RampState:
    """What the ramp remembers between periods (in memory; a restarted controller starts afresh)."""

    idle_since_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU -> when it was first seen idle in its current idle spell."""
    ceiling_w: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU -> its ceiling: parked at the start cap, or rising after its job started."""
    last_s: float | None = None
    """When the previous period ran."""
    recent_jumps: tuple[tuple[float, float], ...] = ()
    """(when, summed start cap W) of the job starts seen within the trailing `RAMP_WINDOW_S`."""
    last_target_w: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU -> the target the ceiling let through last period (GPUs with a ceiling only)."""
    finishing_since_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """GPU -> when its ramp ended: its last raise may still be moving at its rate for
    `RAMP_WINDOW_S + RAMP_LEAD_S`, so it keeps its share that long."""

    def ramping_gpus(self) -> frozenset[str]:
        """GPUs whose start ramp was rising last period (a ceiling, busy, past the start jump)."""
        return frozenset(g for g in self.ceiling_w if g not in self.idle_since_s)


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
    """Summed rise of the ceilings this period, W (the rates x dt)."""
    starting: int = 0
    """Busy GPUs still under a ceiling (just started or ramping): their draw is not the job's own."""
    raise_rates_w_per_s: np.ndarray | None = None
    """Per GPU, the rate its raise may land at (its share of the limit; 0 where not ramping), W/s,
    aligned with the input; they sum to at most `ramp_limit_w_per_s - reserved_w_per_s`. None when disabled."""
    started: np.ndarray | None = None
    """Per GPU, True where this period first saw it busy after it was parked (its job started)."""
    under_ceiling: np.ndarray | None = None
    """Per GPU, True where it is busy and still under a job-start ceiling (its cap ramp runs)."""
    parked_mask: np.ndarray | None = None
    """Per GPU, True where it is idle and parked at the start cap."""


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
    reserved_w_per_s: float = 0.0,
) -> RampDecision:
    """Apply the job-start ceiling to one period's targets.

    Example: 4 GPUs parked at 200 W, all start their job, ramp limit 400 W/s, period 1 s, no jitter:
    each gets a rate of 100 W/s and its ceiling rises 100 W per period (200, 300, 400 ...) until it
    meets the target.

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
        reserved_w_per_s: Part of the aggregate limit the ramp must leave to draw that moves on its
            own (`core.power.start_smoothing.reserved_w_per_s`: canary GPUs, start profiles of GPUs whose
            ramp is over), W/s.

    Returns:
        The decision; with `job_start_ramp_enabled` false, the targets unchanged and an empty state.
    """
    targets = np.asarray(targets_w, dtype=np.int64)
    if not policy.job_start_ramp_enabled:
        return RampDecision(RampState(last_s=now_s), targets.copy(), 0, 0, 0.0)
    mins = np.asarray(min_w, dtype=np.float64)
    idle_since, ceiling, parked = _park(state, gpu_uuids, idle, start_cap_w(mins, policy), now_s, policy)
    busy = ~np.asarray(idle, dtype=bool)
    just_started = np.array([gpu in state.idle_since_s for gpu in gpu_uuids], dtype=bool)
    ramping = busy & np.isfinite(ceiling) & ~just_started
    delivered = np.array([state.last_target_w.get(gpu, np.inf) for gpu in gpu_uuids])
    # (Delivered targets are whole watts: a ceiling's fraction of a watt is not a trailing target.)
    ceiling = np.where(ramping & (delivered < np.floor(ceiling)), delivered, ceiling)
    started = busy & just_started & np.isfinite(ceiling)
    jumps = _jumps(state, started, ceiling, now_s)
    finishing = {g: t for g, t in state.finishing_since_s.items() if now_s - t < RAMP_WINDOW_S + RAMP_LEAD_S}
    sharing = int(ramping.sum()) + sum(1 for i, gpu in enumerate(gpu_uuids) if gpu in finishing and not ramping[i])
    rates, rise_w = _raise(ceiling, ramping, state.last_s, now_s, jumps, sharing, reserved_w_per_s, policy, rng)
    # The allocator asks no more (demand met, or no budget left), or a ceiling at the maximum limit
    # can hold nothing back: the ramp of that GPU is done. Its last raise is at most this period's
    # rise (the target is under the ceiling), and it still goes out at its rate.
    done = ramping & ((targets <= delivered) | (ceiling >= np.asarray(max_w, dtype=np.float64)))
    ceiling[done] = np.inf
    finishing.update((gpu, now_s) for i, gpu in enumerate(gpu_uuids) if done[i])
    out, kept, last_target = _apply_ceilings(gpu_uuids, targets, ceiling, rates, mins)
    limited = np.isfinite(ceiling)
    under_ceiling = limited & busy
    return RampDecision(
        state=RampState(
            idle_since_s=idle_since,
            ceiling_w=kept,
            last_s=now_s,
            recent_jumps=jumps,
            last_target_w=last_target,
            finishing_since_s=finishing,
        ),
        targets_w=out,
        parked=int((limited & np.asarray(idle, dtype=bool)).sum()),
        ramping=int(ramping.sum()),
        rise_w=rise_w,
        starting=int(under_ceiling.sum()),
        raise_rates_w_per_s=rates,
        started=started,
        under_ceiling=under_ceiling,
        parked_mask=parked,
    )


def _jumps(state: RampState, started: np.ndarray, ceiling: np.ndarray, now_s: float) -> tuple[tuple[float, float], ...]:
    """The job starts within the trailing `RAMP_WINDOW_S`, with this period's (at the start cap) added."""
    jumps = tuple((t, w) for t, w in state.recent_jumps if now_s - t < RAMP_WINDOW_S)
    if started.any():
        jumps = (*jumps, (now_s, float(ceiling[started].sum())))
    return jumps


def _raise(
    ceiling: np.ndarray,
    ramping: np.ndarray,
    last_s: float | None,
    now_s: float,
    jumps: Sequence[tuple[float, float]],
    sharing: int,
    reserved_w_per_s: float,
    policy: power_policy.PowerPolicy,
    rng: np.random.Generator,
) -> tuple[np.ndarray, float]:
    """Raise the ramping GPUs' ceilings (in place) by their rates x dt; returns (rates W/s, summed rise W).

    Each rate is a jittered share of what the aggregate limit leaves: a start jump still inside the
    window leaves only the rest of `limit x 1 s` for raises, and the GPUs whose ramp ended lately
    (`sharing` counts them) still take their share.
    """
    rates = np.zeros(len(ceiling))
    n = int(ramping.sum())
    if not n or last_s is None:
        return rates, 0.0
    dt = min(max(now_s - last_s, 0.0), RAMP_WINDOW_S)
    aggregate_w_per_s = max(
        policy.ramp_limit_w_per_s - reserved_w_per_s - sum(w for _, w in jumps) / RAMP_WINDOW_S, 0.0
    )
    jitter = policy.raise_jitter_pct / 100.0
    rates[ramping] = aggregate_w_per_s / sharing * (1.0 - jitter * rng.random(n))
    ceiling[ramping] += rates[ramping] * dt
    return rates, float(rates[ramping].sum() * dt)


def _park(
    state: RampState,
    gpu_uuids: Sequence[str],
    idle: np.ndarray,
    parked_at_w: np.ndarray,
    now_s: float,
    policy: power_policy.PowerPolicy,
) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """(GPU -> idle since, each GPU's ceiling carried over, parked again) for this period.

    A GPU idle for `job_start_idle_s` is parked (again) at the start cap: the next job starts from there.
    """
    idle_since: dict[str, float] = {}
    ceiling = np.full(len(gpu_uuids), np.inf)
    for i, gpu in enumerate(gpu_uuids):
        if idle[i]:
            idle_since[gpu] = state.idle_since_s.get(gpu, now_s)
        if gpu in state.ceiling_w:
            ceiling[i] = state.ceiling_w[gpu]
    parked = np.zeros(len(gpu_uuids), dtype=bool)
    for i, gpu in enumerate(gpu_uuids):
        if idle[i] and now_s - idle_since[gpu] >= policy.job_start_idle_s:
            ceiling[i] = parked_at_w[i]
            parked[i] = True
    return idle_since, ceiling, parked


def _apply_ceilings(
    gpu_uuids: Sequence[str], targets: np.ndarray, ceiling: np.ndarray, rates: np.ndarray, mins: np.ndarray
) -> tuple[np.ndarray, dict[str, float], dict[str, float]]:
    """(targets under their ceilings, GPU -> ceiling kept, GPU -> the target it let through).

    A ramping GPU's target is aimed `RAMP_LEAD_S` at its rate past its ceiling (rates are 0 where
    not ramping: parked GPUs stay parked), never below its minimum and never above the allocator's.
    """
    limited = np.isfinite(ceiling)
    out = targets.copy()
    aim = ceiling + rates * RAMP_LEAD_S
    bound = np.maximum(np.floor(aim[limited]), np.ceil(mins[limited])).astype(np.int64)
    out[limited] = np.minimum(targets[limited], bound)
    kept = {gpu: float(ceiling[i]) for i, gpu in enumerate(gpu_uuids) if limited[i]}
    last_target = {gpu: float(min(out[i], np.floor(ceiling[i]))) for i, gpu in enumerate(gpu_uuids) if limited[i]}
    return out, kept, last_target
