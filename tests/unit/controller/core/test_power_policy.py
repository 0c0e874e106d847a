import pytest

from rasd.controller.core.power import policy as power_policy


def test_defaults_are_valid_and_round_trip():
    policy = power_policy.PowerPolicy()
    policy.validate()
    assert power_policy.PowerPolicy.from_mapping(policy.to_mapping()) == policy


def test_from_mapping_reads_numbers_and_flags():
    policy = power_policy.PowerPolicy.from_mapping(
        {"control_period_s": 1, "swing_target_w": 50_000, "peak_cap_enabled": True}
    )
    assert policy.control_period_s == 1.0
    assert policy.swing_target_w == 50_000.0
    assert policy.peak_cap_enabled is True


@pytest.mark.parametrize(
    ("mapping", "key"),
    [
        ({"control_periods": 3}, "control_periods"),
        ({"control_period_s": "3s"}, "control_period_s"),
        ({"control_period_s": 0}, "control_period_s"),
        ({"peak_cap_enabled": 1}, "peak_cap_enabled"),
        ({"raise_jitter_pct": True}, "raise_jitter_pct"),
        ({"lower_band_pct": 95}, "donor_target_pct"),
        ({"raise_jitter_pct": 100}, "raise_jitter_pct"),
        ({"floor_min_pct": 95}, "floor_min_pct"),
        ({"band_low_hz": 3}, "band_low_hz"),
        ({"min_coherence": 1.5}, "min_coherence"),
        ({"ramp_limit_w_per_s": float("inf")}, "ramp_limit_w_per_s"),
        ({"marginal_cap_pct": 120}, "marginal_cap_pct"),
        ({"job_start_canary_gpus": 2.5}, "job_start_canary_gpus"),
        ({"job_start_canary_gpus": -1}, "job_start_canary_gpus"),
        ({"job_start_smoothing_release_s": 0}, "job_start_smoothing_release_s"),
        ({"job_start_smoothing_enabled": 1}, "job_start_smoothing_enabled"),
    ],
)
def test_from_mapping_names_the_bad_key(mapping, key):
    with pytest.raises(power_policy.PolicyError) as err:
        power_policy.PowerPolicy.from_mapping(mapping)
    assert err.value.key == key


def test_a_policy_error_echoes_a_callers_key_and_value_cut_and_escaped():
    """Issue #37 item 18: SetPowerPolicy's detail repeated an unknown key or a bad value whole."""
    with pytest.raises(power_policy.PolicyError) as unknown:
        power_policy.PowerPolicy.from_mapping({"\x1b[2J" + "k" * 5000: 1})
    with pytest.raises(power_policy.PolicyError) as bad:
        power_policy.PowerPolicy.from_mapping({"control_period_s": "\x1b" + "v" * 5000})
    for error, length in ((unknown.value, 5004), (bad.value, 5001)):
        assert len(str(error)) < 300 and "\x1b" not in str(error) and f"({length:,} characters)" in str(error)
    assert str(bad.value).startswith("power policy: control_period_s: expected a number, got '\\x1bvvv")
