"""The hung-job verdict: the job's step rhythm stopped while its GPUs stay busy (issue #40, goodput).

A step-synchronous job leaves a rhythm in its GPUs' power: one compute → communication edge per GPU
per step (`rasd.agent.core.power_edges`), steps a period apart. When a collective hangs (a rank
deadlocked, a lost message, a NIC that stopped answering), the edges stop, and the ranks waiting
in the collective keep their GPUs busy: NCCL's kernels spin at full utilization. The job's own
watchdog ends such a hang only at its timeout (PyTorch's NCCL default: 10 minutes); until then the
whole job makes no progress and nothing crashes.

This module judges that from values the straggler watch already has:

- `observe`: each completed step's median edge time (`straggler.complete_steps` cuts them) and the
  newest edge seen; the period is the median interval of the last ``history_steps`` steps;
- `check`: the job is *stalled* when it had a rhythm (at least ``min_steps`` steps), no edge has
  arrived for ``silent_periods`` periods (and at least ``min_silence_s``), and at least
  ``busy_fraction`` of its GPUs *spin*: utilization at or above ``busy_utilization_pct`` while
  drawing under ``spin_power_pct`` of their power limit (NCCL's waiting kernels keep the SMs busy
  at about the communication draw, a fifth of the compute draw). A job that ended, was preempted or
  crashed stops its rhythm too, but its GPUs fall idle: that is the scheduler's to see, never a
  stall here (its rhythm is forgotten: the next job builds its own). A job that computes without
  a collective for a while (an evaluation pass, a long generation) is busy at its compute draw:
  not spinning, never restarted.
- The verdict names a suspect rank where one stands out: a GPU of the job that fell idle while the
  others spin in the collective (its process stopped issuing work). Where none does, it names one of
  the job's GPUs in turn (the next one at each such stall, so that no innocent GPU's repair ladder
  climbs on a recurrence): the action is the same either way, because any rank's exit makes the
  job's launcher restart every rank from the last checkpoint. A GPU whose node has fallen silent (its
  agent sends nothing: the host may be down) is judged neither busy nor idle and never named; the
  verdict lists such nodes (`StallVerdict.silent_nodes`), and the caller leaves the job to the
  lost-node watch rather than restart a rank the dead host would hang again.

A verdict is given once per stall; the next edge (the job resumed, or was restarted) clears it.
Pure: values in, values out; ``now_s`` is passed in (the controller's clock; edge times are the
agents', which must agree within a few ms, as the straggler watch already needs).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class StallPolicy:
    """What makes a stall (controller.toml's ``[stragglers.stall]``)."""

    silent_periods: float = 5.0
    """Periods without an edge that make a stall (a checkpoint's pause is one or two)."""
    min_silence_s: float = 30.0
    """Silence shorter than this is never a stall, whatever the period (a checkpoint write, a GC pause)."""
    min_steps: int = 10
    """Steps seen before the rhythm counts: a job starting up has none yet."""
    history_steps: int = 32
    """Steps whose intervals give the period."""
    busy_utilization_pct: int = 50
    """A GPU at or above this utilization is busy (NCCL's spinning kernels read 100 %)."""
    spin_power_pct: float = 50.0
    """A busy GPU drawing under this share of its enforced power limit spins (waits in a collective);
    one drawing more computes."""
    busy_fraction: float = 0.5
    """Share of the job's GPUs that must spin: a job whose GPUs fell idle ended, it did not hang."""
    restart: bool = True
    """Restart the suspect rank's processes (the ladder's restart_process rung) so the job's launcher
    restarts the job from its checkpoint; False: notify only (a person or the job's watchdog ends it)."""

    def __post_init__(self) -> None:
        """Reject values that cannot mean anything, naming the field."""
        for name in ("silent_periods", "min_silence_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.min_steps < 3:
            raise ValueError(f"min_steps: must be >= 3, got {self.min_steps}")
        if self.history_steps < 2:
            raise ValueError(f"history_steps: must be >= 2, got {self.history_steps}")
        if not 0 <= self.busy_utilization_pct <= 100:
            raise ValueError(f"busy_utilization_pct: must be in [0, 100], got {self.busy_utilization_pct}")
        if not 0 < self.spin_power_pct <= 100:
            raise ValueError(f"spin_power_pct: must be in (0, 100], got {self.spin_power_pct}")
        if not 0 < self.busy_fraction <= 1:
            raise ValueError(f"busy_fraction: must be in (0, 1], got {self.busy_fraction}")


@dataclasses.dataclass(frozen=True)
class Rhythm:
    """The job's recent steps, its newest edge, and the stall already named (if any)."""

    step_times_s: tuple[float, ...] = ()
    """Median edge time of each recent step, oldest first (at most ``history_steps`` + 1)."""
    steps_seen: int = 0
    newest_edge_s: float = 0.0
    stalled_at_s: float | None = None
    """When the current stall was named (controller clock); None: the job is not stalled."""
    unlocalised: int = 0
    """Stalls named with no rank standing out: which GPU the next such stall names, in turn."""

    def period_s(self) -> float | None:
        """The median interval between the recent steps; None with fewer than two."""
        times = self.step_times_s
        if len(times) < 2:
            return None
        return statistics.median(b - a for a, b in itertools.pairwise(times))


@dataclasses.dataclass(frozen=True)
class GpuNow:
    """What one GPU of the job reads now (its latest telemetry); None: not reported."""

    utilization_pct: int | None
    power_w: float | None = None
    power_limit_w: float | None = None
    node_id: str = ""
    heard: bool = True
    """Its node's agent was heard from lately; False: silent (its readings are old, the host may be down)."""

    def spins(self, policy: StallPolicy) -> bool:
        """Busy at a fraction of its limit: waiting in a collective (unknown power or limit: not judged so)."""
        if not self.heard or self.utilization_pct is None or self.utilization_pct < policy.busy_utilization_pct:
            return False
        if self.power_w is None or not self.power_limit_w:
            return False
        return self.power_w < policy.spin_power_pct / 100.0 * self.power_limit_w

    def idle(self, policy: StallPolicy) -> bool:
        """Under the busy utilization (its process stopped issuing work); unknown or unheard is not idle."""
        return self.heard and self.utilization_pct is not None and self.utilization_pct < policy.busy_utilization_pct


@dataclasses.dataclass(frozen=True)
class StallVerdict:
    """A job found stalled: since when, for how long, how busy, and the rank to restart."""

    last_edge_s: float
    silent_s: float
    period_s: float
    busy_gpus: int
    """The job's GPUs spinning (`GpuNow.spins`)."""
    gpus: int
    suspect_gpu: str
    """An idle GPU, else one of the job's GPUs in turn (`Rhythm.unlocalised`)."""
    idle_gpus: tuple[str, ...]
    """The job's GPUs that fell idle while the rest spin (the suspects), sorted."""
    silent_nodes: tuple[str, ...]
    """Nodes of the job whose agents fell silent (`GpuNow.heard`), sorted: a dead host hangs the job too."""
    reason: str


def observe(rhythm: Rhythm, step_medians_s: Sequence[float], newest_edge_s: float, *, policy: StallPolicy) -> Rhythm:
    """The rhythm after these completed steps (their median edge times, oldest first) and the newest edge.

    An edge newer than the stall's last one means the job steps again: the stall is over.
    """
    times = (*rhythm.step_times_s, *step_medians_s)[-(policy.history_steps + 1) :]
    newest = max(rhythm.newest_edge_s, newest_edge_s)
    stalled = rhythm.stalled_at_s if newest <= rhythm.newest_edge_s else None
    return Rhythm(times, rhythm.steps_seen + len(step_medians_s), newest, stalled, rhythm.unlocalised)


def due(rhythm: Rhythm, *, now_s: float, policy: StallPolicy) -> bool:
    """Whether the rhythm has been silent long enough to ask `check` (cheap: no GPU is looked at)."""
    period = rhythm.period_s()
    if rhythm.stalled_at_s is not None or period is None or rhythm.steps_seen < policy.min_steps:
        return False
    return now_s - rhythm.newest_edge_s >= max(policy.min_silence_s, policy.silent_periods * period)


def check(
    rhythm: Rhythm, gpus_now: Mapping[str, GpuNow], *, now_s: float, policy: StallPolicy
) -> tuple[Rhythm, StallVerdict | None]:
    """Whether the job is stalled now: the rhythm (marked stalled) and a verdict, once per stall.

    gpus_now: each of the job's GPUs' latest utilization, draw and limit.

    Example: steps every 2.0 s, the newest edge 31 s ago, 63 of 64 GPUs at 100 % drawing 120 W of
    700 W and one at 0 % → a verdict naming the idle GPU: "the job's steps stopped 31 s ago (period
    2.0 s, 15 periods); 63 of 64 GPUs still busy: a hung collective; GPU-x fell idle: its rank stopped
    first".
    """
    if not due(rhythm, now_s=now_s, policy=policy):
        return rhythm, None
    period = rhythm.period_s() or 0.0
    silent_s = now_s - rhythm.newest_edge_s
    busy = [gpu for gpu, now in gpus_now.items() if now.spins(policy)]
    gpus = len(gpus_now)
    if not gpus or len(busy) < policy.busy_fraction * gpus:
        # The job ended (or crashed, or was preempted): its rhythm is forgotten, and a job that starts
        # later builds its own over ``min_steps`` steps (nor is this asked again every check meanwhile).
        return Rhythm(newest_edge_s=rhythm.newest_edge_s, unlocalised=rhythm.unlocalised), None
    idle = tuple(sorted(gpu for gpu, now in gpus_now.items() if now.idle(policy)))
    silent = tuple(sorted({now.node_id for now in gpus_now.values() if not now.heard}))
    heard = sorted(gpu for gpu, now in gpus_now.items() if now.heard)
    suspect = idle[0] if idle else heard[rhythm.unlocalised % len(heard)]
    if silent:
        blame = f"node {', '.join(silent[:4])}{' …' if len(silent) > 4 else ''} fell silent: its host may be down"
    elif idle:
        blame = f"{', '.join(idle[:4])}{' …' if len(idle) > 4 else ''} fell idle: its rank stopped first"
    else:
        blame = "no rank stands out: any rank's restart restarts the job"
    reason = (
        f"the job's steps stopped {silent_s:.0f} s ago (period {period:.1f} s, {silent_s / period:.0f} periods); "
        f"{len(busy)} of {gpus} GPUs still busy: a hung collective; {blame}"
    )
    verdict = StallVerdict(rhythm.newest_edge_s, silent_s, period, len(busy), gpus, suspect, idle, silent, reason)
    return dataclasses.replace(rhythm, stalled_at_s=now_s, unlocalised=rhythm.unlocalised + (not idle)), verdict


def detection_delay_s(period_s: float, policy: StallPolicy, check_every_s: float) -> float:
    """How long after a job's last edge `check` names its stall, checked every check_every_s (busy GPUs).

    Drives the real `observe` and `check` over a steady rhythm of ``min_steps`` steps; for a model
    (rasd-sim goodput) that must not re-derive the rule.
    """
    steps = [index * period_s for index in range(policy.min_steps)]
    rhythm = observe(Rhythm(), steps, steps[-1], policy=policy)
    busy = {f"GPU-{index}": GpuNow(100, 120.0, 700.0) for index in range(8)}
    now_s = steps[-1]
    while True:
        now_s += check_every_s
        rhythm, verdict = check(rhythm, busy, now_s=now_s, policy=policy)
        if verdict is not None:
            return now_s - steps[-1]
