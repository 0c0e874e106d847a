"""The step-synchronous training job behind the simulated GPUs: steps, stragglers, caps and smoothing.

Product code (it drives `rasd-sim`, the demo and the power benchmarks), not a test helper. One
`StepJob` is one data-parallel job; every simulated GPU that runs it is one *rank*. In `rasd-sim`
all agents share one job, so a capped rank on one node slows the whole fleet's step, as it would in
a real synchronous job; a standalone simulated agent runs a job of its own ranks.

The model, step k (all times in seconds, one vector entry per rank):

- the step starts at S_k; rank r starts computing at cs = S_k + jitter (5-20 ms, redrawn every step
  from a generator seeded by (seed, k), so two jobs with one seed see the same jitter), plus its
  start delay (`set_start_delay`: a straggler whose host, not GPU, is slow; 0 otherwise);
- compute needs c0 = compute_fraction x period seconds at full demand. DVFS model: work is done at a
  rate proportional to power, so a rank drawing p < demand computes at p / demand of full speed.
  With the cap below demand the compute phase lasts c0 x demand / cap. A power-smoothing ramp-up
  from the trough to the peak at rate r loses (peak - trough)^2 / (2 r demand) seconds of work,
  made up at the peak's speed: (peak - trough)^2 / (2 r peak) extra seconds;
- the step ends after the slowest rank: E_k = max(ce) + (1 - compute_fraction) x period (the
  all-reduce), plus `checkpoint_s` every `checkpoint_every_steps` steps (a checkpoint stall);
- draw: during compute, min(demand, cap) reached at the ramp-up rate from where the draw is when
  the compute starts; after compute, the trough level max(comm, floor) reached at the ramp-down
  rate. A floor raises the trough: it costs energy, never time. The draw is continuous across a
  step boundary: a ramp-down too slow to reach the trough within the communication phase (a start
  profile's rate, `rasd.controller.core.power.start_smoothing`) leaves the draw where it got to, and the
  next ramp-up starts from there, not from the trough (so the ramp-up loss counts only the rise
  from there);
- before `start_after_s` and after `stop_after_s` the rank idles at `idle_w` (the job start and
  stop the controller's slew limits must handle).

A cap change (raised or lowered) takes effect at the instant it is set, `set_cap(rank, cap, at_s)`:
the draw is clamped at once (power-capping firmware reacts within milliseconds), and if the rank is
still computing (or has yet to start computing in this step), the rest of its compute phase is
re-timed from at_s by the same DVFS model: the work left, (compute_end - at_s) x old rate, is done
at the new rate, rate = min(demand, cap) / demand. A raise lets the compute finish sooner (a
job-start ramp raises caps every control period, and a 200 W compute phase of a 675 W job would
otherwise last 4.7 s before any raise showed); a decrease makes it finish later, and the step waits
for it. A change in the communication phase costs nothing in this step; the next step reads the
caps in force when it starts. Re-timing scales what is left of the phase, including any ramp-up
loss, by the rate ratio (the ramp itself is not re-solved: a small error, only with smoothing ramps).
Steps are computed lazily, at the first reading or cap change that falls in them, so every step's
timing comes from the caps in force at its start.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np


@dataclasses.dataclass(frozen=True)
class JobShape:
    """The timing of a job (a subset of `simulated.StepWorkload`, kept here to avoid a cycle)."""

    period_s: float
    compute_fraction: float
    rank_jitter_s: tuple[float, float]
    anchor_unix_s: float
    start_after_s: float = 0.0
    stop_after_s: float | None = None
    checkpoint_every_steps: int = 0
    checkpoint_s: float = 0.0
    idle_w: float = 70.0


@dataclasses.dataclass(frozen=True, eq=False)
class Step:
    """One computed step; arrays are per rank."""

    index: int
    start_s: float
    compute_start_s: np.ndarray
    compute_end_s: np.ndarray
    end_s: float
    peak_w: np.ndarray
    """Compute-phase level: min(demand, cap) (at least the floor)."""
    rise_from_w: np.ndarray
    """Where the draw is when the compute starts (the previous step's ramp-down, at least the trough):
    the ramp-up starts from here."""
    trough_w: np.ndarray
    """Communication-phase level: max(comm, floor), at most the cap."""
    work_w: np.ndarray
    """The level that sets the compute speed, min(demand, cap): work runs at work_w / demand of full
    speed (a floor above demand raises the draw, not the speed)."""
    ramp_up_w_per_s: np.ndarray
    ramp_down_w_per_s: np.ndarray
    checkpoint: bool
    active: np.ndarray
    """Ranks taking part in this step (the others were evicted and idle)."""


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _locked(method: _Method) -> _Method:
    """Run the method under the job's lock (re-entrant: public methods call each other)."""

    @functools.wraps(method)
    def run(self: StepJob, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]


class StepJob:
    """A synchronous job over ranks added with `add_ranks`; evaluate draw with `draw_w`.

    Thread-safe: every public method holds the job's lock. The agents' samplers read it on the event
    loop while their commands (caps, smoothing profiles) run in worker threads; unlocked, two threads
    could both compute the next step and append it twice, and a draw read between them then took a
    wrong step for the previous one (an instant fall to the trough, 200-400 kW across 1,024 GPUs).
    """

    def __init__(self, shape: JobShape, seed: int) -> None:
        """A job with no ranks yet; add them before the first reading."""
        if not shape.period_s > 0 or not 0 < shape.compute_fraction < 1:
            raise ValueError("JobShape: period_s must be > 0 and compute_fraction in (0, 1)")
        if shape.checkpoint_every_steps < 0 or shape.checkpoint_s < 0:
            raise ValueError("JobShape: checkpoint_every_steps and checkpoint_s must be >= 0")
        self.shape = shape
        self._seed = seed
        self._lock = threading.RLock()
        self._compute: list[float] = []
        self._comm: list[float] = []
        self._max: list[float] = []
        self._frozen = False
        self.compute_w = np.zeros(0)
        self.comm_w = np.zeros(0)
        self.cap_w = np.zeros(0)
        self.floor_w = np.zeros(0)
        self.ramp_up_w_per_s = np.zeros(0)
        self.ramp_down_w_per_s = np.zeros(0)
        self.active = np.zeros(0, dtype=bool)
        self.start_delay_s = np.zeros(0)
        self.steps: list[Step] = []
        self._starts: list[float] = []
        self._cap_changes: list[tuple[float, int, float]] | None = None
        self.hung_since_s: float | None = None
        """When the job hung (`hang`); None while it steps."""
        self.stuck_ranks: frozenset[int] = frozenset()

    # -- ranks and their settings ----------------------------------------------------------------
    @_locked
    def add_ranks(self, compute_w: Sequence[float], comm_w: Sequence[float], max_w: Sequence[float]) -> range:
        """Register ranks (uncapped at max_w); returns their indices.

        Raises:
            RuntimeError: the job has already run a step (ranks join before it starts).
        """
        if self._frozen:
            raise RuntimeError("ranks must join a StepJob before its first reading")
        first = len(self._compute)
        self._compute.extend(compute_w)
        self._comm.extend(comm_w)
        self._max.extend(max_w)
        n = len(self._compute)
        self.compute_w = np.array(self._compute, dtype=np.float64)
        self.comm_w = np.array(self._comm, dtype=np.float64)
        self.cap_w = np.concatenate([self.cap_w, np.array(max_w, dtype=np.float64)])
        self.floor_w = np.zeros(n)
        self.ramp_up_w_per_s = np.full(n, np.inf)
        self.ramp_down_w_per_s = np.full(n, np.inf)
        self.active = np.ones(n, dtype=bool)
        self.start_delay_s = np.zeros(n)
        return range(first, n)

    @_locked
    def set_active(self, rank: int, active: bool) -> None:
        """Take a rank out of the job (the scheduler evicted its GPU) or put it back; from the next step.

        An evicted rank runs no work: the step no longer waits for it, and it idles at `idle_w`
        (its smoothing profile went with the job).
        """
        self.active[rank] = active

    @_locked
    def set_start_delay(self, rank: int, delay_s: float) -> None:
        """Start the rank's compute delay_s late in every step from the next one (a straggler off the GPU).

        What the host does before the GPU computes: a data loader or kernel launches on a slow CPU, the
        input batch's copy over a PCIe link trained down. The rank draws its communication level while
        it waits, at full clocks after: no clock reason, no lower peak, only a later edge.
        """
        if not math.isfinite(delay_s) or delay_s < 0:
            raise ValueError(f"start delay must be a finite number of seconds >= 0, got {delay_s!r}")
        self.start_delay_s[rank] = delay_s

    @_locked
    def watch_caps(self) -> np.ndarray:
        """Keep every limit change from now on for `take_cap_changes`; returns the limits in force now.

        For an observer that must judge every limit that was ever in force (the simulator's budget
        check), not only those its samples happen to catch: a GPU reset holds its default limit for
        the instant before the agent puts its cap back.
        """
        self._cap_changes = []
        return self.cap_w.copy()

    @_locked
    def take_cap_changes(self) -> list[tuple[float, int, float]]:
        """The limit changes since the last call, in order: (unix s, rank, W); empty unless `watch_caps` ran."""
        if self._cap_changes is None:
            return []
        changes, self._cap_changes = self._cap_changes, []
        return changes

    @_locked
    def set_cap(self, rank: int, cap_w: float, at_s: float) -> None:
        """The rank's enforced power limit, W, from unix time at_s on.

        It clamps the draw at once and re-times the rest of the rank's compute phase from at_s (the
        DVFS model in the module docstring). Before the job's first reading the cap simply applies from the first step.
        """
        if self._cap_changes is not None:
            self._cap_changes.append((at_s, rank, float(cap_w)))
        if self._frozen and self.running(at_s):
            self._advance(at_s)  # steps that began before at_s ran under the old cap
            self.cap_w[rank] = cap_w
            self._retime(rank, at_s)
        else:
            self.cap_w[rank] = cap_w

    @_locked
    def set_smoothing(
        self,
        rank: int,
        *,
        floor_w: float,
        ramp_up_w_per_s: float,
        ramp_down_w_per_s: float,
        at_s: float | None = None,
    ) -> None:
        """A power-smoothing profile: trough floor and ramp rates (0 or inf rate = unlimited).

        With `at_s` (unix s) the firmware has the profile from that instant: the floor holds the
        trough of the step running then, and the ramp-down rate limits its fall when the rank has
        not finished its compute yet (a profile that lands during a job's first, long compute phase
        must already soften the fall that ends it; a faster ramp-down landing without its floor
        would dig one deeper trough). The ramp-up rate applies from the next step (the compute time
        is set when a step starts). Without `at_s`, all of it from the next step.
        """
        self.floor_w[rank] = floor_w
        self.ramp_up_w_per_s[rank] = ramp_up_w_per_s if ramp_up_w_per_s > 0 else np.inf
        self.ramp_down_w_per_s[rank] = ramp_down_w_per_s if ramp_down_w_per_s > 0 else np.inf
        if at_s is not None and self._frozen and self.running(at_s):
            self._advance(at_s)
            step = self.steps[-1]
            if not step.active[rank]:
                return
            step.trough_w[rank] = self._trough_w(rank)
            if at_s < step.compute_end_s[rank]:
                step.ramp_down_w_per_s[rank] = self.ramp_down_w_per_s[rank]

    @_locked
    def hang(self, at_s: float, stuck_ranks: Sequence[int] = ()) -> None:
        """The collective of the step running at at_s never completes, until `resume` (a hung job).

        Every rank finishes that step's compute, then waits: the step never ends, so no later step
        starts and no edge follows. The waiting ranks draw their communication level (NCCL's kernels
        spin: `hung_busy`); stuck_ranks (whose process stopped issuing work, the hang's cause) idle.
        """
        self._advance(at_s)
        while len(self.steps) > 1 and self.steps[-1].start_s > at_s:
            self.steps.pop()
            self._starts.pop()
        if not self.steps:
            return
        step = self.steps[-1]
        trough = step.trough_w.copy()
        for rank in stuck_ranks:
            trough[rank] = min(self.shape.idle_w, float(self.cap_w[rank]))
        self.steps[-1] = dataclasses.replace(step, end_s=math.inf, trough_w=trough)
        self.hung_since_s, self.stuck_ranks = at_s, frozenset(stuck_ranks)

    @_locked
    def resume(self, at_s: float) -> None:
        """The hung step ends at at_s (the job's launcher restarted every rank): steps follow from there."""
        if self.hung_since_s is None:
            return
        self.steps[-1] = dataclasses.replace(self.steps[-1], end_s=max(at_s, self.steps[-1].start_s))
        self.hung_since_s, self.stuck_ranks = None, frozenset()

    @_locked
    def hung_busy(self, rank: int, t_s: float) -> bool | None:
        """During a hang (`hang`): whether the rank spins in the collective (True) or idles, stuck (False).

        None when the job is not hung at t_s.
        """
        if self.hung_since_s is None or t_s < self.hung_since_s:
            return None
        return rank not in self.stuck_ranks and bool(self.active[rank])

    # -- time ------------------------------------------------------------------------------------
    @property
    def start_s(self) -> float:
        """Unix time the first step starts."""
        return self.shape.anchor_unix_s + self.shape.start_after_s

    @property
    def stop_s(self) -> float:
        """Unix time the job stops (inf: never)."""
        stop = self.shape.stop_after_s
        return math.inf if stop is None else self.shape.anchor_unix_s + stop

    def running(self, t_s: float) -> bool:
        """Whether the job runs at t_s."""
        return self.start_s <= t_s < self.stop_s

    def _next_step(self, first_start_s: float, first_index: int) -> Step:
        shape = self.shape
        k = first_index + len(self.steps)
        start = first_start_s if not self.steps else self.steps[-1].end_s
        lo, hi = shape.rank_jitter_s
        rng = np.random.default_rng([self._seed, k])
        cs = start + lo + (hi - lo) * rng.random(len(self.compute_w)) + self.start_delay_s
        cap = np.maximum(self.cap_w, 1.0)
        peak = np.maximum(np.minimum(self.compute_w, cap), np.minimum(self.floor_w, cap))
        trough = np.minimum(np.maximum(self.comm_w, self.floor_w), cap)
        rise_from = trough
        if self.steps and self.steps[-1].index == k - 1:
            # Continuous draw: a ramp-down that has not reached the trough goes on from where it is.
            rise_from = np.minimum(np.maximum(_level(self.steps[-1], slice(None), cs), trough), cap)
        up = self.ramp_up_w_per_s
        c0 = shape.compute_fraction * shape.period_s
        rise = np.maximum(peak - rise_from, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ramp_loss = np.where(np.isfinite(up) & (rise > 0), rise**2 / (2.0 * up * peak), 0.0)
        compute_s = c0 * np.maximum(self.compute_w / np.minimum(self.compute_w, cap), 1.0) + ramp_loss
        active = self.active.copy()
        ce = np.where(active, cs + compute_s, start)
        # An evicted rank idles for the whole step: no compute, trough at idle.
        cs = np.where(active, cs, start)
        idle = np.minimum(shape.idle_w, cap)
        peak = np.where(active, peak, idle)
        trough = np.where(active, trough, idle)
        rise_from = np.where(active, rise_from, idle)
        every = shape.checkpoint_every_steps
        checkpoint = every > 0 and (k + 1) % every == 0
        end = float(ce.max() if active.any() else start) + (1.0 - shape.compute_fraction) * shape.period_s
        if checkpoint:
            end += shape.checkpoint_s
        work = np.minimum(self.compute_w, cap)
        return Step(
            k,
            start,
            cs,
            ce,
            end,
            peak,
            rise_from,
            trough,
            work,
            up.copy(),
            self.ramp_down_w_per_s.copy(),
            checkpoint,
            active,
        )

    def _advance(self, t_s: float) -> None:
        self._frozen = True
        first_start, first_index = self.start_s, 0
        if not self.steps and t_s - self.start_s > 10 * self.shape.period_s:
            # First read long after the start (e.g. an anchor at the epoch): begin at the nominal step
            # grid instead of computing every step since; earlier times read as that step's trough.
            first_index = int((t_s - self.start_s) // self.shape.period_s)
            first_start = self.start_s + first_index * self.shape.period_s
        while (not self.steps or self.steps[-1].end_s <= t_s) and (
            (self.steps[-1].end_s if self.steps else first_start) < self.stop_s
        ):
            step = self._next_step(first_start, first_index)
            self.steps.append(step)
            self._starts.append(step.start_s)

    def _trough_w(self, rank: int) -> float:
        """One rank's communication-phase level now: max(comm, floor), at most its cap (`Step.trough_w`)."""
        return min(max(float(self.comm_w[rank]), float(self.floor_w[rank])), max(float(self.cap_w[rank]), 1.0))

    def _retime(self, rank: int, t_s: float) -> None:
        """Re-time the compute `rank` has left in the latest step for the cap it has from t_s."""
        if not self.steps:
            return
        step = self.steps[-1]
        if t_s >= step.end_s:
            return  # the change lands in the next step, which reads the caps when it is computed
        cap = max(float(self.cap_w[rank]), 1.0)
        step.trough_w[rank] = self._trough_w(rank)
        ce = float(step.compute_end_s[rank])
        if not step.active[rank] or t_s >= ce:
            return  # communicating (or evicted): nothing left to compute in this step
        new_work = min(float(self.compute_w[rank]), cap)
        old_work = float(step.work_w[rank])
        step.peak_w[rank] = max(new_work, min(float(self.floor_w[rank]), cap))
        if new_work == old_work:
            return
        # A change before the rank starts computing (its jitter) re-times the whole phase.
        since = max(t_s, float(step.compute_start_s[rank]))
        step.compute_end_s[rank] = since + (ce - since) * old_work / new_work
        step.work_w[rank] = new_work
        shape = self.shape
        end = float(step.compute_end_s[step.active].max()) + (1.0 - shape.compute_fraction) * shape.period_s
        if step.checkpoint:
            end += shape.checkpoint_s
        hung = not math.isfinite(step.end_s)  # a hung step never ends, whatever the caps (`hang`)
        self.steps[-1] = dataclasses.replace(step, end_s=step.end_s if hung else max(end, t_s))

    @_locked
    def step_at(self, t_s: float) -> Step | None:
        """The step running at t_s (None outside the job)."""
        if not self.running(t_s):
            return None
        self._advance(t_s)
        k = bisect.bisect_right(self._starts, t_s) - 1
        return self.steps[max(k, 0)] if self.steps else None

    @_locked
    def completed_steps(self, since_s: float, until_s: float) -> list[Step]:
        """Steps that started at or after since_s and ended by until_s."""
        self._advance(max(since_s, self.start_s))
        self._advance(until_s)
        return [s for s in self.steps if s.start_s >= since_s and s.end_s <= until_s]

    # -- draw ------------------------------------------------------------------------------------
    @_locked
    def demand_w(self, ranks: np.ndarray | slice, t_s: float) -> np.ndarray:
        """What each rank would draw uncapped and unsmoothed at t_s, W."""
        step = self.step_at(t_s)
        n = len(self.compute_w[ranks])
        if step is None:
            return np.full(n, self.shape.idle_w)
        computing = (step.compute_start_s[ranks] <= t_s) & (t_s < step.compute_end_s[ranks])
        resting = np.where(step.active[ranks], self.comm_w[ranks], self.shape.idle_w)
        return np.where(computing, self.compute_w[ranks], resting)

    @_locked
    def draw_w(self, ranks: np.ndarray | slice, t_s: float) -> np.ndarray:
        """Each rank's draw at t_s, W, before measurement noise."""
        step = self.step_at(t_s)
        if step is None:
            idle = np.maximum(self.shape.idle_w, self.floor_w[ranks])
            return np.minimum(idle, self.cap_w[ranks])
        level = _level(step, ranks, t_s)
        position = step.index - self.steps[0].index
        if position > 0:
            before = t_s < step.compute_start_s[ranks]
            if before.any():
                level = np.where(before, _level(self.steps[position - 1], ranks, t_s), level)
        # The power-capping firmware clamps draw within milliseconds of a new limit, even mid-step.
        return np.minimum(level, self.cap_w[ranks])


def _level(step: Step, ranks: np.ndarray | slice, t_s: float) -> np.ndarray:
    """Draw within (or just after) `step`: ramp up into compute, ramp down after it."""
    cs, ce = step.compute_start_s[ranks], step.compute_end_s[ranks]
    peak, trough, rise_from = step.peak_w[ranks], step.trough_w[ranks], step.rise_from_w[ranks]
    up, down = step.ramp_up_w_per_s[ranks], step.ramp_down_w_per_s[ranks]
    with np.errstate(invalid="ignore"):
        rising = np.where(np.isfinite(up), np.minimum(peak, rise_from + up * np.maximum(t_s - cs, 0.0)), peak)
        reached = np.where(np.isfinite(up), np.minimum(peak, rise_from + up * (ce - cs)), peak)
        falling = np.where(np.isfinite(down), np.maximum(trough, reached - down * np.maximum(t_s - ce, 0.0)), trough)
    return np.where(t_s < cs, trough, np.where(t_s < ce, rising, falling))
