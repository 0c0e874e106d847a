"""Compute → communication edges in a GPU's power series: when each rank's draw falls from its compute level.

In a step-synchronous job every rank falls from its compute draw to its communication draw when its
compute ends; a slow rank falls later than the others, step after step, by about its slowdown
(issue #40). This finds those falling edges in sampled power, to sub-sample precision: the crossing
of a threshold between the two levels, interpolated linearly between the samples on either side.

On the node (`interval_edges`), each summary interval's samples are searched with what the last
interval left (`EdgeCarry`): the GPU's last sample, so that a fall between two intervals' samples is
found once, in the later one; and its recent samples, whose 10th and 90th percentiles set its levels
(one interval of a 2 s step may hold only compute samples).

Pure: arrays in, arrays out; no clock, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rasd.agent.core import model

if TYPE_CHECKING:
    import numpy as np

MAX_EDGES_PER_SUMMARY = 8
"""Edges one GPU sends per summary at most (the newest); a 1 s summary of a step job holds one or two."""
HISTORY_SAMPLES = 100
"""Recent samples per GPU its levels are taken from: 10 s at 10 Hz, several steps of a training job."""
MIN_SWING_W = 100.0
"""Below this gap between a GPU's levels it has no step swing (idle, steady load): no edges, not noise."""
MIN_HISTORY_SAMPLES = 40
"""No edges until a GPU has this many recent samples (4 s at 10 Hz, two steps): levels taken from the
first few samples of a job are off, and edges found against them lag or lead for seconds."""
MAX_CARRY_GAP_NS = 1_000_000_000
"""A last sample older than this before the next one is not bridged (a sampling outage, not an edge)."""


def midpoint_w(draws_w: np.ndarray) -> np.ndarray:
    """Per GPU (column), the level halfway between its low (10th percentile) and high (90th) draw, W.

    Example: a column alternating 680 W and 120 W → 400 W.
    """
    import numpy as np  # here, not at the top: the agent uses only interval_edges, and numpy costs it MiBs

    low, high = np.percentile(draws_w, [10.0, 90.0], axis=0)
    return (low + high) / 2.0


def falling_edges(times_s: np.ndarray, draws_w: np.ndarray, threshold_w: np.ndarray) -> list[np.ndarray]:
    """Per GPU, the times its draw fell through its threshold, in order, seconds.

    Args:
        times_s: the sample times, shape (samples,), increasing.
        draws_w: the samples, shape (samples, gpus).
        threshold_w: each GPU's threshold, shape (gpus,) (`midpoint_w`).

    Returns:
        One array per GPU: the interpolated crossing times of each fall from ≥ threshold to < threshold.

    Example: samples 680, 680, 120 W at 0.0, 0.1, 0.2 s with threshold 400 W → [0.15]
    (the crossing lies (680 - 400) / (680 - 120) = 0.5 of the way from 0.1 to 0.2).
    """
    import numpy as np  # see midpoint_w

    if draws_w.ndim != 2 or draws_w.shape[0] != times_s.shape[0]:
        raise ValueError(f"draws_w must be (samples, gpus) with {times_s.shape[0]} samples, got {draws_w.shape}")
    above = draws_w >= threshold_w
    falls = above[:-1] & ~above[1:]
    sample, gpu = np.nonzero(falls)
    before, after = draws_w[sample, gpu], draws_w[sample + 1, gpu]
    fraction = (before - threshold_w[gpu]) / (before - after)
    at = times_s[sample] + fraction * (times_s[sample + 1] - times_s[sample])
    order = np.lexsort((at, gpu))
    gpu, at = gpu[order], at[order]
    bounds = np.searchsorted(gpu, np.arange(draws_w.shape[1] + 1))
    return [at[bounds[i] : bounds[i + 1]] for i in range(draws_w.shape[1])]


@dataclasses.dataclass(frozen=True, slots=True)
class GpuEdgeState:
    """One GPU's part of the carry: its last sample, its recent draws and the threshold they set."""

    last_unix_ns: int
    last_w: float
    recent_w: tuple[float, ...]
    """Its newest `HISTORY_SAMPLES` draws, W."""
    threshold_w: float | None
    """Midway between its levels; None: no step swing (the levels lie under `MIN_SWING_W` apart)."""
    since_threshold: int
    """Samples added since the threshold was set (it is set again after `REFRESH_SAMPLES`)."""


REFRESH_SAMPLES = 50
"""The levels are taken again after this many new samples: a percentile per GPU per summary cost
more than the summary itself (a rasd-sim fleet runs thousands of agents in a few processes)."""


@dataclasses.dataclass(frozen=True, slots=True)
class EdgeCarry:
    """What the next interval's edge search needs of this one: GPU -> its `GpuEdgeState`."""

    gpus: Mapping[str, GpuEdgeState] = dataclasses.field(default_factory=dict)


def interval_edges(
    samples: Sequence[model.PowerSamples], carry: EdgeCarry
) -> tuple[dict[str, tuple[int, ...]], EdgeCarry]:
    """Per GPU, the falling edges (Unix ns) in this interval's samples, and the carry for the next.

    Example: a GPU whose last sample was 680 W at t = 0.9 s and whose next is 120 W at 1.0 s, levels
    120 and 680 W: one edge at 0.95 s, sent in this interval (the last one could not see it).
    """
    states = dict(carry.gpus)
    found: dict[str, tuple[int, ...]] = {}
    for gpu in samples:
        if not gpu.watts:
            continue
        old = states.get(gpu.gpu_uuid)
        recent = ((old.recent_w if old else ()) + tuple(gpu.watts))[-HISTORY_SAMPLES:]
        threshold, since = (old.threshold_w, old.since_threshold + len(gpu.watts)) if old else (None, REFRESH_SAMPLES)
        if threshold is None or since >= REFRESH_SAMPLES:  # no swing yet: looked for again every interval
            threshold, since = _threshold_w(recent), 0
        times, watts = list(gpu.times_unix_ns), list(gpu.watts)
        if old is not None and 0 <= times[0] - old.last_unix_ns <= MAX_CARRY_GAP_NS:
            times.insert(0, old.last_unix_ns)
            watts.insert(0, old.last_w)
        if threshold is not None:
            edges = _falls_ns(times, watts, threshold)[-MAX_EDGES_PER_SUMMARY:]
            if edges:
                found[gpu.gpu_uuid] = edges
        states[gpu.gpu_uuid] = GpuEdgeState(times[-1], watts[-1], recent, threshold, since)
    return found, EdgeCarry(states)


def _threshold_w(recent_w: Sequence[float]) -> float | None:
    if len(recent_w) < MIN_HISTORY_SAMPLES or max(recent_w) - min(recent_w) < MIN_SWING_W:  # no percentile needed
        return None
    ordered = sorted(recent_w)
    low, high = percentile(ordered, 10.0), percentile(ordered, 90.0)
    return (low + high) / 2.0 if high - low >= MIN_SWING_W else None


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of ordered (sorted, not empty), interpolated linearly as numpy's default.

    In Python: for the hundred samples of one GPU, sorting them costs less than numpy's call.
    """
    position = (len(ordered) - 1) * q / 100.0
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def _falls_ns(times: Sequence[int], watts: Sequence[float], threshold_w: float) -> tuple[int, ...]:
    """`falling_edges` for one short series in Python (a few samples: numpy's overhead would dominate)."""
    out = []
    for k in range(len(watts) - 1):
        before, after = watts[k], watts[k + 1]
        if before >= threshold_w > after:
            out.append(times[k] + round((before - threshold_w) / (before - after) * (times[k + 1] - times[k])))
    return tuple(out)
