"""The NVML backend's prepared field-value requests, through the real pynvml.py against the double.

A request's array is built once and reused call after call, so these check that every value type
reads back as the driver wrote it, that an entry's own error leaves no value (not the last call's),
and that two readers at once never share an array.
"""

from __future__ import annotations

import threading

import fake_nvml
import pynvml  # noqa: TID251  (constants and handles for scripting the double)
import pytest

from rasd.agent.gpu import nvml_device

# One real field id per NVML_VALUE_TYPE_*, each with a value only that member's width and sign can hold.
BY_TYPE = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: (pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_UP_RATE, 1234.5),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: (pynvml.NVML_FI_DEV_POWER_INSTANT, 4_000_000_000),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 2**32 + 7),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: (pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 2**63 + 5),
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: (pynvml.NVML_FI_DEV_ENERGY, -(2**40)),
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: (pynvml.NVML_FI_DEV_MEMORY_TEMP, -40),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: (pynvml.NVML_FI_DEV_EDPP_MULTIPLIER, 65_000),
}
ASK = tuple((field_id, 0) for field_id, _ in BY_TYPE.values())


@pytest.fixture
def handle(install_fake):
    fake = install_fake(fake_nvml.FakeNvml([fake_nvml.h100_sxm5(0)]))
    for value_type, (field_id, value) in BY_TYPE.items():
        fake.gpus[0].set_field(field_id, value, value_type=value_type)
    pynvml.nvmlInit()
    yield fake, pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlShutdown()


def test_every_value_type_reads_back_as_written_call_after_call(handle):
    fake, h = handle
    direct = nvml_device.DirectCalls(pynvml)
    assert direct.usable
    expected = [value for _, value in BY_TYPE.values()]
    assert direct.field_values(h, ASK) == ([0] * len(ASK), expected)
    fake.gpus[0].set_field(pynvml.NVML_FI_DEV_MEMORY_TEMP, 85, value_type=pynvml.NVML_VALUE_TYPE_SIGNED_INT)
    expected[5] = 85
    assert direct.field_values(h, ASK) == ([0] * len(ASK), expected)  # the same array, read again


def test_an_entry_that_failed_this_call_has_no_value_even_where_the_last_call_had_one(handle):
    fake, h = handle
    direct = nvml_device.DirectCalls(pynvml)
    assert direct.field_values(h, ASK)[1][1] == 4_000_000_000
    fake.inject_field(0, pynvml.NVML_FI_DEV_POWER_INSTANT, ret=pynvml.NVML_ERROR_NOT_SUPPORTED)
    returns, values = direct.field_values(h, ASK)
    assert (returns[1], values[1]) == (pynvml.NVML_ERROR_NOT_SUPPORTED, None)
    assert (returns[0], values[0]) == (0, 1234.5)  # the other entries keep answering


def test_a_value_type_newer_than_this_code_reads_as_unknown(handle):
    fake, h = handle
    # NVML_VALUE_TYPE_COUNT (7) is one past the newest member this pynvml knows.
    fake.gpus[0].set_field(pynvml.NVML_FI_DEV_MEMORY_TEMP, 12, value_type=pynvml.NVML_VALUE_TYPE_COUNT)
    returns, values = nvml_device.DirectCalls(pynvml).field_values(h, ASK)
    assert (returns[5], values[5]) == (0, None)


def test_a_reader_that_finds_the_prepared_request_busy_uses_one_of_its_own(handle):
    _, h = handle
    direct = nvml_device.DirectCalls(pynvml)
    direct.field_values(h, ASK)
    busy = direct._requests[ASK]
    results = []
    with busy.lock:  # another thread is in the middle of reading it
        reader = threading.Thread(target=lambda: results.append(direct.field_values(h, ASK)))
        reader.start()
        reader.join(5)
    assert results == [([0] * len(ASK), [value for _, value in BY_TYPE.values()])]
