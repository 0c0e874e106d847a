"""Compute → communication edges in a GPU's power series: when each rank's draw falls from its compute level.

In a step-synchronous job every rank falls from its compute draw to its communication draw when its
compute ends; a slow rank falls later than the others, step after step, by about its slowdown
(issue #40). This finds those falling edges in sampled power, to sub-sample precision: the crossing
of a threshold between the two levels, interpolated linearly between the samples on either side.

Pure: arrays in, arrays out; no clock, no I/O.
"""

from __future__ import annotations

import numpy as np


def midpoint_w(draws_w: np.ndarray) -> np.ndarray:
    """Per GPU (column), the level halfway between its low (10th percentile) and high (90th) draw, W.

    Example: a column alternating 680 W and 120 W → 400 W.
    """
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
