"""Power-smoothing profiles through the real pynvml code: written, activated, switched; refused on Hopper."""

from __future__ import annotations

import fake_nvml
import pynvml  # noqa: TID251 - the test reads what the double recorded
import pytest

from rasd.agent import gpu


def _blackwell(index):
    device = fake_nvml.h100_sxm5(index, seed=0xB200)
    device.set_field(pynvml.NVML_FI_PWR_SMOOTHING_ENABLED, 0)
    return device


def test_profile_is_written_activated_and_enabled(install_fake, open_backend):
    fake = install_fake(fake_nvml.FakeNvml([_blackwell(0)]))
    backend = open_backend()
    (info,) = backend.inventory()
    assert info.power_smoothing_supported
    backend.set_power_smoothing(info.uuid, enabled=True, floor_pct=60.0, ramp_up_w_per_s=250.0, ramp_down_w_per_s=100.0)
    fields = fake.gpus[0].fields
    assert fields[(pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_PERCENT_TMP_FLOOR, 0)][2] == 60.0
    # Set in W/s (NVML's setter), read back in mW/s: a setter given mW/s would ask for 1,000x the ramp.
    assert fields[(pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_UP_RATE, 0)][2] == 250_000.0  # mW/s
    assert fields[(pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_DOWN_RATE, 0)][2] == 100_000.0
    assert fields[(pynvml.NVML_FI_PWR_SMOOTHING_ACTIVE_PRESET_PROFILE, 0)][2] == 0
    assert backend.read_counters(1)[0].power_smoothing_enabled is True


def test_hopper_has_no_smoothing_hardware(fake, open_backend):
    backend = open_backend()
    uuid = backend.inventory()[0].uuid
    with pytest.raises(gpu.NotSupported):
        backend.set_power_smoothing(uuid, enabled=True, floor_pct=50, ramp_up_w_per_s=100, ramp_down_w_per_s=100)


def test_smoothing_needs_root_and_a_sane_floor(install_fake, open_backend):
    fake = install_fake(fake_nvml.FakeNvml([_blackwell(0)]))
    backend = open_backend()
    uuid = backend.inventory()[0].uuid
    with pytest.raises(gpu.InvalidValue):
        backend.set_power_smoothing(uuid, enabled=True, floor_pct=150, ramp_up_w_per_s=1, ramp_down_w_per_s=1)
    fake.is_root = False
    with pytest.raises(gpu.NoPermission):
        backend.set_power_smoothing(uuid, enabled=False, floor_pct=0, ramp_up_w_per_s=0, ramp_down_w_per_s=0)
