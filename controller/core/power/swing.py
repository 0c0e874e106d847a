"""Swing detection on aggregate power, and the smoothing policy math that answers it.

This module owns two things:

- the *detector*: from a uniformly sampled aggregate power series (10 Hz from the agents) it measures
  the dominant period, peak-to-peak amplitude, cross-node coherence, the largest |dP/dt| over 1 s and
  60 s, and the power in the grid-sensitive 0.1-2 Hz band (Welch PSD), which is what
  `band_power_attenuation_db` compares;
- the *policy math*: given a detected swing and the policy's target, the GPU power-smoothing profile
  (floor %, ramp-up/down W/s, hysteresis) where the firmware supports it, the emulation parameters
  elsewhere (job start/end cap slew, trough-filler floor, peak cap), the aggregate ramp-rate limit
  applied to cap raises, and the analytic minimum energy a floor costs.

A floor F clips the trough of a step-synchronous square wave: the swing falls from (peak - trough)
to (peak - max(F, trough)), its shape is unchanged, so every in-band harmonic falls by the same
factor and the band power by its square. The least energy that can buy this is
sum(max(F - p(t), 0)) dt over each GPU's unmanaged draw p(t): exactly the energy the floor adds
when it acts instantly.

Pure: no I/O, no logging, no clock reads; inputs are arrays and numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from rasd.controller.core.power import policy as power_policy


@dataclasses.dataclass(frozen=True)
class SwingReport:
    """What the detector saw in one window of aggregate power."""

    sample_hz: float
    duration_s: float
    mean_w: float
    p2p_w: float
    """Peak-to-peak amplitude: max - min over the window, W."""
    peak_w: float
    """High level of the swing: 98th percentile, W (robust to a single spike)."""
    trough_w: float
    """Low level of the swing: 2nd percentile, W."""
    trough_fraction: float
    """Share of samples in the lower half of the swing (the communication phase's duty)."""
    dominant_freq_hz: float | None
    """Frequency of the strongest spectral peak above `min_freq_hz`; None for a flat series."""
    period_s: float | None
    coherence: float | None
    """Mean pairwise correlation of the per-node series (1 = in step, 0 = independent); None
    without at least two node series."""
    max_ramp_1s_w_per_s: float | None
    """Largest |P(t + 1 s) - P(t)| / 1 s; None when the window is shorter than 1 s."""
    max_ramp_60s_w_per_s: float | None
    """Largest |P(t + 60 s) - P(t)| / 60 s; None when the window is shorter than 60 s."""
    band_power_w2: float
    """Power (variance) of the series within [band_low_hz, band_high_hz], W^2."""


@dataclasses.dataclass(frozen=True)
class SmoothingPlan:
    """The smoothing to apply now; per-GPU figures unless named aggregate."""

    active: bool
    """False when the swing is below target, too small, or incoherent (nothing to pay for)."""
    mode: str
    """"firmware" (GPU power-smoothing profile), "emulated" (caps and the trough-filler hook), or "off"."""
    floor_w: float
    floor_pct: float
    """floor_w as % of TDP, for the profile's PERCENT_TMP_FLOOR."""
    ramp_up_w_per_s: float
    ramp_down_w_per_s: float
    ramp_down_hysteresis_ms: float
    job_ramp_w_per_s: float
    """Per-GPU cap slew at job start and end, so the aggregate stays within the ramp-rate limit."""
    trough_filler_w: float | None
    """Emulation: the floor the node-side trough-filler hook should hold; None when not used."""
    peak_cap_w: float | None
    """Emulation: a cap on the compute peak (costs step time); None when not used."""
    expected_p2p_w: float
    """Aggregate peak-to-peak swing expected with this plan, W."""
    expected_attenuation_db: float
    """Expected fall of in-band power, dB (20 log10 of the swing ratio)."""
    expected_energy_overhead_pct: float
    """Analytic minimum energy overhead of the floor, % of unmanaged energy."""
    reason: str


# Detector ------------------------------------------------------------------------------------------


def welch_psd(series_w: np.ndarray, sample_hz: float, *, segment_s: float = 40.0) -> tuple[np.ndarray, np.ndarray]:
    """One-sided power spectral density by Welch's method (Hann window, 50 % overlap, mean removed).

    Args:
        series_w: Uniformly sampled power, W.
        sample_hz: Sampling rate, Hz.
        segment_s: Segment length, s; 40 s resolves 0.025 Hz, enough for the 0.1 Hz band edge. Series
            shorter than a segment use one segment of their own length.

    Returns:
        (frequencies Hz, PSD W^2/Hz). Integrating the PSD over all frequencies gives the variance.
    """
    x = np.asarray(series_w, dtype=np.float64)
    n = len(x)
    seg = max(2, min(n, round(segment_s * sample_hz)))
    hop = max(1, seg // 2)
    starts = np.arange(0, n - seg + 1, hop)
    window = np.hanning(seg + 2)[1:-1]  # no zero end points, so short segments keep their energy
    frames = np.lib.stride_tricks.sliding_window_view(x, seg)[starts]
    frames = frames - frames.mean(axis=1, keepdims=True)
    spectrum = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    psd = spectrum.mean(axis=0) / (sample_hz * np.sum(window**2))
    psd[1:] *= 2.0
    if seg % 2 == 0:
        psd[-1] /= 2.0  # the Nyquist bin has no negative-frequency twin
    return np.fft.rfftfreq(seg, d=1.0 / sample_hz), psd


def band_power(series_w: np.ndarray, sample_hz: float, low_hz: float, high_hz: float) -> float:
    """Power (variance) of `series_w` within [low_hz, high_hz], W^2, from the Welch PSD."""
    freqs, psd = welch_psd(series_w, sample_hz)
    df = freqs[1] - freqs[0] if len(freqs) > 1 else 0.0
    band = (freqs >= low_hz) & (freqs <= high_hz)
    return float(psd[band].sum() * df)


def attenuation_db(unmanaged_w2: float, managed_w2: float) -> float:
    """10 log10(unmanaged / managed) band power; +inf when the managed band is empty."""
    if managed_w2 <= 0:
        return math.inf if unmanaged_w2 > 0 else 0.0
    if unmanaged_w2 <= 0:
        return -math.inf
    return 10.0 * math.log10(unmanaged_w2 / managed_w2)


def max_ramp_w_per_s(series_w: np.ndarray, sample_hz: float, window_s: float) -> float | None:
    """Largest |P(t + window) - P(t)| / window over the series, W/s; None if shorter than the window."""
    lag = round(window_s * sample_hz)
    x = np.asarray(series_w, dtype=np.float64)
    if lag < 1 or len(x) <= lag:
        return None
    return float(np.max(np.abs(x[lag:] - x[:-lag])) / window_s)


def coherence(node_series_w: np.ndarray) -> float | None:
    """Weighted mean pairwise correlation of per-node power series (rows = nodes).

    Computed from variances alone, O(nodes x samples): (Var(sum) - sum Var) / ((sum sigma)^2 -
    sum sigma^2). 1 when every node swings in step, near 0 when they are independent, negative when
    they cancel. None with fewer than two swinging nodes.
    """
    x = np.asarray(node_series_w, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        return None
    xc = x - x.mean(axis=1, keepdims=True)
    var_each = np.mean(xc**2, axis=1)
    sigma = np.sqrt(var_each)
    denom = sigma.sum() ** 2 - var_each.sum()
    if denom <= 0:
        return None
    var_total = np.mean(xc.sum(axis=0) ** 2)
    return float(np.clip((var_total - var_each.sum()) / denom, -1.0, 1.0))


def dominant_frequency(series_w: np.ndarray, sample_hz: float, *, min_freq_hz: float = 0.05) -> float | None:
    """Frequency of the strongest spectral peak at or above `min_freq_hz`, Hz (None for a flat series).

    Uses one Hann-windowed periodogram of the whole series, refined by parabolic interpolation of the
    log magnitude around the peak bin.
    """
    x = np.asarray(series_w, dtype=np.float64)
    n = len(x)
    if n < 4:
        return None
    spec = np.abs(np.fft.rfft((x - x.mean()) * np.hanning(n)))
    freqs = np.fft.rfftfreq(n, d=1.0 / sample_hz)
    usable = np.flatnonzero(freqs >= min_freq_hz)
    if len(usable) == 0 or spec[usable].max() <= 1e-9 * max(1.0, np.abs(x).max()) * n:
        return None
    k = int(usable[np.argmax(spec[usable])])
    if 0 < k < len(spec) - 1:
        a, b, c = np.log(spec[k - 1 : k + 2] + 1e-300)
        denom = a - 2 * b + c
        shift = 0.5 * (a - c) / denom if denom != 0 else 0.0
        return float((k + np.clip(shift, -0.5, 0.5)) * (freqs[1] - freqs[0]))
    return float(freqs[k])


def detect(
    aggregate_w: np.ndarray,
    sample_hz: float,
    *,
    node_series_w: np.ndarray | None = None,
    policy: power_policy.PowerPolicy,
) -> SwingReport:
    """Measure the swing in one window of aggregate power.

    Example: 60 s at 10 Hz of 1,024 GPUs in step, 675 W for 0.7 s and 125 W for 0.3 s of every 1 s
    step -> p2p 563,200 W, dominant period 1.0 s, trough_fraction 0.3, coherence 1.0 (per-node series
    given), max_ramp_1s 0 W/s (every 1 s lag lands on the same phase), band power about 5.7e10 W^2
    (the 1 Hz fundamental and its 2 Hz harmonic).

    Args:
        aggregate_w: Cluster (or domain) power, uniformly sampled, W.
        sample_hz: Sampling rate, Hz.
        node_series_w: Optional per-node series (rows = nodes, same sampling) for coherence.
        policy: Band edges.

    Returns:
        The report.

    Raises:
        ValueError: Fewer than 4 samples, or a non-positive rate.
    """
    x = np.asarray(aggregate_w, dtype=np.float64)
    if len(x) < 4 or sample_hz <= 0:
        raise ValueError("swing detection needs at least 4 samples and a positive sample rate")
    lo_w, hi_w = float(x.min()), float(x.max())
    peak, trough = (float(v) for v in np.percentile(x, [98.0, 2.0]))
    freq = dominant_frequency(x, sample_hz, min_freq_hz=min(0.05, policy.band_low_hz))
    return SwingReport(
        sample_hz=sample_hz,
        duration_s=len(x) / sample_hz,
        mean_w=float(x.mean()),
        p2p_w=hi_w - lo_w,
        peak_w=peak,
        trough_w=trough,
        trough_fraction=float(np.mean(x < (peak + trough) / 2.0)) if peak > trough else 0.0,
        dominant_freq_hz=freq,
        period_s=1.0 / freq if freq else None,
        coherence=coherence(node_series_w) if node_series_w is not None else None,
        max_ramp_1s_w_per_s=max_ramp_w_per_s(x, sample_hz, 1.0),
        max_ramp_60s_w_per_s=max_ramp_w_per_s(x, sample_hz, 60.0),
        band_power_w2=band_power(x, sample_hz, policy.band_low_hz, policy.band_high_hz),
    )


def scaled_series(rows: Sequence[tuple[int, float, int]], full: int) -> np.ndarray:
    """Aggregate power per bucket (`fleet.PowerWindow.series` rows), each scaled up to the full GPU count.

    A busy agent can miss a 100 ms bucket; dropping every incomplete bucket would leave nothing at
    scale, and keeping it unscaled would show a dip that is not there. Buckets with fewer than half
    the GPUs are dropped.
    """
    return np.array([total * full / count for _, total, count in rows if count >= 0.5 * full])


# Energy -------------------------------------------------------------------------------------------


def floor_energy_overhead_j(power_w: np.ndarray, floor_w: float | np.ndarray, sample_hz: float) -> float:
    """The least extra energy a power floor costs: sum of max(floor - p, 0) over samples, J.

    Args:
        power_w: Unmanaged per-GPU draw, shape (samples,) or (gpus, samples), W.
        floor_w: The floor, W (scalar or one per GPU row).
        sample_hz: Sampling rate, Hz.

    Returns:
        Joules over all GPUs and samples.
    """
    p = np.asarray(power_w, dtype=np.float64)
    f = np.asarray(floor_w, dtype=np.float64)
    if p.ndim == 2 and f.ndim == 1:
        f = f[:, None]
    return float(np.maximum(f - p, 0.0).sum() / sample_hz)


def floor_energy_overhead_pct(power_w: np.ndarray, floor_w: float | np.ndarray, sample_hz: float) -> float:
    """`floor_energy_overhead_j` as % of the unmanaged energy of the same samples."""
    base = float(np.asarray(power_w, dtype=np.float64).sum() / sample_hz)
    return 100.0 * floor_energy_overhead_j(power_w, floor_w, sample_hz) / base if base > 0 else 0.0


def square_wave_floor_overhead_pct(peak_w: float, trough_w: float, trough_fraction: float, floor_w: float) -> float:
    """Analytic floor overhead for a two-level swing, % of its mean power.

    Example: 700 W for 70 %, 150 W for 30 % (mean 535 W), floor 560 W ->
    (560 - 150) x 0.3 / 535 = 23 %.
    """
    mean = peak_w * (1.0 - trough_fraction) + trough_w * trough_fraction
    extra = max(floor_w - trough_w, 0.0) * trough_fraction
    return 100.0 * extra / mean if mean > 0 else 0.0


# Ramp limits --------------------------------------------------------------------------------------


def slew_limit(previous_w: np.ndarray, target_w: np.ndarray, dt_s: float, ramp_w_per_s: float) -> np.ndarray:
    """Move each value from `previous_w` towards `target_w` by at most ramp x dt (job start/end caps)."""
    prev = np.asarray(previous_w, dtype=np.float64)
    step = ramp_w_per_s * dt_s
    return prev + np.clip(np.asarray(target_w, dtype=np.float64) - prev, -step, step)


def ramp_schedule(start_w: float, end_w: float, elapsed_s: np.ndarray | float, ramp_w_per_s: float) -> np.ndarray:
    """Cap at `elapsed_s` after a job start (or end) that ramps from start_w to end_w at ramp_w_per_s."""
    t = np.maximum(np.asarray(elapsed_s, dtype=np.float64), 0.0)
    direction = 1.0 if end_w >= start_w else -1.0
    moved = np.minimum(t * ramp_w_per_s, abs(end_w - start_w))
    return start_w + direction * moved


def limit_aggregate_raise(
    previous_caps_w: np.ndarray, new_caps_w: np.ndarray, dt_s: float, ramp_w_per_s: float
) -> np.ndarray:
    """Scale every raise by one common factor so the summed raise is at most ramp x dt, whole watts.

    Decreases pass unchanged (they only lower power). Because raises only shrink, a result of
    `power.allocate` stays within every budget.
    """
    prev = np.asarray(previous_caps_w, dtype=np.float64)
    new = np.asarray(new_caps_w, dtype=np.float64)
    rise = np.maximum(new - prev, 0.0)
    total = rise.sum()
    allowed = ramp_w_per_s * dt_s
    if total <= allowed:
        return new
    scaled = prev + np.floor(rise * (allowed / total))
    return np.where(rise > 0, scaled, new)


def apply_peak_cap(targets_w: np.ndarray, peak_cap_w: float, min_w: np.ndarray) -> np.ndarray:
    """Emulated smoothing's peak cap on a period's targets: min(target, peak cap), whole watts.

    Never below a GPU's minimum limit. It only lowers targets, so a result within every budget stays so.

    Example: targets (600, 450) W, peak cap 500 W, minimums 200 W -> (500, 450).
    """
    cap = np.maximum(np.floor(peak_cap_w), np.ceil(np.asarray(min_w, dtype=np.float64)))
    return np.minimum(np.asarray(targets_w), cap).astype(np.int64)


# Policy -------------------------------------------------------------------------------------------


def plan_smoothing(
    swing: SwingReport,
    *,
    n_gpus: int,
    tdp_w: float,
    firmware_supported: bool,
    policy: power_policy.PowerPolicy,
) -> SmoothingPlan:
    """Choose the smoothing for a detected swing.

    The floor is set so the swing meets the target (`swing_target_pct` of the detected swing, or
    `swing_target_w` if tighter), within the firmware's floor range. The ramp-up rate is the slowest
    one whose lost work per step stays under `step_time_cost_max_pct` of the period (DVFS model:
    work in proportion to power), so (peak - floor)^2 / (2 r peak) <= cost x period; ramp-down uses
    the same rate. The job start/end slew shares the aggregate ramp limit evenly over the GPUs.

    Example: 1,024 GPUs at 700 W TDP swinging 675 W <-> 125 W with period 1 s, trough 30 %, default
    policy (target 25 %) -> floor = 675 - 0.25 x 550 = 537.5 W (76.8 % of TDP), expected attenuation
    12 dB, energy overhead (537.5 - 125) x 0.3 / 510 = 24.3 %, ramp >= 137.5^2 / (2 x 0.005 x 1 x 675)
    = 2,801 W/s, job ramp 10,000 / 1,024 = 9.8 W/s.

    Args:
        swing: The detector's report on the GPUs' *unmanaged* aggregate power (measured before the
            smoothing was applied, e.g. at job start). Fed the managed swing, a relative target
            would ratchet the floor up every time it is re-planned.
        n_gpus: GPUs contributing to the aggregate.
        tdp_w: Their TDP (maximum power limit), W.
        firmware_supported: The GPUs support NVML power smoothing (Blackwell and newer).
        policy: Targets, limits, floor range and which emulations are allowed.

    Returns:
        The plan; `active` is False when no smoothing is worth its cost.
    """
    n = max(n_gpus, 1)
    peak = swing.peak_w / n
    trough = swing.trough_w / n
    level_swing = max(peak - trough, 0.0)
    job_ramp = policy.ramp_limit_w_per_s / n
    target_p2p = swing.p2p_w * policy.swing_target_pct / 100.0
    if policy.swing_target_w is not None:
        target_p2p = min(target_p2p, policy.swing_target_w)
    why_not = _not_worth_it(swing, level_swing, target_p2p, tdp_w, policy)
    if why_not is not None:
        return _inactive(swing, job_ramp, why_not)
    # Scale the per-GPU level swing by the same ratio as the aggregate target.
    wanted_swing = level_swing * target_p2p / swing.p2p_w
    floor_lo, floor_hi = tdp_w * policy.floor_min_pct / 100.0, tdp_w * policy.floor_max_pct / 100.0
    floor = float(np.clip(peak - wanted_swing, floor_lo, floor_hi))
    kept = peak - max(floor, trough)
    ratio = kept / level_swing if level_swing > 0 else 1.0
    overhead = square_wave_floor_overhead_pct(peak, trough, swing.trough_fraction, floor)
    ramp = max(_ramp_w_per_s(kept, peak, swing.period_s or 1.0, tdp_w, policy), job_ramp)
    mode = _mode(firmware_supported, policy)
    if mode is None:
        why = "no firmware smoothing and no trough filler or peak cap allowed: only job ramps apply"
        return _inactive(swing, job_ramp, why)
    filler, peak_cap = (floor if mode == "trough filler" else None), None
    if mode == "peak cap":
        # Without a floor the only lever is the peak: cap it so the swing meets the target (costs time).
        peak_cap = float(max(trough + wanted_swing, 0.0))
        floor, overhead = 0.0, 0.0
        kept = min(peak_cap, peak) - trough
        ratio = kept / level_swing if level_swing > 0 else 1.0
    return SmoothingPlan(
        active=True,
        mode="firmware" if mode == "firmware" else "emulated",
        floor_w=floor,
        floor_pct=100.0 * floor / tdp_w if tdp_w > 0 else 0.0,
        ramp_up_w_per_s=ramp,
        ramp_down_w_per_s=ramp,
        ramp_down_hysteresis_ms=policy.ramp_down_hysteresis_ms if mode == "firmware" else 0.0,
        job_ramp_w_per_s=job_ramp,
        trough_filler_w=filler,
        peak_cap_w=peak_cap,
        expected_p2p_w=swing.p2p_w * ratio,
        expected_attenuation_db=-20.0 * math.log10(ratio) if ratio > 0 else math.inf,
        expected_energy_overhead_pct=overhead,
        reason=f"{_WHY[mode]}: swing {swing.p2p_w:.0f} W -> {swing.p2p_w * ratio:.0f} W (target {target_p2p:.0f} W)",
    )


_WHY = {
    "firmware": "GPU power-smoothing profile",
    "trough filler": "trough-filler hook holds the floor",
    "peak cap": "peak cap (costs step time)",
}
"""The lever each way of smoothing pulls, for the plan's reason."""


def _mode(firmware_supported: bool, policy: power_policy.PowerPolicy) -> str | None:
    """How to smooth: the GPUs' firmware, else the trough filler, else a peak cap (None: none allowed)."""
    if firmware_supported:
        return "firmware"
    if policy.trough_filler_enabled:
        return "trough filler"
    if policy.peak_cap_enabled:
        return "peak cap"
    return None


def _ramp_w_per_s(
    kept_w: float, peak_w: float, period_s: float, tdp_w: float, policy: power_policy.PowerPolicy
) -> float:
    """The slowest ramp whose lost work per step stays under `step_time_cost_max_pct` of the period, W/s.

    DVFS model: work in proportion to power, so climbing `kept_w` to `peak_w` at rate r loses
    kept^2 / (2 r peak) seconds of a step. Without a cost allowance: as fast as the GPU goes.
    """
    cost = policy.step_time_cost_max_pct / 100.0
    if kept_w > 0 and peak_w > 0 and cost > 0:
        return kept_w**2 / (2.0 * cost * period_s * peak_w)
    return tdp_w * 100.0


def _not_worth_it(
    swing: SwingReport, level_swing: float, target_p2p: float, tdp_w: float, policy: power_policy.PowerPolicy
) -> str | None:
    """Why the swing needs no smoothing (within its target, too small, or incoherent); None when it does."""
    if swing.p2p_w <= target_p2p:
        return f"swing {swing.p2p_w:.0f} W is within the target {target_p2p:.0f} W"
    if level_swing < tdp_w * policy.swing_activation_pct_of_tdp / 100.0:
        return f"per-GPU swing {level_swing:.0f} W is below the activation threshold"
    if swing.coherence is not None and swing.coherence < policy.min_coherence:
        return f"node swings are not coherent ({swing.coherence:.2f} < {policy.min_coherence})"
    return None


def _inactive(swing: SwingReport, job_ramp_w_per_s: float, why: str) -> SmoothingPlan:
    """A plan that smooths nothing (only the job ramps apply), saying why."""
    return SmoothingPlan(
        active=False,
        mode="off",
        floor_w=0.0,
        floor_pct=0.0,
        ramp_up_w_per_s=0.0,
        ramp_down_w_per_s=0.0,
        ramp_down_hysteresis_ms=0.0,
        job_ramp_w_per_s=job_ramp_w_per_s,
        trough_filler_w=None,
        peak_cap_w=None,
        expected_p2p_w=swing.p2p_w,
        expected_attenuation_db=0.0,
        expected_energy_overhead_pct=0.0,
        reason=why,
    )
