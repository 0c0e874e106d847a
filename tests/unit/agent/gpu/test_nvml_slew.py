"""Slewing cap raises on the real NVML path: the agent's executor over pynvml and the fake libnvidia-ml."""

from __future__ import annotations

import itertools

import fake_nvml

from rasd.agent import actions, spool
from rasd.agent.core import model

H100_A, H100_B = fake_nvml.h100_sxm5(0).uuid, fake_nvml.h100_sxm5(1).uuid


class _Clock:
    def __init__(self) -> None:
        self.now_s = 1_800_000_000.0

    def __call__(self) -> int:
        return int(self.now_s * 1e9)


def _sets_mw(fake, since=0):
    return [args[1].value for name, args in fake.calls[since:] if name == "nvmlDeviceSetPowerManagementLimit"]


def test_a_raise_with_a_rate_steps_the_nvml_limit_and_a_decrease_goes_at_once(fake, open_backend):
    clock = _Clock()
    executor = actions.ActionExecutor(open_backend(), spool.Spool(":memory:"), clock=clock)
    executor.execute(model.Command("low", 0, 0, "t", model.SetPowerCap({H100_A: 300, H100_B: 300})))
    mark = len(fake.calls)
    up = model.SetPowerCap({H100_A: 450, H100_B: 450}, max_raise_w_per_s={H100_A: 100.0})
    result = executor.execute(model.Command("up", 0, 0, "t", up))
    assert result.outcome is model.ActionOutcome.SUCCEEDED
    assert result.enforced_limits_w == {H100_A: 300, H100_B: 450}, "A read back where it is; B without a rate at once"
    assert result.slew_targets_w == {H100_A: 450}
    (counters,) = [c for c in executor.read_counters(clock()) if c.gpu_uuid == H100_A]
    assert (counters.enforced_power_limit_w, counters.power_limit_slew_target_w) == (300, 450)
    assert _sets_mw(fake, mark) == [450_000], "only B's limit was set so far"
    mark = len(fake.calls)
    for _ in range(16):
        clock.now_s += 0.1
        assert executor.step_slews() == []
    sets = _sets_mw(fake, mark)
    assert sets[0] == 310_000 and sets[-1] == 450_000 and len(sets) == 15
    assert all(0 < b - a <= 10_000 for a, b in itertools.pairwise(sets)), "<= 100 W/s in 0.1 s steps"
    assert fake.gpu(0).requested_limit_mw == 450_000
    # The next slew is replaced by a decrease, which is set at once.
    executor.execute(model.Command("up2", 0, 0, "t", model.SetPowerCap({H100_A: 600}, {H100_A: 100.0})))
    clock.now_s += 0.3
    executor.step_slews()
    down = executor.execute(model.Command("down", 0, 0, "t", model.SetPowerCap({H100_A: 250}, {H100_A: 100.0})))
    assert down.enforced_limits_w == {H100_A: 250} and down.slew_targets_w == {}
    clock.now_s += 1.0
    executor.step_slews()
    assert fake.gpu(0).requested_limit_mw == 250_000


def test_a_slew_step_that_fails_drops_the_slew_and_keeps_the_limit_where_it_was(fake, open_backend):
    clock = _Clock()
    executor = actions.ActionExecutor(open_backend(), spool.Spool(":memory:"), clock=clock)
    executor.execute(model.Command("low", 0, 0, "t", model.SetPowerCap({H100_A: 300})))
    executor.execute(model.Command("up", 0, 0, "t", model.SetPowerCap({H100_A: 450}, {H100_A: 100.0})))
    clock.now_s += 0.2
    executor.step_slews()
    fake.is_root = False  # e.g. the agent lost its privileges: every set fails from now on
    clock.now_s += 0.2
    (failure,) = executor.step_slews()
    assert H100_A in failure and "NoPermission" in failure
    assert executor.slew_targets() == {}
    assert fake.gpu(0).requested_limit_mw == 320_000
