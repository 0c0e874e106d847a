"""NvmlBackend read through the real pynvml.py against the fake C library (tests/nvml_double).

Every counter the agent reads, the unsupported (None, never 0) and lost-GPU paths, power-limit
setting and its errors, and the event wait with its timeout. No marker or environment variable is
needed; the conftest puts tests/nvml_double on sys.path. Event waits run on the double's fake
millisecond clock, so nothing here sleeps.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import fake_nvml
import pynvml  # noqa: TID251  (constants for scripting the double)
import pytest

from rasd.agent import gpu
from rasd.agent.core import model
from rasd.agent.gpu import nvml

NOW = 1_800_000_000_000_000_000
H100_A, H100_B = fake_nvml.h100_sxm5(0).uuid, fake_nvml.h100_sxm5(1).uuid
SBE, DBE = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOL, AGG = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC


def counters_of(backend, uuid, now=NOW):
    (counters,) = [c for c in backend.read_counters(now) if c.gpu_uuid == uuid]
    return counters


def test_importing_the_gpu_package_and_nvml_module_does_not_import_pynvml():
    code = "import sys, rasd.agent.gpu, rasd.agent.gpu.nvml; sys.exit('pynvml' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ----- inventory --------------------------------------------------------------------------------------


def test_inventory_names_each_gpu_by_uuid_with_identity_and_limits_in_watts(fake, open_backend):
    info = open_backend().inventory()[0]
    assert info == model.GpuInfo(
        uuid=H100_A,
        model="NVIDIA H100 80GB HBM3",
        pci_bus_id="00000000:18:00.0",
        power_limit_min_w=200,
        power_limit_max_w=700,
        power_limit_default_w=700,
        serial="1652022000000",
        vbios_version="96.00.74.00.01",
        memory_total_mib=80 * 1024,
        power_smoothing_supported=False,
        labels={"index": "0"},
    )


def test_inventory_is_ordered_by_pci_bus_id_not_by_nvml_index(install_fake, open_backend):
    late, early = fake_nvml.h100_sxm5(0), fake_nvml.h100_sxm5(1)
    late.pci_bus_id, early.pci_bus_id = "00000000:DB:00.0", "00000000:19:00.0"
    install_fake(fake_nvml.FakeNvml([late, early]))
    inventory = open_backend().inventory()
    assert [i.uuid for i in inventory] == [early.uuid, late.uuid]
    assert [i.labels["index"] for i in inventory] == ["1", "0"]  # the NVML index each had: dcgm-exporter's `gpu`


def test_power_smoothing_support_comes_from_its_field(install_fake, open_backend):
    gpu = fake_nvml.h100_sxm5(0)
    gpu.set_field(pynvml.NVML_FI_PWR_SMOOTHING_ENABLED, 1)
    install_fake(fake_nvml.FakeNvml([gpu]))
    backend = open_backend()
    assert backend.inventory()[0].power_smoothing_supported is True
    assert counters_of(backend, gpu.uuid).power_smoothing_enabled is True


# ----- power ------------------------------------------------------------------------------------------


def test_power_comes_from_the_instant_field_in_watts(fake, open_backend):
    fake.gpu(0).demand_mw = 412_345
    backend = open_backend()
    readings = {r.gpu_uuid: r for r in backend.read_power(NOW)}
    assert readings[H100_A] == model.PowerReading(H100_A, NOW, 412.345)
    assert readings[H100_B].power_w == 350.0
    # nvmlDeviceGetPowerUsage is a 1 s average on Hopper; the instant field made it unnecessary.
    assert fake.call_count("nvmlDeviceGetPowerUsage") == 0


def test_power_falls_back_to_power_usage_and_stops_asking_for_an_absent_instant_field(install_fake, open_backend):
    fake = install_fake(fake_nvml.FakeNvml([fake_nvml.v100_sxm2(0)]))
    backend = open_backend()
    before = fake.call_count("nvmlDeviceGetFieldValues")
    assert [r.power_w for r in backend.read_power(NOW)] == [250.0]
    assert [r.power_w for r in backend.read_power(NOW)] == [250.0]
    assert fake.call_count("nvmlDeviceGetFieldValues") == before + 1
    assert fake.call_count("nvmlDeviceGetPowerUsage") == 2


def test_gpu_without_any_power_reading_is_left_out_not_reported_as_zero(fake, open_backend):
    fake.inject_field(0, pynvml.NVML_FI_DEV_POWER_INSTANT, ret=pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.inject(0, "PowerUsage", ret=pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert [r.gpu_uuid for r in open_backend().read_power(NOW)] == [H100_B]


def test_limits_round_toward_the_safe_side_when_converted_to_watts(install_fake, open_backend):
    g = fake_nvml.h100_sxm5(0)
    g.power_min_mw, g.power_max_mw, g.power_default_mw = 199_500, 700_500, 650_001
    g.requested_limit_mw, g.oob_limit_mw = 650_001, 450_500
    install_fake(fake_nvml.FakeNvml([g]))
    backend = open_backend()
    info = backend.inventory()[0]
    # Never below the real minimum, never above the real maximum.
    assert (info.power_limit_min_w, info.power_limit_max_w, info.power_limit_default_w) == (200, 700, 651)
    c = counters_of(backend, g.uuid)
    # An enforced limit reported high keeps budget sums conservative.
    assert (c.requested_power_limit_w, c.enforced_power_limit_w) == (651, 451)


# ----- counters ---------------------------------------------------------------------------------------


def test_every_counter_is_read_and_converted(fake, open_backend):
    g = fake.gpu(0)
    g.demand_mw, g.oob_limit_mw, g.base_clock_reasons = 690_000, 600_000, pynvml.nvmlClocksEventReasonHwSlowdown
    g.set_attr("Temperature", (pynvml.NVML_TEMPERATURE_GPU,), value=71)
    g.set_attr("UtilizationRates", value=(97, 40))
    for (kind, counter), value in {(SBE, VOL): 11, (DBE, VOL): 1, (SBE, AGG): 120, (DBE, AGG): 3}.items():
        g.set_attr("TotalEccErrors", (kind, counter), value=value)
    g.set_attr("RemappedRows", value=(4, 2, 1, 0))
    g.set_attr("PcieReplayCounter", value=12)
    g.set_field(pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P)
    g.set_attr("NvLinkState", (2,), value=pynvml.NVML_FEATURE_DISABLED)
    g.set_attr("NvLinkErrorCounter", (2, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT), value=5)
    g.set_attr("NvLinkErrorCounter", (2, pynvml.NVML_NVLINK_ERROR_DL_REPLAY), value=6)
    g.set_attr("NvLinkErrorCounter", (2, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY), value=7)
    backend = open_backend()
    fake.advance(2.0)  # 600 W for 2 s

    c = counters_of(backend, H100_A)

    assert (c.gpu_uuid, c.sample_unix_ns) == (H100_A, NOW)
    assert (c.requested_power_limit_w, c.enforced_power_limit_w) == (700, 600)
    assert c.total_energy_mj == 1_200_000
    assert (c.temperature_c, c.utilization_gpu_pct) == (71, 97)
    assert c.clock_event_reasons == model.ClockEventReason.SW_POWER_CAP | model.ClockEventReason.HW_SLOWDOWN
    assert (c.ecc_sbe_volatile, c.ecc_dbe_volatile, c.ecc_sbe_aggregate, c.ecc_dbe_aggregate) == (11, 1, 120, 3)
    assert (c.remapped_rows_correctable, c.remapped_rows_uncorrectable) == (4, 2)
    assert (c.remapped_rows_pending, c.remapped_rows_failure) == (True, False)
    assert (c.retired_pages_sbe, c.retired_pages_dbe, c.retired_pages_pending) == (None, None, None)
    assert c.pcie_replay_count == 12
    assert c.recovery_action == pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P
    assert c.power_smoothing_enabled is None
    assert [link.link for link in c.nvlinks] == list(range(18))
    assert c.nvlinks[2] == model.NvLinkCounters(2, active=False, crc_errors=5, replay_errors=6, recovery_errors=7)
    assert c.nvlinks[3] == model.NvLinkCounters(3, active=True, crc_errors=0, replay_errors=0, recovery_errors=0)


def test_retired_pages_and_pending_status_on_a_gpu_that_retires_pages(install_fake, open_backend):
    gpu = fake_nvml.v100_sxm2(0)
    sbe_cause = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    dbe_cause = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    gpu.set_attr("RetiredPages", (sbe_cause,), value=[0xA000, 0xB000])
    gpu.set_attr("RetiredPages", (dbe_cause,), value=[0xC000])
    gpu.set_attr("RetiredPagesPendingStatus", value=1)
    install_fake(fake_nvml.FakeNvml([gpu]))

    c = counters_of(open_backend(), gpu.uuid)

    assert (c.retired_pages_sbe, c.retired_pages_dbe, c.retired_pages_pending) == (2, 1, True)
    # Volta has no row remapper and no recovery-action field: unknown, not zero.
    assert (c.remapped_rows_correctable, c.remapped_rows_pending, c.recovery_action) == (None, None, None)
    assert len(c.nvlinks) == 6


def test_counters_a_gpu_does_not_support_are_none_never_zero(install_fake, open_backend):
    gpu = fake_nvml.consumer(0)
    install_fake(fake_nvml.FakeNvml([gpu]))
    backend = open_backend()
    c = counters_of(backend, gpu.uuid)
    unsupported = [
        "total_energy_mj",
        "ecc_sbe_volatile",
        "ecc_dbe_volatile",
        "ecc_sbe_aggregate",
        "ecc_dbe_aggregate",
        "retired_pages_sbe",
        "retired_pages_dbe",
        "retired_pages_pending",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "recovery_action",
        "power_smoothing_enabled",
    ]
    assert {name: getattr(c, name) for name in unsupported} == dict.fromkeys(unsupported)
    assert c.nvlinks == ()
    assert (c.temperature_c, c.utilization_gpu_pct, c.pcie_replay_count) == (41, 3, 0)
    assert backend.inventory()[0].serial == ""


def _fields_asked(fake) -> list[set[int]]:
    """The field ids of each nvmlDeviceGetFieldValues call, in order."""
    asked = []
    for name, args in fake.calls:
        if name == "nvmlDeviceGetFieldValues":
            count, values = args[1].value, args[2]._obj
            asked.append({values[i].fieldId for i in range(count)})
    return asked


def test_an_unsupported_call_is_not_asked_again(install_fake, open_backend):
    fake = install_fake(fake_nvml.FakeNvml([fake_nvml.consumer(0)]))
    backend = open_backend()
    backend.read_counters(NOW)
    first = {name: fake.call_count(name) for name in ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows")}
    first_fields = _fields_asked(fake)[-1]
    backend.read_counters(NOW)
    # Their fields answered NOT_SUPPORTED, then their functions did too, once each.
    assert first == {"nvmlDeviceGetTotalEccErrors": 4, "nvmlDeviceGetRemappedRows": 1}
    assert {name: fake.call_count(name) for name in first} == first
    second_fields = _fields_asked(fake)[-1]
    ecc_and_remap = {3, 4, 5, 6, 142, 143, 144, 145}
    assert ecc_and_remap <= first_fields and not ecc_and_remap & second_fields
    assert pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER in second_fields  # supported counters keep going


def test_counters_take_one_field_value_call_per_gpu(fake, open_backend):
    backend = open_backend()
    backend.read_counters(NOW)  # the first read also finds which fields this driver has
    fake.calls.clear()
    backend.read_counters(NOW)
    per_gpu = {name: fake.call_count(name) / 2 for name, _ in fake.calls}
    # Temperature, utilisation and clock event reasons have no field id; links are not due yet.
    assert per_gpu == {
        "nvmlDeviceGetFieldValues": 1,
        "nvmlDeviceGetTemperatureV": 1,
        "nvmlDeviceGetUtilizationRates": 1,
        "nvmlDeviceGetCurrentClocksEventReasons": 1,
    }


def test_an_older_driver_without_the_counter_fields_is_read_through_the_functions(install_fake, open_backend):
    gpu = fake_nvml.h100_sxm5(0)
    fake = install_fake(fake_nvml.FakeNvml([gpu]))
    for field_id in (190, 192, 83, 3, 4, 5, 6, 94, 142, 143, 144, 145):
        fake.inject_field(0, field_id, ret=pynvml.NVML_ERROR_INVALID_ARGUMENT)  # ids it does not know
    gpu.set_attr("TotalEccErrors", (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC), value=3)
    gpu.set_attr("RemappedRows", value=(4, 2, 1, 0))
    backend = open_backend()
    for _ in range(2):
        c = counters_of(backend, gpu.uuid)
        assert (c.enforced_power_limit_w, c.requested_power_limit_w, c.ecc_dbe_volatile) == (700, 700, 3)
        assert (c.remapped_rows_uncorrectable, c.remapped_rows_pending, c.pcie_replay_count) == (2, True, 0)
    assert fake.call_count("nvmlDeviceGetEnforcedPowerLimit") == 2


def test_a_transient_error_is_unknown_for_that_sample_only(fake, open_backend):
    backend = open_backend()
    fake.inject_following(0, "TotalEnergyConsumption", (), [fake_nvml.err(pynvml.NVML_ERROR_UNKNOWN)])
    assert counters_of(backend, H100_A).total_energy_mj is None
    fake.advance(1.0)
    assert counters_of(backend, H100_A).total_energy_mj == 350_000


def test_links_past_the_last_one_are_not_reported(install_fake, open_backend):
    gpu = fake_nvml.h100_sxm5(0)
    gpu.set_attr("NvLinkState", (17,), ret=pynvml.NVML_ERROR_NOT_SUPPORTED)  # a link fused off
    fake = install_fake(fake_nvml.FakeNvml([gpu]))
    links = [link.link for link in counters_of(open_backend(), gpu.uuid).nvlinks]
    assert links == list(range(17))
    # Probed once at open across all NVML_NVLINK_MAX_LINKS indexes, then only the 17 real links,
    # all in one field-value call.
    assert fake.call_count("nvmlDeviceGetNvLinkState") == pynvml.NVML_NVLINK_MAX_LINKS
    link_calls = [asked for asked in _link_scopes_asked(fake) if asked]
    assert link_calls == [set(range(17))]


def _link_scopes_asked(fake) -> list[set[int]]:
    """The links (scopes) of NVLink state fields in each nvmlDeviceGetFieldValues call."""
    asked = []
    for name, args in fake.calls:
        if name == "nvmlDeviceGetFieldValues":
            count, values = args[1].value, args[2]._obj
            asked.append({values[i].scopeId for i in range(count) if values[i].fieldId == 165})
    return asked


def test_an_older_driver_without_the_link_fields_reads_each_link(install_fake, open_backend):
    gpu = fake_nvml.h100_sxm5(0)
    gpu.set_attr("NvLinkState", (2,), value=pynvml.NVML_FEATURE_DISABLED)
    gpu.set_attr("NvLinkErrorCounter", (2, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT), value=5)
    fake = install_fake(fake_nvml.FakeNvml([gpu]))
    for field_id in (161, 162, 163, 165):
        for link in range(18):
            fake.inject_field(0, field_id, scope=link, ret=pynvml.NVML_ERROR_INVALID_ARGUMENT)
    backend = open_backend(nvlink_interval_s=0.0)
    for t in (NOW, NOW + 1):
        link2 = counters_of(backend, gpu.uuid, t).nvlinks[2]
        assert link2 == model.NvLinkCounters(2, active=False, crc_errors=5, replay_errors=0, recovery_errors=0)
    assert [asked for asked in _link_scopes_asked(fake) if asked] == [set(range(18))]  # asked once


def test_nvlink_error_counters_are_none_where_unsupported_but_state_is_reported(install_fake, open_backend):
    gpu = fake_nvml.h100_sxm5(0)
    gpu.unsupport("NvLinkErrorCounter")  # Blackwell (NVLink5) answers NOT_SUPPORTED here
    install_fake(fake_nvml.FakeNvml([gpu]))
    link0 = counters_of(open_backend(), gpu.uuid).nvlinks[0]
    assert link0 == model.NvLinkCounters(0, active=True, crc_errors=None, replay_errors=None, recovery_errors=None)


# ----- set_power_limit --------------------------------------------------------------------------------


def test_set_power_limit_sends_milliwatts_and_returns_the_enforced_limit_read_back(fake, open_backend):
    backend = open_backend()
    assert backend.set_power_limit(H100_A, 450) == 450
    (args,) = [a for name, a in fake.calls if name == "nvmlDeviceSetPowerManagementLimit"]
    assert args[1].value == 450_000
    assert fake.gpu(0).requested_limit_mw == 450_000
    c = counters_of(backend, H100_A)
    assert (c.requested_power_limit_w, c.enforced_power_limit_w) == (450, 450)
    assert [r.power_w for r in backend.read_power(NOW) if r.gpu_uuid == H100_A] == [350.0]


@pytest.mark.parametrize("watts", [450, 700, 200])
def test_set_power_limit_waits_for_the_limiter_to_take_the_new_limit(fake, open_backend, watts):
    # Seen on a real H200: the enforced limit still read the old value at once and followed 10-12 ms
    # after the set. The first read must not be reported as the outcome, or a decrease that was applied
    # looks unconfirmed to the power manager.
    fake.gpu(0).requested_limit_mw = 600_000
    fake.gpu(0).enforce_lag_reads = 3
    backend = open_backend()
    assert backend.set_power_limit(H100_A, watts) == watts


def test_set_power_limit_under_a_lower_out_of_band_limit_returns_that_limit(fake, open_backend):
    g = fake.gpu(0)
    g.oob_limit_mw, g.enforce_lag_reads = 400_000, 2
    backend = open_backend()
    # The decrease to 500 W lands under the BMC's 400 W, which stays in force: the answer is the truth.
    assert backend.set_power_limit(H100_A, 500) == 400
    assert backend.set_power_limit(H100_A, 300) == 300


def test_set_power_limit_reports_a_limit_the_limiter_never_takes_as_it_stands(fake, open_backend):
    fake.gpu(0).enforce_lag_reads = 10**9  # a limiter that never follows: unconfirmed, after the settle time
    backend = open_backend()
    assert backend.set_power_limit(H100_A, 450) == 700


def test_set_power_limit_without_root_raises_no_permission_and_changes_nothing(fake, open_backend):
    fake.is_root = False
    backend = open_backend()
    with pytest.raises(gpu.NoPermission):
        backend.set_power_limit(H100_A, 450)
    assert counters_of(backend, H100_A).requested_power_limit_w == 700


@pytest.mark.parametrize("watts", [199, 701, 0, -5])
def test_set_power_limit_outside_constraints_raises_invalid_value_before_the_driver(fake, open_backend, watts):
    backend = open_backend()
    with pytest.raises(gpu.InvalidValue, match=r"\[200, 700\] W"):
        backend.set_power_limit(H100_A, watts)
    assert fake.call_count("nvmlDeviceSetPowerManagementLimit") == 0


@pytest.mark.parametrize(
    ("nvml_code", "error"),
    [
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, gpu.InvalidValue),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, gpu.NotSupported),
        (pynvml.NVML_ERROR_NO_PERMISSION, gpu.NoPermission),
        (pynvml.NVML_ERROR_UNKNOWN, gpu.BackendError),
    ],
)
def test_set_power_limit_maps_driver_errors(fake, open_backend, nvml_code, error):
    backend = open_backend()
    fake.inject(0, "SetPowerManagementLimit", ret=nvml_code)
    with pytest.raises(error):
        backend.set_power_limit(H100_A, 450)


def test_a_set_that_reports_success_but_changes_nothing_is_an_error(fake, open_backend):
    backend = open_backend()
    fake.inject(0, "SetPowerManagementLimit", ret=pynvml.NVML_SUCCESS)  # silently ignored by the driver
    with pytest.raises(gpu.BackendError, match="700000 mW requested"):
        backend.set_power_limit(H100_A, 450)


def test_set_power_limit_for_an_unknown_uuid_raises_gpu_not_found(fake, open_backend):
    with pytest.raises(gpu.GpuNotFound):
        open_backend().set_power_limit("GPU-ffffffff-ffff-ffff-ffff-ffffffffffff", 450)


def test_set_power_limit_on_a_lost_gpu_raises_gpu_lost_and_reports_the_loss(fake, open_backend):
    backend = open_backend()
    fake.lose(0)
    with pytest.raises(gpu.GpuLost):
        backend.set_power_limit(H100_A, 450)
    with pytest.raises(gpu.GpuLost):
        backend.set_power_limit(H100_A, 450)  # known lost: NVML is not asked again
    (lost,) = backend.poll_events(NOW, 0)
    assert (lost.kind, lost.gpu_uuid, lost.observed_unix_ns) == (model.EventKind.GPU_LOST, H100_A, NOW)


# ----- events -----------------------------------------------------------------------------------------


def test_xid_event_becomes_an_xid_observation_of_that_gpu(fake, open_backend):
    backend = open_backend()
    fake.emit_xid(1, 79)
    (obs,) = backend.poll_events(NOW, 0.01)
    assert (obs.kind, obs.xid, obs.gpu_uuid, obs.source) == (model.EventKind.XID, 79, H100_B, "nvml")
    assert obs.observed_unix_ns == NOW
    assert obs.attributes == {"nvml_event_type": "0x8"}


def test_ecc_and_remap_events_map_to_their_kinds(fake, open_backend):
    backend = open_backend()
    fake.emit_dbe(0)
    fake.emit(0, pynvml.nvmlEventTypeSingleBitEccErrorStorm)
    fake.emit(0, pynvml.nvmlEventTypeDramRetirementEvent)
    fake.emit(1, pynvml.nvmlEventTypeDramRetirementFailure)
    fake.emit_recovery_action(1, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    obs = backend.poll_events(NOW, 0)
    assert [(o.kind, o.gpu_uuid, o.severity) for o in obs] == [
        (model.EventKind.ECC_DBE, H100_A, model.Severity.ERROR),
        (model.EventKind.ECC_SBE_RATE, H100_A, model.Severity.WARNING),
        (model.EventKind.ROW_REMAP_PENDING, H100_A, model.Severity.WARNING),
        (model.EventKind.ROW_REMAP_FAILURE, H100_B, model.Severity.ERROR),
        (model.EventKind.RECOVERY_ACTION, H100_B, model.Severity.WARNING),
    ]
    assert obs[-1].attributes["recovery_action"] == "1"


def test_plain_single_bit_ecc_events_are_not_registered(fake, open_backend):
    backend = open_backend()
    fake.emit(0, pynvml.nvmlEventTypeSingleBitEccError)
    assert backend.poll_events(NOW, 0) == []


def test_poll_waits_up_to_the_timeout_in_milliseconds(fake, open_backend):
    backend = open_backend()
    assert backend.poll_events(NOW, 0.025) == []
    waits = [args[2].value for name, args in fake.calls if name == "nvmlEventSetWait_v2"]
    assert waits == [25]
    assert fake.now_ms == 25  # the double's clock, not wall time


def test_poll_returns_an_event_that_arrives_within_the_timeout(fake, open_backend):
    backend = open_backend()
    fake.emit_xid(0, 43, after_ms=30)
    (obs,) = backend.poll_events(NOW, 0.5)
    assert obs.xid == 43
    assert fake.now_ms == 30
    # After the first event the rest of the queue is drained without waiting again.
    assert [args[2].value for name, args in fake.calls if name == "nvmlEventSetWait_v2"] == [500, 0]


def test_poll_with_zero_timeout_does_not_wait(fake, open_backend):
    backend = open_backend()
    assert backend.poll_events(NOW, 0) == []
    assert [args[2].value for name, args in fake.calls if name == "nvmlEventSetWait_v2"] == [0]


def test_one_poll_drains_at_most_max_events_per_poll(fake, open_backend):
    backend = open_backend(max_events_per_poll=3)
    for xid in (13, 31, 43, 45, 68):
        fake.emit_xid(0, xid)
    assert [o.xid for o in backend.poll_events(NOW, 0)] == [13, 31, 43]
    assert [o.xid for o in backend.poll_events(NOW, 0)] == [45, 68]


def test_only_supported_event_types_are_registered(install_fake, open_backend):
    gpu = fake_nvml.consumer(0)  # supports Xid and P-state events only
    fake = install_fake(fake_nvml.FakeNvml([gpu]))
    backend = open_backend()
    (args,) = [a for name, a in fake.calls if name == "nvmlDeviceRegisterEvents"]
    assert args[1].value == pynvml.nvmlEventTypeXidCriticalError
    fake.emit_xid(0, 31)
    assert [o.xid for o in backend.poll_events(NOW, 0)] == [31]


def test_a_gpu_without_event_support_is_left_unregistered(fake, open_backend):
    fake.inject(1, "SupportedEventTypes", ret=pynvml.NVML_ERROR_NOT_SUPPORTED)
    backend = open_backend()
    assert fake.call_count("nvmlDeviceRegisterEvents") == 1
    fake.emit_xid(0, 48)
    assert [o.gpu_uuid for o in backend.poll_events(NOW, 0)] == [H100_A]


def test_without_event_watching_poll_reports_losses_and_creates_no_event_set(fake, open_backend):
    backend = open_backend(watch_events=False)
    assert fake.call_count("nvmlEventSetCreate") == 0
    assert backend.poll_events(NOW, 0.001) == []
    fake.lose(1)
    backend.read_power(NOW)
    assert [o.kind for o in backend.poll_events(NOW, 0)] == [model.EventKind.GPU_LOST]


# ----- lost GPUs --------------------------------------------------------------------------------------


def test_a_lost_gpu_is_reported_once_and_skipped_while_the_others_continue(fake, open_backend):
    backend = open_backend()
    fake.lose(0)
    assert [r.gpu_uuid for r in backend.read_power(NOW)] == [H100_B]
    assert [r.gpu_uuid for r in backend.read_power(NOW + 1)] == [H100_B]
    assert [c.gpu_uuid for c in backend.read_counters(NOW + 2)] == [H100_B]
    (lost,) = backend.poll_events(NOW + 3, 0)
    assert lost.kind == model.EventKind.GPU_LOST
    assert (lost.gpu_uuid, lost.severity, lost.observed_unix_ns) == (H100_A, model.Severity.FATAL, NOW)
    assert lost.attributes == {"pci_bus_id": "00000000:18:00.0"}
    assert backend.poll_events(NOW + 4, 0) == []


def test_a_gpu_lost_in_the_middle_of_a_counter_read_is_skipped(fake, open_backend):
    backend = open_backend()
    fake.inject(1, "RemappedRows", ret=pynvml.NVML_ERROR_GPU_IS_LOST)
    assert [c.gpu_uuid for c in backend.read_counters(NOW)] == [H100_A]
    assert [(o.kind, o.gpu_uuid) for o in backend.poll_events(NOW, 0)] == [(model.EventKind.GPU_LOST, H100_B)]


def test_event_wait_gpu_is_lost_finds_the_gpu_and_keeps_watching_the_others(fake, open_backend):
    backend = open_backend()
    fake.lose(0)  # nothing has read GPU 0 since: the event wait is the first to notice
    obs = backend.poll_events(NOW, 0.01)
    assert [(o.kind, o.gpu_uuid) for o in obs] == [(model.EventKind.GPU_LOST, H100_A)]
    assert fake.live_event_sets() == 1  # the old set was freed and a new one built without GPU 0
    fake.emit_xid(1, 94)
    assert [(o.xid, o.gpu_uuid) for o in backend.poll_events(NOW, 0.01)] == [(94, H100_B)]


def test_a_loss_seen_by_a_read_replaces_the_event_set_before_the_next_wait(fake, open_backend):
    backend = open_backend()
    fake.lose(1)
    backend.read_power(NOW)
    assert [(o.kind, o.gpu_uuid) for o in backend.poll_events(NOW, 0.01)] == [(model.EventKind.GPU_LOST, H100_B)]
    fake.emit_xid(0, 31)
    assert [(o.kind, o.gpu_uuid) for o in backend.poll_events(NOW, 0.01)] == [(model.EventKind.XID, H100_A)]
    # The stale set was never waited on, so no GPU had to be probed to find the lost one.
    assert fake.call_count("nvmlDeviceGetPerformanceState") == 0
    assert fake.live_event_sets() == 1


def test_a_gpu_lost_before_the_agent_starts_is_reported_by_nvml_index(fake, open_backend):
    fake.lose(0)
    backend = open_backend()
    assert [i.uuid for i in backend.inventory()] == [H100_B]
    (lost,) = backend.poll_events(NOW, 0)
    assert (lost.kind, lost.gpu_uuid, lost.attributes, lost.observed_unix_ns) == (
        model.EventKind.GPU_LOST,
        "",
        {"nvml_index": "0"},
        NOW,
    )


# ----- lifecycle --------------------------------------------------------------------------------------


def test_close_frees_the_event_set_shuts_nvml_down_and_is_idempotent(fake, open_backend):
    backend = open_backend()
    assert (fake.refcount, fake.live_event_sets()) == (1, 1)
    backend.close()
    backend.close()
    assert (fake.refcount, fake.live_event_sets()) == (0, 0)
    with pytest.raises(gpu.BackendError, match="closed"):
        backend.read_power(NOW)


def test_open_failure_after_init_shuts_nvml_down_again(fake):
    fake.inject(0, "PowerManagementLimitConstraints", ret=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with pytest.raises(gpu.BackendError, match="reload the driver"):
        nvml.open_nvml_backend()
    assert fake.refcount == 0


def test_close_wakes_a_poll_that_is_pacing_without_an_event_set(fake, open_backend):
    """With no event set, poll_events paces the caller's loop; closing must not wait that out."""
    backend = open_backend(watch_events=False)
    closer = threading.Timer(0.1, backend.close)
    started = time.monotonic()
    closer.start()
    assert backend.poll_events(NOW, 30.0) == []
    closer.join()
    assert time.monotonic() - started < 5.0


def test_the_pcie_link_is_read_with_the_nvlinks_and_its_best_only_once(fake, open_backend):
    g = fake.gpu(0)
    g.set_attr("CurrPcieLinkWidth", value=8)
    g.set_attr("CurrPcieLinkGeneration", value=4)
    backend = open_backend(nvlink_interval_s=10.0)
    c = counters_of(backend, H100_A)
    assert (c.pcie_link_width, c.pcie_link_width_max, c.pcie_link_gen, c.pcie_link_gen_max) == (8, 16, 4, 5)
    fake.calls.clear()
    g.set_attr("CurrPcieLinkWidth", value=16)
    assert counters_of(backend, H100_A, NOW + 1_000_000_000).pcie_link_width == 8  # not due: the last reading
    assert fake.call_count("nvmlDeviceGetCurrPcieLinkWidth") == 0
    assert counters_of(backend, H100_A, NOW + 10_000_000_000).pcie_link_width == 16  # due with the links
    assert fake.call_count("nvmlDeviceGetMaxPcieLinkWidth") == 0  # the link's best: read once


def test_a_gpu_without_pcie_link_calls_reports_none_for_the_link(install_fake, open_backend):
    gpu = fake_nvml.h100_sxm5(0)
    for key in ("CurrPcieLinkWidth", "MaxPcieLinkWidth", "CurrPcieLinkGeneration", "MaxPcieLinkGeneration"):
        gpu.unsupport(key)
    install_fake(fake_nvml.FakeNvml([gpu]))
    c = counters_of(open_backend(), gpu.uuid)
    assert (c.pcie_link_width, c.pcie_link_width_max, c.pcie_link_gen, c.pcie_link_gen_max) == (None,) * 4
