"""NvmlBackend against the real libnvidia-ml on a GPU node: what the double cannot prove.

Marked `gpu`; the default run deselects it. Run on a GPU machine with
`pytest -m gpu tests/gpu tests/contract` (the contract suite's `nvml-real` case covers the shared
GpuBackend checks, including set-and-restore of a power limit as root). These tests only read: units
are plausible, counters a datacenter GPU supports are not None, energy is monotonic, and the real
event wait honours its timeout. On a machine without a driver they fail with BackendError, by design.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from rasd.agent.core import model
from rasd.agent.gpu import nvml

pytestmark = pytest.mark.gpu

NOW = 1_800_000_000_000_000_000
PCI_BUS_ID_RE = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
# Boards whose ECC and row-remapping counters NVML must report (datacenter Ampere and Hopper).
DATACENTER_RE = re.compile(r"A100|A800|H100|H200|H800|GH200|B200|GB200")


@pytest.fixture
def backend() -> Iterator[nvml.NvmlBackend]:
    backend = nvml.open_nvml_backend()
    yield backend
    backend.close()


def test_inventory_has_real_identities(backend):
    inventory = backend.inventory()
    assert inventory
    for info in inventory:
        assert info.model.startswith("NVIDIA") or info.model.startswith("Tesla"), info.model
        assert PCI_BUS_ID_RE.match(info.pci_bus_id), info.pci_bus_id
        assert info.memory_total_mib > 1024
        assert 0 < info.power_limit_min_w <= info.power_limit_default_w <= info.power_limit_max_w


def test_power_is_plausible_in_watts(backend):
    max_w = {info.uuid: info.power_limit_max_w for info in backend.inventory()}
    readings = backend.read_power(NOW)
    assert {r.gpu_uuid for r in readings} == set(max_w)
    for r in readings:
        # An idle datacenter GPU still draws tens of watts; mW mistaken for W would be far above max.
        assert 5.0 < r.power_w <= max_w[r.gpu_uuid] * 1.2, r


def test_counters_are_plausible_and_supported_ones_are_not_none(backend):
    models = {info.uuid: info.model for info in backend.inventory()}
    for c in backend.read_counters(NOW):
        assert c.temperature_c is not None and 0 < c.temperature_c < 110
        assert c.utilization_gpu_pct is not None and 0 <= c.utilization_gpu_pct <= 100
        assert c.enforced_power_limit_w is not None and c.requested_power_limit_w is not None
        assert c.enforced_power_limit_w <= c.requested_power_limit_w + 1
        assert c.clock_event_reasons is not None
        assert c.pcie_replay_count is not None and c.pcie_replay_count >= 0
        if DATACENTER_RE.search(models[c.gpu_uuid]):
            assert None not in (c.ecc_sbe_volatile, c.ecc_dbe_volatile, c.ecc_sbe_aggregate, c.ecc_dbe_aggregate)
            assert c.remapped_rows_pending is not None and c.remapped_rows_failure is not None
            assert c.total_energy_mj is not None
        for link in c.nvlinks:
            assert isinstance(link, model.NvLinkCounters) and 0 <= link.link < 36


def test_energy_is_monotonic_across_an_event_wait(backend):
    before = {c.gpu_uuid: c.total_energy_mj for c in backend.read_counters(NOW)}
    backend.poll_events(NOW, 0.2)  # the real event wait doubles as the pause
    after = {c.gpu_uuid: c.total_energy_mj for c in backend.read_counters(NOW)}
    for uuid, energy in before.items():
        if energy is not None:
            assert after[uuid] >= energy


def test_real_event_wait_honours_its_timeout(backend):
    started = time.monotonic()
    observations = backend.poll_events(NOW, 0.05)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0
    assert all(o.kind != model.EventKind.GPU_LOST for o in observations)
