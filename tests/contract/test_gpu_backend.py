"""One contract every GpuBackend passes: simulated, nvml over the pynvml test double, and real nvml.

The `nvml` case runs the real pynvml.py against the fake C library in tests/nvml_double (loaded by
putting that folder on sys.path below; no marker or environment variable). The `nvml-real` case is
marked `gpu`: the default run deselects it; `pytest -m gpu tests/contract` runs it on a GPU node,
where the set-limit checks need root and the original limits are restored afterwards.
"""

from __future__ import annotations

import importlib
import pathlib
import re
import sys
import time
from collections.abc import Iterator

import pytest

from rasd.agent import gpu
from rasd.agent.core import model
from rasd.agent.gpu import nvml, simulated

_DOUBLE_DIR = str(pathlib.Path(__file__).resolve().parents[1] / "nvml_double")
if _DOUBLE_DIR not in sys.path:
    sys.path.insert(0, _DOUBLE_DIR)
fake_nvml = importlib.import_module("fake_nvml")

NOW = 1_800_000_000_000_000_000
UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture(params=["simulated", "nvml", pytest.param("nvml-real", marks=pytest.mark.gpu)])
def backend(request) -> Iterator[gpu.GpuBackend]:
    if request.param == "simulated":
        backend = simulated.SimulatedBackend("node-contract", 4, 7)
        yield backend
        backend.close()
    elif request.param == "nvml":
        fake_nvml.install(fake_nvml.FakeNvml([fake_nvml.h100_sxm5(i) for i in range(4)]))
        try:
            backend = nvml.open_nvml_backend()
            yield backend
            backend.close()
        finally:
            fake_nvml.uninstall()
    else:
        fake_nvml.uninstall()  # make pynvml load the real libnvidia-ml.so.1
        backend = nvml.open_nvml_backend()
        original = {c.gpu_uuid: c.requested_power_limit_w for c in backend.read_counters(NOW)}
        yield backend
        for c in backend.read_counters(NOW):  # put back only what a test changed
            if original.get(c.gpu_uuid) not in (None, c.requested_power_limit_w):
                backend.set_power_limit(c.gpu_uuid, original[c.gpu_uuid])
        backend.close()


def set_or_skip(backend: gpu.GpuBackend, uuid: str, limit_w: int) -> int:
    try:
        return backend.set_power_limit(uuid, limit_w)
    except gpu.NoPermission:
        pytest.skip("setting power limits needs root on this machine")


def test_inventory_is_stable_non_empty_and_uuid_shaped(backend):
    inventory = list(backend.inventory())
    assert inventory
    assert list(backend.inventory()) == inventory
    uuids = [info.uuid for info in inventory]
    assert all(UUID_RE.match(u) for u in uuids), uuids
    assert len(set(uuids)) == len(uuids)


def test_power_limit_constraints_are_ordered(backend):
    for info in backend.inventory():
        assert 0 < info.power_limit_min_w <= info.power_limit_default_w <= info.power_limit_max_w


def test_readings_and_counters_name_inventory_gpus_and_carry_the_sample_time(backend):
    uuids = {info.uuid for info in backend.inventory()}
    readings = backend.read_power(NOW)
    counters = backend.read_counters(NOW)
    assert readings and counters
    assert {r.gpu_uuid for r in readings} <= uuids
    assert {c.gpu_uuid for c in counters} <= uuids
    assert all(isinstance(r, model.PowerReading) and r.time_unix_ns == NOW for r in readings)
    assert all(isinstance(c, model.GpuCounters) and c.sample_unix_ns == NOW for c in counters)


def test_power_is_between_zero_and_the_max_limit_plus_twenty_percent(backend):
    max_w = {info.uuid: info.power_limit_max_w for info in backend.inventory()}
    for reading in backend.read_power(NOW):
        assert 0 <= reading.power_w <= max_w[reading.gpu_uuid] * 1.2, reading


def test_set_power_limit_inside_constraints_returns_the_enforced_limit_that_counters_report(backend):
    info = backend.inventory()[-1]
    target_w = (info.power_limit_min_w + info.power_limit_max_w) // 2
    enforced_w = set_or_skip(backend, info.uuid, target_w)
    # An out-of-band limit may hold the enforced value below the request, never above it.
    assert info.power_limit_min_w <= enforced_w <= target_w
    (counters,) = [c for c in backend.read_counters(NOW) if c.gpu_uuid == info.uuid]
    assert counters.enforced_power_limit_w == enforced_w


@pytest.mark.parametrize("side", ["below_min", "above_max"])
def test_set_power_limit_outside_constraints_raises_invalid_value(backend, side):
    info = backend.inventory()[0]
    limit_w = info.power_limit_min_w - 1 if side == "below_min" else info.power_limit_max_w + 1
    with pytest.raises(gpu.InvalidValue):
        backend.set_power_limit(info.uuid, limit_w)


def test_set_power_limit_for_an_unknown_uuid_raises_gpu_not_found(backend):
    with pytest.raises(gpu.GpuNotFound):
        backend.set_power_limit("GPU-00000000-dead-beef-0000-000000000000", 300)


def test_poll_events_with_zero_timeout_returns_promptly(backend):
    started = time.monotonic()
    observations = backend.poll_events(NOW, 0)
    assert time.monotonic() - started < 0.5
    assert all(isinstance(o, model.Observation) for o in observations)
