"""The scenario checklist of nvml-api.md §10.3, one test per row, against NvmlBackend and the double.

Rows whose "expected agent behaviour" belongs to the agent loop or the decision core (degraded mode,
counter-reset deltas, quarantine) are checked here only for what the backend must hand them: the
right error type, or the raw values unaltered. No marker or environment variable is needed.
"""

from __future__ import annotations

import fake_nvml
import pynvml  # noqa: TID251  (constants for scripting the double)
import pytest

from rasd.agent import gpu
from rasd.agent.core import model
from rasd.agent.gpu import nvml

NOW = 1_800_000_000_000_000_000
H100_A, H100_B = fake_nvml.h100_sxm5(0).uuid, fake_nvml.h100_sxm5(1).uuid


def counters_of(backend, uuid):
    (counters,) = [c for c in backend.read_counters(NOW) if c.gpu_uuid == uuid]
    return counters


# Row: no driver in container -> degraded mode, no crash loop (the backend raises one BackendError).
def test_no_nvml_library_in_the_container_raises_backend_error(install_fake, monkeypatch):
    def no_library(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")

    fake_nvml.uninstall()
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    with pytest.raises(gpu.BackendError, match="NVML unavailable"):
        nvml.open_nvml_backend()


def test_driver_not_loaded_raises_backend_error(fake):
    fake.driver_loaded = False
    with pytest.raises(gpu.BackendError, match="Driver Not Loaded"):
        nvml.open_nvml_backend()


# Row: driver upgraded under the agent -> alert and request a reload.
def test_driver_upgraded_at_start_asks_for_a_reload(fake):
    fake.rm_mismatch = True
    with pytest.raises(gpu.BackendError, match="version mismatch"):
        nvml.open_nvml_backend()


def test_driver_upgraded_under_a_running_agent_fails_reads_and_event_waits_with_a_reload_request(fake, open_backend):
    backend = open_backend()
    fake.rm_mismatch = True
    with pytest.raises(gpu.BackendError, match="reload the driver"):
        backend.read_power(NOW)
    with pytest.raises(gpu.BackendError, match="reload the driver"):
        backend.read_counters(NOW)
    with pytest.raises(gpu.BackendError, match="reload the driver"):
        backend.poll_events(NOW, 0)


# Row: non-root -> report; never silently assume success (and read back after _v2).
def test_non_root_set_is_reported_as_no_permission(fake, open_backend):
    fake.is_root = False
    backend = open_backend()
    with pytest.raises(gpu.NoPermission):
        backend.set_power_limit(H100_A, 500)
    assert fake.gpu(0).requested_limit_mw == 700_000


# Row: power cap out of range -> the constraints are what the agent clamps to.
def test_out_of_range_cap_is_invalid_and_the_constraints_are_in_the_inventory(fake, open_backend):
    backend = open_backend()
    info = backend.inventory()[0]
    assert (info.power_limit_min_w, info.power_limit_max_w) == (200, 700)
    with pytest.raises(gpu.InvalidValue):
        backend.set_power_limit(H100_A, info.power_limit_max_w + 1)
    assert backend.set_power_limit(H100_A, info.power_limit_max_w) == 700


# Row: OOB cap lower than user cap -> the controller uses the enforced value.
def test_out_of_band_cap_lower_than_the_request_is_what_set_returns(fake, open_backend):
    fake.gpu(0).oob_limit_mw = 400_000  # the BMC caps the board
    backend = open_backend()
    assert backend.set_power_limit(H100_A, 500) == 400
    c = counters_of(backend, H100_A)
    assert (c.requested_power_limit_w, c.enforced_power_limit_w) == (500, 400)


# Row: feature absent -> mark the capability absent and stop polling it.
def test_absent_feature_is_none_and_no_longer_polled(fake, open_backend):
    fake.gpu(0).unsupport("UtilizationRates")  # as with MIG enabled
    backend = open_backend()
    assert counters_of(backend, H100_A).utilization_gpu_pct is None
    assert counters_of(backend, H100_A).utilization_gpu_pct is None
    assert counters_of(backend, H100_B).utilization_gpu_pct == 0
    # Three reads of both GPUs: GPU 0 was asked once, GPU 1 every time.
    assert fake.call_count("nvmlDeviceGetUtilizationRates") == 1 + 3


# Row: old driver -> fall back to older symbols or field ids.
def test_old_driver_without_new_symbols_uses_the_older_ones(install_fake, open_backend):
    absent = {
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetFieldValues",
    }
    gpu0 = fake_nvml.h100_sxm5(0)
    gpu0.demand_mw = 800_000  # over the limit: SwPowerCap
    fake = install_fake(fake_nvml.FakeNvml([gpu0], absent_symbols=absent))
    backend = open_backend()
    c = counters_of(backend, gpu0.uuid)
    assert c.temperature_c == 35
    assert c.clock_event_reasons == model.ClockEventReason.SW_POWER_CAP
    assert c.recovery_action is None  # only readable as a field value
    assert [r.power_w for r in backend.read_power(NOW)] == [700.0]
    assert fake.call_count("nvmlDeviceGetTemperature") == 1
    assert fake.call_count("nvmlDeviceGetCurrentClocksThrottleReasons") == 1
    assert fake.call_count("nvmlDeviceGetPowerUsage") == 1


def test_old_driver_without_the_v1_set_uses_v2_and_still_sees_its_errors(install_fake, open_backend):
    """pynvml's _v2 wrapper drops the C return code; the backend calls the symbol and checks it."""
    fake = install_fake(
        fake_nvml.FakeNvml([fake_nvml.h100_sxm5(0)], absent_symbols={"nvmlDeviceSetPowerManagementLimit"})
    )
    backend = open_backend()
    assert backend.set_power_limit(H100_A, 450) == 450
    fake.is_root = False
    with pytest.raises(gpu.NoPermission):
        backend.set_power_limit(H100_A, 300)
    assert fake.call_count("nvmlDeviceSetPowerManagementLimit_v2") == 2
    assert fake.gpu(0).requested_limit_mw == 450_000


# Row: Xid 79 / fallen off the bus -> quarantine by UUID; count drops after removal.
def test_gpu_fallen_off_the_bus_is_reported_by_uuid_and_gone_after_removal(fake, open_backend):
    backend = open_backend()
    fake.emit_xid(0, 79)
    fake.lose(0)
    obs = backend.poll_events(NOW, 0.01)
    assert [(o.kind, o.gpu_uuid) for o in obs] == [(model.EventKind.GPU_LOST, H100_A)]
    assert [r.gpu_uuid for r in backend.read_power(NOW)] == [H100_B]
    backend.close()
    fake.remove(0)
    reopened = open_backend()
    assert [i.uuid for i in reopened.inventory()] == [H100_B]
    assert reopened.poll_events(NOW, 0) == []


# Row: Xid 48/94/95, DBE event -> drain.
def test_xid_48_94_95_and_dbe_events_are_drained_in_one_poll(fake, open_backend):
    backend = open_backend()
    fake.emit_xid(0, 48)
    fake.emit_dbe(0)
    fake.emit_xid(1, 94)
    fake.emit_xid(1, 95)
    obs = backend.poll_events(NOW, 0.01)
    assert [(o.kind, o.xid, o.gpu_uuid) for o in obs] == [
        (model.EventKind.XID, 48, H100_A),
        (model.EventKind.ECC_DBE, None, H100_A),
        (model.EventKind.XID, 94, H100_B),
        (model.EventKind.XID, 95, H100_B),
    ]


# Row: recovery action sequence -> field 230 DRAIN_P2P, then after the drain GPU_RESET.
def test_recovery_action_sequence_is_followed_through_field_230(fake, open_backend):
    backend = open_backend()
    fake.emit_recovery_action(0, pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P)
    (event,) = backend.poll_events(NOW, 0)
    assert (event.kind, event.attributes["recovery_action"]) == (model.EventKind.RECOVERY_ACTION, "3")
    assert counters_of(backend, H100_A).recovery_action == pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P
    fake.gpu(0).set_field(pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    assert counters_of(backend, H100_A).recovery_action == pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET


# Row: row-remap pending / failure -> schedule a reset / RMA.
@pytest.mark.parametrize(
    ("rows", "pending", "failure"),
    [((3, 1, 1, 0), True, False), ((3, 8, 0, 1), False, True)],
)
def test_row_remap_pending_and_failure_are_reported(fake, open_backend, rows, pending, failure):
    fake.gpu(0).set_attr("RemappedRows", value=rows)
    c = counters_of(open_backend(), H100_A)
    assert (c.remapped_rows_correctable, c.remapped_rows_uncorrectable) == rows[:2]
    assert (c.remapped_rows_pending, c.remapped_rows_failure) == (pending, failure)


# Row: counters reset by a driver reload -> handled by the core; the backend reports raw values.
def test_counters_reset_by_a_driver_reload_are_reported_as_read(fake, open_backend):
    sbe_vol = (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)
    sbe_agg = (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC)
    fake.gpu(0).set_attr("TotalEccErrors", sbe_vol, value=9)
    fake.gpu(0).set_attr("TotalEccErrors", sbe_agg, value=50)
    backend = open_backend()
    fake.advance(10.0)
    before = counters_of(backend, H100_A)
    fake.reload_driver()
    after = counters_of(backend, H100_A)
    assert (before.total_energy_mj, before.ecc_sbe_volatile, before.ecc_sbe_aggregate) == (3_500_000, 9, 50)
    assert (after.total_energy_mj, after.ecc_sbe_volatile, after.ecc_sbe_aggregate) == (0, 0, 50)


# Row: wait timeout -> the loop continues and stays responsive.
def test_wait_timeout_returns_nothing_after_the_timeout(fake, open_backend):
    backend = open_backend()
    assert backend.poll_events(NOW, 0.005) == []
    assert fake.now_ms == 5
    assert backend.poll_events(NOW, 0.005) == []
    assert fake.now_ms == 10


# Row: shutdown / re-init -> re-acquire handles by UUID.
def test_reopening_after_close_finds_the_same_gpus_by_uuid(fake, open_backend):
    first = open_backend()
    uuids = [i.uuid for i in first.inventory()]
    first.close()
    assert fake.refcount == 0
    second = open_backend()
    assert [i.uuid for i in second.inventory()] == uuids
    assert second.set_power_limit(uuids[1], 300) == 300


# Row: per-field failure -> use the other values.
def test_one_failing_field_entry_does_not_hide_the_others(fake, open_backend):
    fake.gpu(0).set_field(pynvml.NVML_FI_PWR_SMOOTHING_ENABLED, 1)
    fake.inject_field(0, pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, ret=pynvml.NVML_ERROR_UNKNOWN)
    c = counters_of(open_backend(), H100_A)
    assert (c.recovery_action, c.power_smoothing_enabled) == (None, True)
