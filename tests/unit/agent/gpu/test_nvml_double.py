"""The NVML double is faithful: the real pynvml.py, run against it, behaves as nvml-api.md says.

These tests pin the hook (pynvml private names, the validated nvidia-ml-py version) and the quirks
(§9) the backend relies on, so a pynvml upgrade that breaks the double fails here first.
"""

from __future__ import annotations

import ctypes
import importlib.metadata

import fake_nvml
import pynvml  # noqa: TID251  (the double's own tests talk to pynvml directly)
import pytest


def test_canary_pynvml_private_hook_names_and_pinned_version_still_exist():
    assert hasattr(pynvml, "nvmlLib")
    assert isinstance(pynvml._nvmlGetFunctionPointer_cache, dict)
    assert isinstance(pynvml._nvmlLib_refcount, int)
    assert importlib.metadata.version("nvidia-ml-py") == fake_nvml.PINNED_NVML_PY


def test_calls_before_init_raise_uninitialized(fake):
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_handles_are_unhashable_and_compare_by_identity(fake):
    pynvml.nvmlInit()
    a, b = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(0)
    assert a != b
    with pytest.raises(TypeError):
        hash(a)
    assert pynvml.nvmlDeviceGetUUID(a) == pynvml.nvmlDeviceGetUUID(b) == fake.gpu(0).uuid
    pynvml.nvmlShutdown()


def test_strings_and_shapes_are_the_real_ones(fake):
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    assert pynvml.nvmlDeviceGetPciInfo(h).busId == fake.gpu(1).pci_bus_id
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200_000, 700_000]  # a list
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)  # a tuple
    assert pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU) == 35
    assert pynvml.nvmlDeviceGetHandleByUUID(fake.gpu(1).uuid) is not None
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    pynvml.nvmlShutdown()


def test_errors_compare_by_value_and_are_unhashable(fake):
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError) as info:
        pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)  # Hopper: page retirement unsupported
    assert info.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert isinstance(info.value, pynvml.NVMLError_NotSupported)
    with pytest.raises(TypeError):
        hash(info.value)
    with pytest.raises(AttributeError):
        _ = info.value == 3  # pynvml's __eq__ reads other.value
    pynvml.nvmlShutdown()


def test_error_string_for_codes_without_builtin_text_comes_from_the_fake_library(fake):
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)) == "fake NVML error 19"


def test_field_values_carry_a_return_code_per_entry(fake):
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    # NVLink5's per-link receive errors: not an H100 counter.
    instant, link3 = pynvml.nvmlDeviceGetFieldValues(
        h, [pynvml.NVML_FI_DEV_POWER_INSTANT, (pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS, 3)]
    )
    assert (instant.nvmlReturn, instant.valueType, instant.value.uiVal) == (0, 1, 350_000)
    assert instant.timestamp > 0
    assert (link3.fieldId, link3.scopeId, link3.nvmlReturn) == (208, 3, pynvml.NVML_ERROR_NOT_SUPPORTED)
    pynvml.nvmlShutdown()


def test_fields_with_a_function_twin_answer_what_the_function_answers(fake):
    gpu = fake.gpu(0)
    gpu.set_attr("TotalEccErrors", (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC), value=5)
    gpu.set_attr("RemappedRows", value=(4, 2, 1, 0))
    gpu.set_attr("NvLinkState", (2,), value=pynvml.NVML_FEATURE_DISABLED)
    gpu.set_attr("NvLinkErrorCounter", (2, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT), value=9)
    fake.inject(0, "PcieReplayCounter", value=7)
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    ids = [4, 143, 144, 94, 190, 192, (165, 2), (165, 1), (163, 2), (165, 40)]
    got = {(fv.fieldId, fv.scopeId): (fv.nvmlReturn, fv.value.ullVal if fv.valueType == 3 else fv.value.uiVal)
           for fv in pynvml.nvmlDeviceGetFieldValues(h, ids)}  # fmt: skip
    assert got[(4, 0)] == (0, pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0)) == (0, 5)
    assert got[(143, 0)] == (0, 2) and got[(144, 0)] == (0, 1)
    assert got[(94, 0)] == (0, pynvml.nvmlDeviceGetPcieReplayCounter(h))  # the override reaches both
    assert got[(190, 0)] == (0, pynvml.nvmlDeviceGetEnforcedPowerLimit(h))
    assert got[(192, 0)] == (0, pynvml.nvmlDeviceGetPowerManagementLimit(h))
    assert got[(165, 2)] == (0, pynvml.NVML_NVLINK_STATE_INACTIVE)
    assert got[(165, 1)] == (0, pynvml.NVML_NVLINK_STATE_ACTIVE)
    assert got[(163, 2)] == (0, 9)
    assert got[(165, 40)][0] == pynvml.NVML_ERROR_INVALID_ARGUMENT  # past NVML_NVLINK_MAX_LINKS
    pynvml.nvmlShutdown()


def test_the_power_sample_buffer_returns_samples_newer_than_asked_or_not_found(fake):
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    value_type, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)
    assert value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert len(samples) == fake.gpu(0).power_buffer_size  # a driver that has run a while: a full ring
    assert {s.sampleValue.uiVal for s in samples} == {350_000}
    stamps = [s.timeStamp for s in samples]
    assert stamps == sorted(stamps) and stamps[1] - stamps[0] == 20_000  # every 20 ms, in µs
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer yet
        pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_TOTAL_POWER_SAMPLES, stamps[-1])
    fake.gpu(0).demand_mw = 500_000
    fake.advance(0.1)
    _, newer = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_TOTAL_POWER_SAMPLES, stamps[-1])
    assert [s.timeStamp - stamps[-1] for s in newer] == [20_000, 40_000, 60_000, 80_000, 100_000]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    fake.gpu(1).power_sample_period_ms = None  # a driver without the buffer
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetSamples(pynvml.nvmlDeviceGetHandleByIndex(1), pynvml.NVML_TOTAL_POWER_SAMPLES, 0)
    pynvml.nvmlShutdown()


def test_v2_set_never_raises_even_without_permission(fake):
    """nvml-api.md §9.1: pynvml ignores the C return code of the _v2 set."""
    fake.is_root = False
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceSetPowerManagementLimit_v2(h, pynvml.NVML_POWER_SCOPE_GPU, 300_000) == 0
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 700_000  # nothing changed
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceSetPowerManagementLimit(h, 300_000)
    pynvml.nvmlShutdown()


def test_retired_pages_use_the_two_call_protocol(install_fake):
    gpu = fake_nvml.v100_sxm2(0)
    dbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    gpu.set_attr("RetiredPages", (dbe,), value=[0x1000, 0x2000, 0x3000])
    fake = install_fake(fake_nvml.FakeNvml([gpu]))
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetRetiredPages(h, dbe) == [0x1000, 0x2000, 0x3000]
    first, second = [args for name, args in fake.calls if name == "nvmlDeviceGetRetiredPages"]
    assert first[3] is None and second[3] is not None  # size query, then the buffer
    pynvml.nvmlShutdown()


def test_strict_mode_fails_loudly_on_a_symbol_the_fake_lacks(fake):
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(AssertionError, match="nvmlDeviceGetFanSpeed"):
        pynvml.nvmlDeviceGetFanSpeed(h)
    pynvml.nvmlShutdown()


def test_absent_symbol_looks_like_an_older_driver(install_fake):
    install_fake(fake_nvml.FakeNvml([fake_nvml.h100_sxm5(0)], absent_symbols={"nvmlDeviceGetTemperatureV"}))
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 35
    pynvml.nvmlShutdown()


def test_override_beats_preset_and_one_shot_queue_beats_override_then_falls_back(fake):
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    fake.inject(0, "PcieReplayCounter", value=7)
    fake.inject_following(0, "PcieReplayCounter", (), [fake_nvml.ok(1), fake_nvml.err(999)])
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 1
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetPcieReplayCounter(h)
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 7
    fake.reset(0)
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 0
    pynvml.nvmlShutdown()


def test_lost_gpu_answers_gpu_is_lost_and_removal_shrinks_the_count(fake):
    pynvml.nvmlInit()
    old = pynvml.nvmlDeviceGetHandleByIndex(0)
    fake.lose(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetPowerUsage(old)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetCount() == 2
    fake.remove(0)
    assert pynvml.nvmlDeviceGetCount() == 1
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)) == fake.gpu(1).uuid
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetPowerUsage(old)
    pynvml.nvmlShutdown()


def test_calls_after_shutdown_raise_uninitialized(fake):
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetPowerUsage(h)


def test_event_wait_times_out_on_the_fake_clock_then_delivers_a_due_event(fake):
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    fake.emit_xid(0, 48, after_ms=50)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait(es, 10)
    assert fake.now_ms == 10
    data = pynvml.nvmlEventSetWait(es, 1000)
    assert fake.now_ms == 50  # returned when the event arrived, not at the timeout
    assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 48)
    assert pynvml.nvmlDeviceGetUUID(data.device) == fake.gpu(0).uuid
    pynvml.nvmlEventSetFree(es)
    pynvml.nvmlShutdown()


def test_register_rejects_a_mask_with_any_unsupported_type(install_fake):
    install_fake(fake_nvml.FakeNvml([fake_nvml.consumer(0)]))
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    es = pynvml.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(
            h, pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError, es
        )
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    pynvml.nvmlEventSetFree(es)
    pynvml.nvmlShutdown()


def test_missing_library_raises_library_not_found(monkeypatch):
    """No install: pynvml would dlopen libnvidia-ml.so.1; make that fail as in a driverless container."""

    def no_library(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")

    fake_nvml.uninstall()
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()
    assert pynvml.nvmlLib is None


def test_handle_out_parameter_is_written_at_the_ctypes_boundary(fake):
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    assert ctypes.cast(h, ctypes.c_void_p).value is not None
    pynvml.nvmlShutdown()
