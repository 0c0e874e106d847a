"""Straggler trials on rasd-sim's job model: power traces of a step-synchronous job, one GPU slowed, edges judged.

The job is `rasd.agent.gpu.step_job.StepJob`, the one behind rasd-sim's simulated GPUs (per-rank
levels 650-700 W compute, 100-150 W communication, 5-20 ms start jitter redrawn every step, the step
waiting for its slowest rank). A straggler is one rank capped to demand / (1 + slowdown): its compute
phase lasts (1 + slowdown) times as long (the job's DVFS model; a power brake or thermal clamp
looks the same). Each node samples its GPUs' instant draw at ``sample_hz`` on its own phase (one
of ten offsets within the sample period), with ±``noise_w`` of uniform measurement noise, as the
simulated backend adds.

Each GPU's falling edges come from `rasd.agent.core.power_edges`; each step's edges go through
`rasd.controller.core.straggler.observe_step`. A trial reports after how many steps the straggler was
named and which other GPUs were (false positives).
"""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np

from rasd.agent.core import power_edges
from rasd.agent.gpu import step_job
from rasd.controller.core import straggler

PHASES = 10
"""Distinct sampling phases among the nodes (each node's sample clock is offset by k / PHASES of a period)."""


@dataclasses.dataclass(frozen=True)
class Trial:
    """One run: the job, the straggler (slowdown 0: a clean run), how long, how it is sampled."""

    gpus: int = 1024
    gpus_per_node: int = 8
    steps: int = 100
    slowdown: float = 0.05
    seed: int = 0
    sample_hz: float = 10.0
    noise_w: float = 8.0
    period_s: float = 2.0
    compute_fraction: float = 0.7
    chunk_s: float = 100.0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a trial found."""

    straggler: str
    """The slowed GPU ("" in a clean run)."""
    steps_to_localise: int | None
    """Steps judged until it was named; None when it was not."""
    false_positives: tuple[str, ...]
    steps_judged: int
    gpu_hours: float


def gpu_uuid(rank: int) -> str:
    """The trial's name for a rank's GPU."""
    return f"GPU-{rank:05d}"


def _job(trial: Trial, rng: np.random.Generator) -> tuple[step_job.StepJob, int]:
    shape = step_job.JobShape(
        period_s=trial.period_s,
        compute_fraction=trial.compute_fraction,
        rank_jitter_s=(0.005, 0.020),
        anchor_unix_s=0.0,
    )
    job = step_job.StepJob(shape, trial.seed)
    compute_w = rng.uniform(650.0, 700.0, trial.gpus)
    job.add_ranks(compute_w, rng.uniform(100.0, 150.0, trial.gpus), [700.0] * trial.gpus)
    slow = int(rng.integers(trial.gpus)) if trial.slowdown > 0 else -1
    if slow >= 0:
        job.set_cap(slow, compute_w[slow] / (1.0 + trial.slowdown), at_s=0.0)
    return job, slow


def _edges(trial: Trial, job: step_job.StepJob, rng: np.random.Generator, end_s: float) -> list[np.ndarray]:
    """Every GPU's falling edges over [0, end_s), sampled per node phase, chunk by chunk."""
    dt = 1.0 / trial.sample_hz
    node_phase = rng.integers(PHASES, size=trial.gpus // trial.gpus_per_node)
    found: list[list[np.ndarray]] = [[] for _ in range(trial.gpus)]
    for phase in range(PHASES):
        ranks = np.flatnonzero(np.repeat(node_phase, trial.gpus_per_node) == phase)
        if not ranks.size:
            continue
        times = np.arange(phase * dt / PHASES, end_s, dt)
        per_chunk = max(2, int(trial.chunk_s / dt))
        threshold: np.ndarray | None = None
        for first in range(0, len(times) - 1, per_chunk):
            chunk = times[first : first + per_chunk + 1]  # one sample shared with the next chunk: no pair lost
            draws = np.stack([job.draw_w(ranks, float(t)) for t in chunk])
            draws += rng.uniform(-trial.noise_w, trial.noise_w, draws.shape)
            if threshold is None:
                threshold = power_edges.midpoint_w(draws)
            for rank, edges in zip(ranks, power_edges.falling_edges(chunk, draws, threshold), strict=True):
                found[rank].append(edges)
    return [np.concatenate(parts) if parts else np.zeros(0) for parts in found]


def run(trial: Trial, policy: straggler.StragglerPolicy) -> Outcome:
    """Simulate the trial's steps, find the edges, judge them step by step."""
    rng = np.random.default_rng(trial.seed)
    job, slow = _job(trial, rng)
    end_s = (trial.steps + 2) * trial.period_s * 1.05
    edges = _edges(trial, job, rng, end_s)
    starts = [s.start_s for s in job.steps]
    by_step: dict[int, dict[str, float]] = {}
    for rank, times in enumerate(edges):
        for at in times:
            by_step.setdefault(bisect.bisect_right(starts, at) - 1, {})[gpu_uuid(rank)] = float(at)
    state = straggler.StragglerState()
    found_at: int | None = None
    false_positives: list[str] = []
    judged = [k for k in sorted(by_step) if 1 <= k < len(starts) - 1][: trial.steps]  # whole steps, after the first
    for k in judged:
        state, verdicts = straggler.observe_step(state, by_step[k], policy=policy)
        for verdict in verdicts:
            if verdict.gpu_uuid == gpu_uuid(slow):
                found_at = state.steps_judged if found_at is None else found_at
            else:
                false_positives.append(verdict.gpu_uuid)
    span_s = (job.steps[judged[-1]].end_s - job.steps[judged[0]].start_s) if judged else 0.0
    return Outcome(
        straggler=gpu_uuid(slow) if slow >= 0 else "",
        steps_to_localise=found_at,
        false_positives=tuple(false_positives),
        steps_judged=len(judged),
        gpu_hours=trial.gpus * span_s / 3600.0,
    )
