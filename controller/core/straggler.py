"""The straggler verdict: which GPU's compute → communication edge lags the job's, step after step (issue #40).

In a step-synchronous job every step waits for its slowest rank. Each step, every GPU's falling edge
(the end of its compute, `rasd.agent.core.power_edges`) is compared with the job's median edge; the
difference is its lag. A GPU a few percent slow lags by about that share of the compute phase, every
step; a healthy one lags by its own jitter and the sampling error, around zero. A whole job that slows
down lags nowhere: it is never a straggler here.

Each GPU keeps a one-sided CUSUM of its lag: ``score ← max(0, score + (lag − allowance_s) / spread)``
where spread is the step's robust spread of lags over the job's GPUs (1.4826 × MAD, at least
``min_spread_s``). The score climbs by about (slowdown lag − allowance) / spread per step and decays
otherwise; at ``threshold`` the GPU is a suspect. A shift twice the allowance crosses a threshold h
in about h / (shift / spread − allowance / spread) steps; noise alone very rarely does (the false
alarm interval of a CUSUM grows about exponentially with h).

The verdict names the mean lag while the score climbed and the corroborating signals the caller
gives for that GPU, or says there was none: `gpu_signals` (slowing clock event reasons, the
temperature beside a thermal one, a PCIe link below its best width or generation) and
`node_wide_signal` (every GPU of its node lagging: a host-side cause), which `with_evidence` names.

Online (the controller's `rasd.controller.stragglers`), edges arrive per node per summary, in no
order across nodes: `complete_steps` cuts the pending edges of a job into steps where consecutive
edges lie more than ``gap_s`` apart (a step's edges lie within its jitter and its stragglers' lag,
tens to hundreds of ms; steps are seconds apart) and hands out a step once an edge ``settle_s``
later has arrived (by then every node's summary of that step is in). `clock_signals` names the clock
event reasons that corroborate a slow GPU.

Pure: values in, values out; ``now`` is not needed (steps are the clock, edge times the agents').
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from rasd.controller.core import fleet

MAD_TO_SIGMA = 1.4826


@dataclasses.dataclass(frozen=True)
class StragglerPolicy:
    """How much lag, for how long, makes a suspect."""

    allowance_s: float = 0.014
    """Lag per step that never adds to the score: half a 2 % straggler's lag on a 1.4 s compute phase."""
    threshold: float = 16.0
    """Score (in units of the step's lag spread) at which the GPU is a suspect."""
    min_spread_s: float = 0.005
    """Floor under the step's lag spread (a job whose edges all agree would divide by nearly zero)."""
    min_gpus: int = 8
    """Steps with fewer GPUs' edges are not judged: their median says little."""

    def __post_init__(self) -> None:
        """Reject values that cannot mean anything, naming the field."""
        for name in ("allowance_s", "threshold", "min_spread_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.min_gpus < 3:
            raise ValueError(f"min_gpus: must be >= 3, got {self.min_gpus}")


@dataclasses.dataclass(frozen=True)
class Track:
    """One GPU's score and the lags since it last stood at zero."""

    score: float = 0.0
    lag_sum_s: float = 0.0
    steps: int = 0


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A GPU found to lag: its score, its mean lag while the score climbed, and why."""

    gpu_uuid: str
    score: float
    mean_lag_s: float
    steps: int
    """Steps since its score last stood at zero."""
    reason: str


@dataclasses.dataclass(frozen=True)
class StragglerState:
    """Every GPU's track, and the suspects already named (each is named once)."""

    tracks: Mapping[str, Track] = dataclasses.field(default_factory=dict)
    suspects: frozenset[str] = frozenset()
    steps_judged: int = 0


def step_lags(edges_s: Mapping[str, float]) -> dict[str, float]:
    """Each GPU's edge minus the median edge of the step, seconds."""
    median = statistics.median(edges_s.values())
    return {gpu: at - median for gpu, at in edges_s.items()}


def _spread_s(lags: Sequence[float], floor_s: float) -> float:
    median = statistics.median(lags)
    mad = statistics.median(abs(lag - median) for lag in lags)
    return max(floor_s, MAD_TO_SIGMA * mad)


def observe_step(
    state: StragglerState,
    edges_s: Mapping[str, float],
    *,
    policy: StragglerPolicy,
    signals: Mapping[str, Sequence[str]] | None = None,
) -> tuple[StragglerState, tuple[Verdict, ...]]:
    """One step's edges (GPU → time of its compute → communication edge, s): the new state and new suspects.

    Example: 64 GPUs whose edges agree within a few ms and one 70 ms late every step (a 5 % straggler
    on a 1.4 s compute phase): its score climbs by about (70 - 14) / 5 = 11 per step, so the second
    step names it; "GPU-x lags the job's median edge by 70 ms over 2 steps (score 22); no
    corroborating signal".

    Args:
        state: the tracks so far.
        edges_s: this step's edge per GPU; a GPU absent this step keeps its track unchanged.
        policy: the thresholds.
        signals: per GPU, corroborating evidence to name in its verdict.

    Returns:
        The new state and the GPUs that became suspects at this step.
    """
    if len(edges_s) < policy.min_gpus:
        return state, ()
    lags = step_lags(edges_s)
    spread = _spread_s(list(lags.values()), policy.min_spread_s)
    tracks = dict(state.tracks)
    new: list[Verdict] = []
    for gpu, lag in lags.items():
        old = tracks.get(gpu, Track())
        score = max(0.0, old.score + (lag - policy.allowance_s) / spread)
        track = Track(score, old.lag_sum_s + lag, old.steps + 1) if score > 0 else Track()
        tracks[gpu] = track
        if score >= policy.threshold and gpu not in state.suspects:
            new.append(_verdict(gpu, track, (signals or {}).get(gpu, ())))
    suspects = state.suspects | {v.gpu_uuid for v in new}
    return StragglerState(tracks, suspects, state.steps_judged + 1), tuple(new)


def forget(state: StragglerState, gpu_uuid: str) -> StragglerState:
    """The state with gpu_uuid's score reset and its suspect cleared: it can be named again (issue #40 item 3)."""
    tracks = {gpu: track for gpu, track in state.tracks.items() if gpu != gpu_uuid}
    return StragglerState(tracks, state.suspects - {gpu_uuid}, state.steps_judged)


def _verdict(gpu: str, track: Track, evidence: Sequence[str]) -> Verdict:
    return with_evidence(Verdict(gpu, track.score, track.lag_sum_s / track.steps, track.steps, ""), evidence)


def with_evidence(verdict: Verdict, evidence: Sequence[str]) -> Verdict:
    """The verdict with its reason naming this evidence (or "no corroborating signal").

    For a caller that gathers evidence only for the GPUs a step named (`gpu_signals`,
    `node_wide_signal`), not for every GPU of every step.
    """
    corroborated = "; ".join(evidence) if evidence else "no corroborating signal"
    reason = (
        f"{verdict.gpu_uuid} lags the job's median edge by {verdict.mean_lag_s * 1000:.0f} ms over "
        f"{verdict.steps} steps (score {verdict.score:.0f}); {corroborated}"
    )
    return dataclasses.replace(verdict, reason=reason)


@dataclasses.dataclass(frozen=True)
class StepGrouping:
    """How pending edges are cut into steps (see the module doc)."""

    gap_s: float = 0.5
    """Edges further apart than this belong to different steps: below the job's communication phase."""
    settle_s: float = 3.0
    """A step is complete once an edge this much later has arrived (a few summary intervals)."""
    max_pending: int = 200_000
    """Pending edges kept at most (the newest): a job that stopped leaves its last edges here."""

    def __post_init__(self) -> None:
        """Reject values that cannot mean anything, naming the field."""
        for name in ("gap_s", "settle_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.max_pending < 1:
            raise ValueError(f"max_pending: must be >= 1, got {self.max_pending}")


def complete_steps(
    pending: Sequence[tuple[float, str]], grouping: StepGrouping
) -> tuple[list[dict[str, float]], list[tuple[float, str]]]:
    """The complete steps among the pending (edge time s, GPU) pairs, oldest first, and the pairs left pending.

    In each step a GPU counts with its first edge. Example: edges at 1.00, 1.02, 1.09 s (three
    GPUs), then 3.01 s and 4.0 s with settle 3 s: nothing is complete yet; once an edge at 4.5 s has
    arrived, the step {1.00, 1.02, 1.09} is.
    """
    ordered = sorted(pending)
    if not ordered:
        return [], []
    newest_s = ordered[-1][0]
    steps: list[dict[str, float]] = []
    start = 0
    for index in range(1, len(ordered) + 1):
        if index < len(ordered) and ordered[index][0] - ordered[index - 1][0] <= grouping.gap_s:
            continue
        if ordered[index - 1][0] > newest_s - grouping.settle_s:
            break
        step: dict[str, float] = {}
        for at_s, gpu in ordered[start:index]:
            step.setdefault(gpu, at_s)
        steps.append(step)
        start = index
    return steps, ordered[start:][-grouping.max_pending :]


# NVML clock event reasons that slow a GPU's clocks below what its load asks (nvmlClocksEventReason*);
# the SW power cap bit is left out: it follows every training step of a capped job.
_SLOWING_REASONS = (
    (0x8, "hardware slowdown"),
    (0x20, "software thermal slowdown"),
    (0x40, "hardware thermal slowdown"),
    (0x80, "hardware power brake"),
)


def clock_signals(clock_event_reasons: int | None) -> tuple[str, ...]:
    """The slowing clock event reasons set in a GPU's bitmask, as evidence ("clock event: ...").

    Example: 0x44 → ("clock event: hardware thermal slowdown",).
    """
    if not clock_event_reasons:
        return ()
    return tuple(f"clock event: {name}" for bit, name in _SLOWING_REASONS if clock_event_reasons & bit)


_THERMAL_BITS = 0x20 | 0x40


def gpu_signals(
    clock_event_reasons: int | None, temperature_c: int | None, pcie_link: fleet.PcieLink | None
) -> tuple[str, ...]:
    """What one GPU's latest values say about why it is slow: slowing clock reasons, how hot, its PCIe link.

    The temperature is named only beside a thermal reason; the link only when it runs below its best
    (fewer lanes, or a lower generation: under load, as a straggler is, not the idle power saving).
    Example: reasons 0x20, 88 C, link x4 of x16 → ("clock event: software thermal slowdown",
    "temperature 88 C", "PCIe link x4 of x16").
    """
    signals = list(clock_signals(clock_event_reasons))
    if clock_event_reasons and clock_event_reasons & _THERMAL_BITS and temperature_c is not None:
        signals.append(f"temperature {temperature_c} C")
    if pcie_link is not None and pcie_link.downtrained:
        if pcie_link.width < pcie_link.width_max:
            signals.append(f"PCIe link x{pcie_link.width} of x{pcie_link.width_max}")
        if pcie_link.gen < pcie_link.gen_max:
            signals.append(f"PCIe link Gen{pcie_link.gen} of Gen{pcie_link.gen_max}")
    return tuple(signals)


def node_wide_signal(
    node_id: str, node_gpus: Sequence[str], state: StragglerState, policy: StragglerPolicy
) -> tuple[str, ...]:
    """Evidence that a suspect's whole node lags: every GPU of it judged so far climbs (or was named).

    A cause off the GPUs (host CPU, memory, NIC, data loader) slows every GPU of its node alike and
    shows no GPU signal. Each of the node's GPUs is named as it crosses the threshold; this says why.
    "Climbs": a score of at least a quarter of the threshold (a clean GPU's CUSUM stays near zero).
    A node with fewer than 2 judged GPUs says nothing; nor does a whole job that slows (nobody lags).
    Example: node-3 with 8 GPUs all above 4 → ("node-wide: all 8 GPUs of node-3 lag (a host-side
    cause: CPU, memory, NIC or data loader)",).
    """
    judged = [gpu for gpu in node_gpus if gpu in state.tracks]
    if len(judged) < 2:
        return ()
    floor = policy.threshold / 4
    if any(state.tracks[gpu].score < floor and gpu not in state.suspects for gpu in judged):
        return ()
    return (f"node-wide: all {len(judged)} GPUs of {node_id} lag (a host-side cause: CPU, memory, NIC or data loader)",)
