"""Swing detector on synthetic signals with known period and amplitude, and the smoothing policy math."""

import math

import numpy as np
import pytest

from rasd.controller.core.power import allocate as power
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.power import swing
from rasd.controller.core.power import tree as power_tree

POLICY = power_policy.PowerPolicy()
FS = 10.0


def step_wave(n_gpus=1024, peak=675.0, trough=125.0, period_samples=10, compute_samples=7, seconds=120):
    k = np.arange(int(seconds * FS))
    return np.where(k % period_samples < compute_samples, peak, trough) * n_gpus


def test_square_wave_period_amplitude_duty_and_ramp():
    x = step_wave()
    report = swing.detect(x, FS, policy=POLICY)
    assert report.p2p_w == 550 * 1024
    assert report.period_s == pytest.approx(1.0, rel=0.01)
    assert report.trough_fraction == pytest.approx(0.3)
    assert report.peak_w == 675 * 1024 and report.trough_w == 125 * 1024
    assert report.max_ramp_1s_w_per_s == 0.0, "a 1 s lag lands on the same phase of a 1 s period"
    assert report.max_ramp_60s_w_per_s == 0.0
    assert report.coherence is None


@pytest.mark.parametrize("period_s", [0.5, 0.7, 1.7, 4.0, 6.0, 10.0])
def test_sine_dominant_period_and_amplitude(period_s):
    t = np.arange(int(300 * FS)) / FS
    amplitude = 1000.0
    x = 50_000 + amplitude * np.sin(2 * np.pi * t / period_s + 0.3)
    report = swing.detect(x, FS, policy=POLICY)
    assert report.period_s == pytest.approx(period_s, rel=0.01)
    # 10 Hz samples of a 2 Hz sine miss its crests: 5 samples per period see 2A sin(2pi/5 ...) at worst.
    assert 0.9 * 2 * amplitude <= report.p2p_w <= 2 * amplitude


@pytest.mark.parametrize("period_s", [0.7, 1.7, 4.0, 6.0])
def test_sine_inside_the_band_puts_its_whole_power_in_the_band(period_s):
    t = np.arange(int(300 * FS)) / FS
    x = 50_000 + 1000.0 * np.sin(2 * np.pi * t / period_s + 0.3)
    assert swing.detect(x, FS, policy=POLICY).band_power_w2 == pytest.approx(1000.0**2 / 2, rel=0.05)


def test_power_outside_the_band_is_not_counted():
    t = np.arange(int(300 * FS)) / FS
    x = 1000.0 * np.sin(2 * np.pi * 3.5 * t) + 1000.0 * np.sin(2 * np.pi * 0.02 * t)
    assert swing.band_power(x, FS, 0.1, 2.0) < 0.01 * 1000.0**2 / 2


def test_max_ramp_over_1_s_and_60_s_on_a_linear_ramp_and_a_step():
    ramp = np.concatenate([np.zeros(100), np.arange(0, 2000) * 50.0, np.full(1000, 99_950.0)])
    report = swing.detect(ramp, FS, policy=POLICY)
    assert report.max_ramp_1s_w_per_s == pytest.approx(500.0)
    assert report.max_ramp_60s_w_per_s == pytest.approx(500.0)
    stepped = np.concatenate([np.zeros(1000), np.full(1000, 6000.0)])
    assert swing.max_ramp_w_per_s(stepped, FS, 1.0) == 6000.0
    assert swing.max_ramp_w_per_s(stepped, FS, 60.0) == 100.0
    assert swing.max_ramp_w_per_s(stepped[:500], FS, 60.0) is None


def test_coherence_is_one_in_step_near_zero_independent_and_negative_in_antiphase():
    rng = np.random.default_rng(0)
    base = step_wave(n_gpus=8, seconds=60)
    in_step = np.tile(base, (16, 1)) + rng.normal(0, 1, (16, len(base)))
    assert swing.coherence(in_step) == pytest.approx(1.0, abs=0.01)
    shifted = np.array([np.roll(base, int(s)) for s in rng.integers(0, 10, 64)])
    independent = rng.normal(0, 100, (64, 600))
    assert abs(swing.coherence(independent)) < 0.05
    assert swing.coherence(shifted) < 0.5
    assert swing.coherence(np.stack([base, -base])) == pytest.approx(-1.0)
    assert swing.coherence(base[None, :]) is None


def test_flat_series_has_no_dominant_period():
    report = swing.detect(np.full(600, 5000.0), FS, policy=POLICY)
    assert report.dominant_freq_hz is None and report.period_s is None and report.p2p_w == 0.0


def test_too_short_a_series_is_refused():
    with pytest.raises(ValueError, match="at least 4 samples"):
        swing.detect(np.ones(3), FS, policy=POLICY)


def test_a_floor_attenuates_band_power_by_the_square_of_the_swing_ratio():
    n = 1024
    raw = step_wave(n_gpus=n, seconds=300)
    report = swing.detect(raw, FS, policy=POLICY)
    plan = swing.plan_smoothing(report, n_gpus=n, tdp_w=700.0, firmware_supported=True, policy=POLICY)
    assert plan.active and plan.mode == "firmware"
    assert plan.floor_w == pytest.approx(675 - 0.25 * 550)
    managed = np.maximum(raw / n, plan.floor_w) * n  # what an instant floor does
    measured = swing.attenuation_db(report.band_power_w2, swing.detect(managed, FS, policy=POLICY).band_power_w2)
    assert measured == pytest.approx(plan.expected_attenuation_db, abs=0.2)
    assert swing.detect(managed, FS, policy=POLICY).p2p_w == pytest.approx(plan.expected_p2p_w)


def test_a_20_db_target_needs_a_swing_of_a_tenth():
    policy = power_policy.PowerPolicy(swing_target_pct=10.0)
    report = swing.detect(step_wave(seconds=300), FS, policy=policy)
    plan = swing.plan_smoothing(report, n_gpus=1024, tdp_w=700.0, firmware_supported=True, policy=policy)
    assert plan.expected_attenuation_db == pytest.approx(20.0)
    assert plan.floor_pct == pytest.approx(100 * (675 - 55) / 700)


def test_analytic_energy_overhead_matches_the_exact_minimum_for_the_chosen_floor():
    n = 1024
    raw = step_wave(n_gpus=n, seconds=300)
    report = swing.detect(raw, FS, policy=POLICY)
    plan = swing.plan_smoothing(report, n_gpus=n, tdp_w=700.0, firmware_supported=True, policy=POLICY)
    exact = swing.floor_energy_overhead_pct(raw / n, plan.floor_w, FS)
    assert plan.expected_energy_overhead_pct == pytest.approx(exact, rel=0.01)
    assert swing.square_wave_floor_overhead_pct(700, 150, 0.3, 560) == pytest.approx(100 * 410 * 0.3 / 535)
    per_gpu = np.tile(raw / n, (4, 1))
    joules = swing.floor_energy_overhead_j(per_gpu, np.array([537.5] * 4), FS)
    assert joules == pytest.approx(4 * (537.5 - 125) * 0.3 * 300)


def test_ramp_up_rate_keeps_the_lost_work_under_the_step_time_budget():
    report = swing.detect(step_wave(seconds=300), FS, policy=POLICY)
    plan = swing.plan_smoothing(report, n_gpus=1024, tdp_w=700.0, firmware_supported=True, policy=POLICY)
    kept = 675 - plan.floor_w
    lost_s = kept**2 / (2 * plan.ramp_up_w_per_s * 675)
    assert lost_s / report.period_s == pytest.approx(POLICY.step_time_cost_max_pct / 100, rel=0.01)
    assert plan.job_ramp_w_per_s == pytest.approx(POLICY.ramp_limit_w_per_s / 1024)


def test_no_smoothing_for_a_small_or_incoherent_swing():
    small = swing.detect(step_wave(peak=400, trough=350), FS, policy=POLICY)
    assert not swing.plan_smoothing(small, n_gpus=1024, tdp_w=700, firmware_supported=True, policy=POLICY).active
    base = step_wave(n_gpus=1, seconds=60)
    rng = np.random.default_rng(1)
    nodes = rng.normal(0, 200, (32, len(base))) + 400
    incoherent = swing.detect(nodes.sum(axis=0), FS, node_series_w=nodes, policy=POLICY)
    plan = swing.plan_smoothing(incoherent, n_gpus=32, tdp_w=700, firmware_supported=True, policy=POLICY)
    assert not plan.active and "coherent" in plan.reason


def test_emulation_uses_the_trough_filler_or_a_peak_cap_or_only_job_ramps():
    report = swing.detect(step_wave(seconds=60), FS, policy=POLICY)
    kwargs = {"n_gpus": 1024, "tdp_w": 700.0, "firmware_supported": False}
    plain = swing.plan_smoothing(report, policy=POLICY, **kwargs)
    assert not plain.active and plain.job_ramp_w_per_s > 0 and "only job ramps" in plain.reason
    filler = swing.plan_smoothing(report, policy=power_policy.PowerPolicy(trough_filler_enabled=True), **kwargs)
    assert filler.mode == "emulated" and filler.trough_filler_w == pytest.approx(537.5) and filler.peak_cap_w is None
    capped = swing.plan_smoothing(report, policy=power_policy.PowerPolicy(peak_cap_enabled=True), **kwargs)
    assert capped.peak_cap_w == pytest.approx(125 + 0.25 * 550)
    assert capped.expected_energy_overhead_pct == 0.0
    assert capped.expected_attenuation_db == pytest.approx(20 * math.log10(4))


def test_slew_limit_and_ramp_schedule():
    out = swing.slew_limit(np.array([100.0, 500.0, 300.0]), np.array([700.0, 100.0, 310.0]), 2.0, 50.0)
    assert list(out) == [200.0, 400.0, 310.0]
    assert list(swing.ramp_schedule(200.0, 700.0, np.array([-1.0, 0.0, 5.0, 100.0]), 20.0)) == [200, 200, 300, 700]
    assert float(swing.ramp_schedule(700.0, 200.0, 5.0, 20.0)) == 600.0


def test_aggregate_raise_limit_scales_raises_and_keeps_the_allocation_within_budget():
    tree = power_tree.PowerTree.from_mapping(
        {"budget_w": 4_000, "rows": [{"name": "r", "racks": [{"name": "k", "nodes": [{"name": "n"}]}]}]}
    )
    views = power.GpuViews.from_views(
        [power.GpuView(f"g{i}", "n", 0, 200.0, 200.0, 100.0, 700.0, throttled=True) for i in range(8)], tree
    )
    alloc = power.allocate(tree, views, None, policy=POLICY, rng=np.random.default_rng(0))
    limited = swing.limit_aggregate_raise(views.cap_w, alloc.caps_w, dt_s=3.0, ramp_w_per_s=100.0)
    assert (limited - views.cap_w).sum() <= 300.0
    assert np.all(limited >= views.cap_w) and np.all(limited <= alloc.caps_w)
    down = swing.limit_aggregate_raise(np.array([500.0, 500.0]), np.array([300.0, 400.0]), 1.0, 1.0)
    assert list(down) == [300.0, 400.0]


def test_welch_psd_integrates_to_the_variance():
    rng = np.random.default_rng(2)
    x = rng.normal(0, 30, 6000)
    freqs, psd = swing.welch_psd(x, FS)
    assert psd.sum() * (freqs[1] - freqs[0]) == pytest.approx(x.var(), rel=0.1)


def test_a_peak_cap_only_lowers_targets_and_never_below_the_minimum():
    targets = np.array([600, 450, 700], dtype=np.int64)
    capped = swing.apply_peak_cap(targets, 500.7, np.array([200.0, 200.0, 550.0]))
    assert list(capped) == [500, 450, 550]
    assert np.all(capped <= targets), "a peak cap never raises a target (the budgets still hold)"
