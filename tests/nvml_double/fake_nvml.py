"""A fake libnvidia-ml at the ctypes boundary, so the real pynvml.py runs unchanged in tests.

How it works (nvml-api.md §10.1): pynvml loads the C library into the module global `pynvml.nvmlLib`
only when it is None, and resolves every C symbol with `getattr(nvmlLib, name)`. `install(fake)` puts a
`FakeNvml` there. Every fake symbol is a plain Python function that receives exactly the ctypes objects
pynvml passes to C (`byref(...)` out-parameters, string buffers, by-value `c_uint`s, raw ints), writes
the out-parameters and returns an `nvmlReturn_t` int. So argument marshalling, struct classes, error
classes and pynvml's own quirks (§9: the `_v2` set that never raises, unhashable handles, the two-call
retired-pages protocol) are all the real ones.

State model (borrowed from DCGM's NVML injection library, §10.2):
* `FakeGpu`: identity, power model (demand, user limit, out-of-band limit, energy), NVLink count,
  supported event mask, lost/removed flags, and `attrs[key][extra] = (nvml_return, value)` where `key`
  is the C function name minus `nvmlDevice` and `Get` (`"TotalEccErrors"`) and `extra` the non-handle
  arguments (`(error_type, counter_type)`). A key that is absent means NOT_SUPPORTED; a key that is
  present without that extra means INVALID_ARGUMENT (a link or location the GPU does not have).
* Field values: `fields[(field_id, scope_id)] = (nvml_return, value_type, value)`; absent means
  NOT_SUPPORTED per entry. Power fields (185/186) are derived from the power model, and the fields
  that have a function twin (limits 190/192, energy 83, ECC 3-6, retired pages 29-31, row remaps
  142-145, PCIe replays 94, per-link NVLink state 165 and errors 161-163) from the same state the
  function reads, through the same overrides and one-shot queues (`_DERIVED_FIELDS`), as the
  driver answers both from one place. A state the function answers INVALID_ARGUMENT for (a link
  the GPU lacks) is INVALID_ARGUMENT in the entry too. Field 163 (DL_CRC) is taken to be the flit
  CRC count that nvmlDeviceGetNvLinkErrorCounter reports as NVML_NVLINK_ERROR_DL_CRC_FLIT; a
  recorder run on a GPU node should confirm it.
* Power samples (`nvmlDeviceGetSamples`, NVML_TOTAL_POWER_SAMPLES): the driver samples each GPU's
  draw every `power_sample_period_ms` into a ring of `power_buffer_size` samples, stamped in µs on
  the fake clock (or the wall clock with `wall_clock=True`, for benchmarks that run in real time).
  A query for samples newer than its timestamp answers NOT_FOUND when there is none, as the driver
  does. `power_sample_period_ms = None` makes the call NOT_SUPPORTED. The 20 ms default is what
  nvidia-smi's "Power Samples" shows on A100/H100-class boards (119 samples over ~2.4 s); other
  drivers sample slower, which the agent's open-time probe must handle.
* Precedence, lowest first: preset state < `inject()` overrides < `inject_following()` one-shot queues.
  `reset(index)` drops the overrides and queues.
* Library flags: `driver_loaded`, `rm_mismatch` (also after init: driver upgraded under the agent),
  `is_root` (setters return NO_PERMISSION when False), the init refcount (0 => UNINITIALIZED).
* Events: per event set, a queue of events stamped with a due time on a fake millisecond clock.
  `nvmlEventSetWait_v2` returns the first event due within the timeout (advancing the fake clock to
  it), or advances the clock by the whole timeout and returns TIMEOUT; nothing really sleeps. With
  `wall_clock=True` it blocks in real time, as the driver does, until an event is emitted or a GPU
  lost, or the timeout passes.
  A lost GPU registered in the set makes the wait return GPU_IS_LOST, as the real driver does.
* Strict mode (go-nvml moq style): a symbol the fake does not implement raises AssertionError, which
  pynvml does not turn into FUNCTION_NOT_FOUND, so an unexpected call fails the test loudly.
  `absent_symbols` simulates an older driver (AttributeError -> NVMLError_FunctionNotFound).
* `calls` logs every symbol call with its arguments (the newest `call_log_limit` of them, when set).

The preset numbers are representative of the named boards (datasheet power limits, link counts) but
were not captured from real nodes; a recorder run on a GPU node should replace them (§10.2).

Validated against nvidia-ml-py 13.615.71 (`PINNED_NVML_PY`); the hook relies on pynvml's private names
`nvmlLib`, `_nvmlGetFunctionPointer_cache` and `_nvmlLib_refcount`, which a canary test checks.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pynvml  # noqa: TID251  (the double sits at pynvml's C edge)

PINNED_NVML_PY = "13.615.71"

# Fake handles are small integers dressed as pointers. pynvml never dereferences a device or event-set
# handle, it only passes it back to C, so no memory is needed behind them.
_DEVICE_BASE = 0x5EED_0000
_EVENT_SET_BASE = 0x7E57_0000
_EPOCH_US = 1_790_000_000_000_000  # fake wall clock origin for field-value timestamps (µs since 1970)

SUCCESS = pynvml.NVML_SUCCESS
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
INSUFFICIENT_SIZE = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
LIB_RM_VERSION_MISMATCH = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
ARGUMENT_VERSION_MISMATCH = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH

UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
DOUBLE = pynvml.NVML_VALUE_TYPE_DOUBLE
ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_UNION_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

_VOL, _AGG = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
_SBE, _DBE = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED

SUPPORTED_EVENTS_DATACENTER = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeSingleBitEccErrorStorm
    | pynvml.nvmlEventTypeDramRetirementEvent
    | pynvml.nvmlEventTypeDramRetirementFailure
    | pynvml.nvmlEventTypeGpuRecoveryAction
)

Attr = tuple[int, Any]  # (nvml_return, value)


def ok(value: Any) -> Attr:
    return (SUCCESS, value)


def err(code: int) -> Attr:
    return (code, None)


@dataclasses.dataclass
class FakeGpu:
    """One fake GPU. Power values are mW, energy mJ, as NVML reports them."""

    uuid: str
    name: str
    pci_bus_id: str
    pci_device_id: int
    serial: str | None
    vbios: str
    memory_total_bytes: int
    power_min_mw: int
    power_max_mw: int
    power_default_mw: int
    demand_mw: int
    nvlink_count: int
    supported_events: int
    attrs: dict[str, dict[tuple, Attr]] = dataclasses.field(default_factory=dict)
    fields: dict[tuple[int, int], tuple[int, int, Any]] = dataclasses.field(default_factory=dict)
    requested_limit_mw: int = 0
    oob_limit_mw: int | None = None
    # The real limiter takes a new limit a little after the set returns (an H200 showed the old enforced
    # limit for 10-12 ms). After a set, this many reads of the enforced limit still return the old one.
    enforce_lag_reads: int = 0
    lagging_enforced_mw: int | None = None
    lagging_reads_left: int = 0
    energy_mj: int = 0
    base_clock_reasons: int = 0
    power_instant_field: bool = True
    power_sample_period_ms: float | None = 20.0
    power_buffer_size: int = 120
    lost: bool = False
    removed: bool = False

    def __post_init__(self) -> None:
        if not self.requested_limit_mw:
            self.requested_limit_mw = self.power_default_mw

    def enforced_limit_mw(self) -> int:
        if self.oob_limit_mw is None:
            return self.requested_limit_mw
        return min(self.requested_limit_mw, self.oob_limit_mw)

    def read_enforced_limit_mw(self) -> int:
        """What nvmlDeviceGetEnforcedPowerLimit returns: the old limit for enforce_lag_reads reads after a set."""
        if self.lagging_reads_left > 0 and self.lagging_enforced_mw is not None:
            self.lagging_reads_left -= 1
            return self.lagging_enforced_mw
        return self.enforced_limit_mw()

    def power_mw(self) -> int:
        # The power limiter holds draw at the enforced limit; that is what sets SwPowerCap.
        return min(self.demand_mw, self.enforced_limit_mw())

    def clock_reasons(self) -> int:
        capped = pynvml.nvmlClocksEventReasonSwPowerCap if self.demand_mw > self.enforced_limit_mw() else 0
        return self.base_clock_reasons | capped

    def set_attr(self, key: str, extra: tuple = (), *, ret: int = SUCCESS, value: Any = None) -> None:
        self.attrs.setdefault(key, {})[extra] = (ret, value)

    def set_field(self, field_id: int, value: Any, *, scope: int = 0, value_type: int = UINT) -> None:
        self.fields[(field_id, scope)] = (SUCCESS, value_type, value)

    def unsupport(self, key: str) -> None:
        self.attrs.pop(key, None)


def _uuid(seed: int, index: int) -> str:
    h = f"{seed:08x}{index:024x}"
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _datacenter_counters(gpu: FakeGpu) -> None:
    for err_type in (_SBE, _DBE):
        for counter in (_VOL, _AGG):
            gpu.set_attr("TotalEccErrors", (err_type, counter), value=0)
    gpu.set_attr("UtilizationRates", value=(0, 0))
    gpu.set_attr("Temperature", (pynvml.NVML_TEMPERATURE_GPU,), value=35)
    gpu.set_attr("PcieReplayCounter", value=0)
    for key, value in (
        ("CurrPcieLinkWidth", 16), ("MaxPcieLinkWidth", 16), ("CurrPcieLinkGeneration", 5), ("MaxPcieLinkGeneration", 5)
    ):  # fmt: skip
        gpu.set_attr(key, value=value)
    gpu.set_attr("PerformanceState", value=0)
    for link in range(gpu.nvlink_count):
        gpu.set_attr("NvLinkState", (link,), value=pynvml.NVML_FEATURE_ENABLED)
        for counter in range(pynvml.NVML_NVLINK_ERROR_COUNT):
            gpu.set_attr("NvLinkErrorCounter", (link, counter), value=0)
    if gpu.nvlink_count == 0:
        gpu.unsupport("NvLinkState")


def h100_sxm5(index: int, seed: int = 0x1100) -> FakeGpu:
    """Hopper: row remapping (no page retirement), 18 NVLinks, recovery-action field."""
    gpu = FakeGpu(
        uuid=_uuid(seed, index),
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        pci_device_id=0x233010DE,
        serial=f"16520220{index:05d}",
        vbios="96.00.74.00.01",
        memory_total_bytes=80 * 1024**3,
        power_min_mw=200_000,
        power_max_mw=700_000,
        power_default_mw=700_000,
        demand_mw=350_000,
        nvlink_count=18,
        supported_events=SUPPORTED_EVENTS_DATACENTER,
    )
    _datacenter_counters(gpu)
    gpu.set_attr("RemappedRows", value=(0, 0, 0, 0))
    gpu.set_attr("RetiredPagesPendingStatus", ret=NOT_SUPPORTED)
    gpu.set_field(pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, pynvml.NVML_GPU_RECOVERY_ACTION_NONE)
    return gpu


def v100_sxm2(index: int, seed: int = 0x0100) -> FakeGpu:
    """Volta: page retirement (no row remapping), 6 NVLinks, no recovery-action or instant-power field."""
    gpu = FakeGpu(
        uuid=_uuid(seed, index),
        name="Tesla V100-SXM2-32GB",
        pci_bus_id=f"00000000:{0x1A + 0x10 * index:02X}:00.0",
        pci_device_id=0x1DB510DE,
        serial=f"03231180{index:05d}",
        vbios="88.00.80.00.01",
        memory_total_bytes=32 * 1024**3,
        power_min_mw=150_000,
        power_max_mw=300_000,
        power_default_mw=300_000,
        demand_mw=250_000,
        nvlink_count=6,
        supported_events=SUPPORTED_EVENTS_DATACENTER & ~pynvml.nvmlEventTypeGpuRecoveryAction,
        power_instant_field=False,
    )
    _datacenter_counters(gpu)
    for cause in (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    ):
        gpu.set_attr("RetiredPages", (cause,), value=[])
    gpu.set_attr("RetiredPagesPendingStatus", value=0)
    return gpu


def consumer(index: int, seed: int = 0xC0) -> FakeGpu:
    """A board that supports little: no ECC, serial, row remap, NVLink, recovery action or energy."""
    gpu = FakeGpu(
        uuid=_uuid(seed, index),
        name="NVIDIA GeForce RTX 4090",
        pci_bus_id=f"00000000:{0x01 + index:02X}:00.0",
        pci_device_id=0x268410DE,
        serial=None,
        vbios="95.02.18.80.5F",
        memory_total_bytes=24 * 1024**3,
        power_min_mw=150_000,
        power_max_mw=600_000,
        power_default_mw=450_000,
        demand_mw=100_000,
        nvlink_count=0,
        supported_events=pynvml.nvmlEventTypePState | pynvml.nvmlEventTypeXidCriticalError,
    )
    gpu.set_attr("UtilizationRates", value=(3, 1))
    gpu.set_attr("Temperature", (pynvml.NVML_TEMPERATURE_GPU,), value=41)
    gpu.set_attr("PcieReplayCounter", value=0)
    gpu.set_attr("PerformanceState", value=8)
    gpu.set_attr("TotalEnergyConsumption", ret=NOT_SUPPORTED)
    return gpu


@dataclasses.dataclass
class _Event:
    due_ms: float
    gpu_id: int
    event_type: int
    data: int
    gpu_instance_id: int = 0xFFFFFFFF
    compute_instance_id: int = 0xFFFFFFFF


@dataclasses.dataclass
class _EventSet:
    registered: dict[int, int] = dataclasses.field(default_factory=dict)  # gpu id -> mask
    queue: list[_Event] = dataclasses.field(default_factory=list)
    freed: bool = False


class FakeNvml:
    """The fake C library. Install with `install(fake)`; see the module docstring."""

    def __init__(
        self,
        gpus: Iterable[FakeGpu],
        *,
        strict: bool = True,
        absent_symbols: Iterable[str] = (),
        wall_clock: bool = False,
        call_log_limit: int | None = None,
    ):
        self.gpus: list[FakeGpu] = list(gpus)
        self.strict = strict
        self.absent_symbols: set[str] = set(absent_symbols)
        self.driver_loaded = True
        self.rm_mismatch = False
        self.is_root = True
        self.refcount = 0
        self.now_ms = 0.0
        self.wall_clock = wall_clock
        self.calls: list[tuple[str, tuple]] = []
        self._call_log_limit = call_log_limit
        self._event_wake = threading.Condition()  # wall-clock waits: woken by emit() and lose()
        self._power_buffers: dict[int, collections.deque[tuple[int, int]]] = {}
        self._power_sampled_us: dict[int, int] = {}
        self._overrides: dict[tuple[int, str, tuple | None], Attr] = {}
        self._queues: dict[tuple[int, str, tuple], collections.deque[Attr]] = {}
        self._event_sets: list[_EventSet] = []

    # ----- test API ---------------------------------------------------------------------------------

    def gpu(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def inject(self, index: int, key: str, extra: tuple | None = (), *, ret: int = SUCCESS, value=None):
        """Override `key` (for one `extra`, or every extra when extra is None) until `reset`."""
        self._overrides[(index, key, extra)] = (ret, value)

    def inject_field(self, index: int, field_id: int, *, scope: int = 0, ret: int = SUCCESS, value=None):
        """Override one field value entry (unsigned int) until `reset`."""
        self._overrides[(index, f"field:{field_id}", (scope,))] = (ret, value)

    def inject_following(self, index: int, key: str, extra: tuple, results: Iterable[Attr]) -> None:
        """Answer the next calls of `key`/`extra` from `results`, one each, then fall back."""
        self._queues.setdefault((index, key, extra), collections.deque()).extend(results)

    def reset(self, index: int) -> None:
        for k in [k for k in self._overrides if k[0] == index]:
            del self._overrides[k]
        for k in [k for k in self._queues if k[0] == index]:
            del self._queues[k]

    def lose(self, index: int) -> None:
        """The GPU falls off the bus: every call on it (and waits on sets holding it) return GPU_IS_LOST."""
        self.gpus[index].lost = True
        with self._event_wake:
            self._event_wake.notify_all()

    def remove(self, index: int) -> None:
        """The driver drops a lost GPU: it leaves enumeration; old handles stay lost (nvmlRemoveGpu)."""
        self.gpus[index].lost = True
        self.gpus[index].removed = True

    def restore(self, index: int) -> None:
        self.gpus[index].lost = False
        self.gpus[index].removed = False

    def now_us(self) -> int:
        """The driver's CPU clock, µs since 1970: the fake clock, or the wall clock with `wall_clock`."""
        return int(time.time() * 1e6) if self.wall_clock else _EPOCH_US + int(self.now_ms * 1000)

    def advance(self, seconds: float) -> None:
        """Move the fake clock; energy integrates the power each GPU draws (mW * s = mJ).

        The power buffers sample the draw as it was up to now before the clock moves.
        """
        for gpu_id in range(len(self.gpus)):
            self._sample_power(gpu_id)
        self.now_ms += seconds * 1000.0
        for gpu in self.gpus:
            if not gpu.lost:
                gpu.energy_mj += int(gpu.power_mw() * seconds)

    def reload_driver(self) -> None:
        """A driver reload: energy and volatile ECC counters restart from 0; aggregate ECC persists."""
        for gpu in self.gpus:
            gpu.energy_mj = 0
            for (err_type, counter), _ in list(gpu.attrs.get("TotalEccErrors", {}).items()):
                if counter == _VOL:
                    gpu.set_attr("TotalEccErrors", (err_type, counter), value=0)

    def emit(self, index: int, event_type: int, data: int = 0, *, after_ms: float = 0.0) -> None:
        """Queue an event on every set that registered this type for this GPU (due after `after_ms`)."""
        for es in self._event_sets:
            if not es.freed and es.registered.get(index, 0) & event_type:
                es.queue.append(_Event(self.now_ms + after_ms, index, event_type, data))
                es.queue.sort(key=lambda e: e.due_ms)
        with self._event_wake:
            self._event_wake.notify_all()

    def emit_xid(self, index: int, xid: int, *, after_ms: float = 0.0) -> None:
        self.emit(index, pynvml.nvmlEventTypeXidCriticalError, xid, after_ms=after_ms)

    def emit_dbe(self, index: int) -> None:
        self.emit(index, pynvml.nvmlEventTypeDoubleBitEccError)

    def emit_recovery_action(self, index: int, action: int) -> None:
        gpu = self.gpus[index]
        gpu.set_field(pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, action)
        self.emit(index, pynvml.nvmlEventTypeGpuRecoveryAction, action)

    def call_count(self, name: str) -> int:
        return sum(1 for n, _ in self.calls if n == name)

    def live_event_sets(self) -> int:
        return sum(1 for es in self._event_sets if not es.freed)

    # ----- symbol dispatch --------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Callable[..., Any]:
        # Only reached for names not found normally, i.e. the C symbols pynvml asks for.
        if not name.startswith("nvml") or name in self.absent_symbols:
            raise AttributeError(name)
        impl = getattr(type(self), "_sym_" + name, None)
        if impl is None:
            if self.strict:
                raise AssertionError(f"fake NVML: unexpected call to {name}; implement it or allow it")
            raise AttributeError(name)

        # A plain function, not a bound method: pynvml assigns `fn.restype` (nvmlErrorString).
        def symbol(*args: Any) -> Any:
            self.calls.append((name, args))
            limit = self._call_log_limit
            if limit is not None and len(self.calls) > 2 * limit:
                del self.calls[:-limit]
            return impl(self, *args)

        symbol.__name__ = name
        return symbol

    # ----- helpers ----------------------------------------------------------------------------------

    def _check_lib(self) -> int:
        if self.refcount == 0:
            return UNINITIALIZED
        if self.rm_mismatch:
            return LIB_RM_VERSION_MISMATCH
        return SUCCESS

    def _device(self, handle: Any) -> tuple[int, int]:
        """(return code, gpu id) for a device handle argument."""
        ret = self._check_lib()
        if ret:
            return ret, -1
        address = ctypes.cast(handle, ctypes.c_void_p).value
        gpu_id = (address or 0) - _DEVICE_BASE
        if not 0 <= gpu_id < len(self.gpus):
            return INVALID_ARGUMENT, -1
        if self.gpus[gpu_id].lost:
            return GPU_IS_LOST, gpu_id
        return SUCCESS, gpu_id

    def _lookup(self, gpu_id: int, key: str, extra: tuple = ()) -> Attr:
        queue = self._queues.get((gpu_id, key, extra))
        if queue:
            return queue.popleft()
        for k in ((gpu_id, key, extra), (gpu_id, key, None)):
            if k in self._overrides:
                return self._overrides[k]
        dynamic = self._dynamic(self.gpus[gpu_id], key)
        if dynamic is not None:
            return dynamic
        table = self.gpus[gpu_id].attrs.get(key)
        if table is None:
            return err(NOT_SUPPORTED)
        return table.get(extra, err(INVALID_ARGUMENT))

    @staticmethod
    def _dynamic(gpu: FakeGpu, key: str) -> Attr | None:
        fn = _DYNAMIC.get(key)
        if fn is None:
            return None
        if key == "TotalEnergyConsumption" and "TotalEnergyConsumption" in gpu.attrs:
            return None  # an explicit preset entry (e.g. NOT_SUPPORTED) wins over the model
        return ok(fn(gpu))

    def _scalar(self, handle: Any, key: str, ref: Any, extra: tuple = ()) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        ret, value = self._lookup(gpu_id, key, extra)
        if ret == SUCCESS:
            ref._obj.value = value
        return ret

    @staticmethod
    def _write_pointer(ref: Any, address: int) -> None:
        ctypes.memmove(
            ctypes.addressof(ref._obj),
            ctypes.byref(ctypes.c_void_p(address)),
            ctypes.sizeof(ctypes.c_void_p),
        )

    @staticmethod
    def _write_string(buf: Any, length: Any, text: str) -> int:
        raw = text.encode()
        if len(raw) + 1 > getattr(length, "value", length):
            return INSUFFICIENT_SIZE
        buf.value = raw
        return SUCCESS

    def _enumerated(self) -> list[int]:
        return [i for i, gpu in enumerate(self.gpus) if not gpu.removed]

    # ----- init, enumeration, identity --------------------------------------------------------------

    def _sym_nvmlInitWithFlags(self, flags: Any) -> int:
        if not self.driver_loaded:
            return DRIVER_NOT_LOADED
        if self.rm_mismatch:
            return LIB_RM_VERSION_MISMATCH
        self.refcount += 1
        return SUCCESS

    def _sym_nvmlShutdown(self) -> int:
        # C NVML reports success even when called more often than init.
        self.refcount = max(0, self.refcount - 1)
        return SUCCESS

    def _sym_nvmlErrorString(self, result: Any) -> bytes:
        return f"fake NVML error {getattr(result, 'value', result)}".encode()

    def _sym_nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        ret = self._check_lib()
        if ret == SUCCESS:
            ref._obj.value = len(self._enumerated())
        return ret

    def _sym_nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        ret = self._check_lib()
        if ret:
            return ret
        enumerated = self._enumerated()
        i = getattr(index, "value", index)
        if not 0 <= i < len(enumerated):
            return INVALID_ARGUMENT
        gpu_id = enumerated[i]
        if self.gpus[gpu_id].lost:
            return GPU_IS_LOST
        self._write_pointer(ref, _DEVICE_BASE + gpu_id)
        return SUCCESS

    def _sym_nvmlDeviceGetHandleByUUID(self, uuid: Any, ref: Any) -> int:
        ret = self._check_lib()
        if ret:
            return ret
        wanted = uuid.value.decode()
        for gpu_id in self._enumerated():
            if self.gpus[gpu_id].uuid == wanted:
                if self.gpus[gpu_id].lost:
                    return GPU_IS_LOST
                self._write_pointer(ref, _DEVICE_BASE + gpu_id)
                return SUCCESS
        return NOT_FOUND

    def _sym_nvmlDeviceGetUUID(self, handle: Any, buf: Any, length: Any) -> int:
        ret, gpu_id = self._device(handle)
        return ret or self._write_string(buf, length, self.gpus[gpu_id].uuid)

    def _sym_nvmlDeviceGetName(self, handle: Any, buf: Any, length: Any) -> int:
        ret, gpu_id = self._device(handle)
        return ret or self._write_string(buf, length, self.gpus[gpu_id].name)

    def _sym_nvmlDeviceGetSerial(self, handle: Any, buf: Any, length: Any) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        serial = self.gpus[gpu_id].serial
        return NOT_SUPPORTED if serial is None else self._write_string(buf, length, serial)

    def _sym_nvmlDeviceGetVbiosVersion(self, handle: Any, buf: Any, length: Any) -> int:
        ret, gpu_id = self._device(handle)
        return ret or self._write_string(buf, length, self.gpus[gpu_id].vbios)

    def _sym_nvmlDeviceGetPciInfo_v3(self, handle: Any, ref: Any) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        gpu, info = self.gpus[gpu_id], ref._obj
        domain, bus, rest = gpu.pci_bus_id.split(":")
        info.busId = gpu.pci_bus_id
        info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{rest}"
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        info.pciDeviceId = gpu.pci_device_id
        info.pciSubSystemId = 0x16C110DE
        return SUCCESS

    def _sym_nvmlDeviceGetMemoryInfo(self, handle: Any, ref: Any) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        mem = ref._obj
        mem.total = self.gpus[gpu_id].memory_total_bytes
        mem.used = 0
        mem.free = mem.total
        return SUCCESS

    def _sym_nvmlDeviceGetPerformanceState(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "PerformanceState", ref)

    # ----- power ------------------------------------------------------------------------------------

    def _sym_nvmlDeviceGetPowerUsage(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "PowerUsage", ref)

    def _sym_nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "TotalEnergyConsumption", ref)

    def _sym_nvmlDeviceGetPowerManagementLimit(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "PowerManagementLimit", ref)

    def _sym_nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "EnforcedPowerLimit", ref)

    def _sym_nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "PowerManagementDefaultLimit", ref)

    def _sym_nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any, lo: Any, hi: Any) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        ret, value = self._lookup(gpu_id, "PowerManagementLimitConstraints")
        if ret == SUCCESS:
            lo._obj.value, hi._obj.value = value
        return ret

    def _scripted(self, gpu_id: int, key: str) -> int | None:
        """The return code a test scripted for a setter, if any (queue first, then override)."""
        queue = self._queues.get((gpu_id, key, ()))
        if queue:
            return queue.popleft()[0]
        override = self._overrides.get((gpu_id, key, ())) or self._overrides.get((gpu_id, key, None))
        return None if override is None else override[0]

    def _set_limit(self, gpu_id: int, limit_mw: int) -> int:
        # A scripted outcome replaces the setter entirely: inject(..., "SetPowerManagementLimit",
        # ret=SUCCESS) is a driver that reports success and changes nothing.
        scripted = self._scripted(gpu_id, "SetPowerManagementLimit")
        if scripted is not None:
            return scripted
        # Order as in the driver: privilege before range.
        if not self.is_root:
            return NO_PERMISSION
        gpu = self.gpus[gpu_id]
        if not gpu.power_min_mw <= limit_mw <= gpu.power_max_mw:
            return INVALID_ARGUMENT
        if gpu.enforce_lag_reads:
            gpu.lagging_enforced_mw, gpu.lagging_reads_left = gpu.enforced_limit_mw(), gpu.enforce_lag_reads
        gpu.requested_limit_mw = limit_mw
        return SUCCESS

    def _sym_nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: Any) -> int:
        ret, gpu_id = self._device(handle)
        return ret or self._set_limit(gpu_id, limit.value)

    def _sym_nvmlDeviceSetPowerManagementLimit_v2(self, handle: Any, ref: Any) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        value = ref._obj
        if value.version != pynvml.nvmlPowerValue_v2:
            return ARGUMENT_VERSION_MISMATCH
        if value.powerScope != pynvml.NVML_POWER_SCOPE_GPU:
            return NOT_SUPPORTED
        return self._set_limit(gpu_id, value.powerValueMw)

    def _sample_power(self, gpu_id: int) -> collections.deque[tuple[int, int]]:
        """The GPU's power ring, sampled up to now at its period with the draw the model gives now."""
        gpu = self.gpus[gpu_id]
        period_us = int((gpu.power_sample_period_ms or 0) * 1000)
        ring = self._power_buffers.setdefault(gpu_id, collections.deque(maxlen=gpu.power_buffer_size))
        if period_us <= 0 or gpu.lost:
            return ring
        now = self.now_us()
        # A driver that has run a while holds a full ring; a long gap refills only the newest ring.
        oldest = now - period_us * gpu.power_buffer_size
        t = max(self._power_sampled_us.get(gpu_id, oldest), oldest) + period_us
        draw = gpu.power_mw()
        while t <= now:
            ring.append((t, draw))
            t += period_us
        self._power_sampled_us[gpu_id] = t - period_us
        return ring

    def _sym_nvmlDeviceGetSamples(
        self, handle: Any, sampling: Any, last_seen: Any, value_type: Any, count: Any, samples: Any
    ) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        scripted = self._scripted(gpu_id, "Samples")
        if scripted is not None and scripted != SUCCESS:
            return scripted
        gpu = self.gpus[gpu_id]
        if (
            gpu.power_sample_period_ms is None
            or getattr(sampling, "value", sampling) != pynvml.NVML_TOTAL_POWER_SAMPLES
        ):
            return NOT_SUPPORTED
        seen = getattr(last_seen, "value", last_seen)
        newer = [entry for entry in self._sample_power(gpu_id) if entry[0] > seen]
        if not newer:
            return NOT_FOUND  # nvml.h: no sample since lastSeenTimeStamp
        value_type._obj.value = UINT  # power samples are unsigned int, mW
        if samples is None:  # the size query
            count._obj.value = len(newer)
            return SUCCESS
        filled = min(count._obj.value, len(newer))
        for i, (t_us, mw) in enumerate(newer[:filled]):
            sample = samples[i]
            _SAMPLE_TIME.__set__(sample, t_us)
            _SAMPLE_VALUE.__get__(sample).uiVal = mw
        count._obj.value = filled
        return SUCCESS

    # Power smoothing (Blackwell+): supported where field 251 (PWR_SMOOTHING_ENABLED) is present.
    def _smoothing(self, handle: Any, ref: Any) -> tuple[int, int, Any]:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret, gpu_id, None
        if (pynvml.NVML_FI_PWR_SMOOTHING_ENABLED, 0) not in self.gpus[gpu_id].fields:
            return NOT_SUPPORTED, gpu_id, None
        if not self.is_root:
            return NO_PERMISSION, gpu_id, None
        return SUCCESS, gpu_id, ref._obj

    def _sym_nvmlDevicePowerSmoothingUpdatePresetProfileParam(self, handle: Any, ref: Any) -> int:
        ret, gpu_id, profile = self._smoothing(handle, ref)
        if ret:
            return ret
        if profile.version != pynvml.nvmlPowerSmoothingProfile_v1:
            return ARGUMENT_VERSION_MISMATCH
        if profile.profileId >= pynvml.NVML_POWER_SMOOTHING_MAX_NUM_PROFILES or profile.value < 0:
            return INVALID_ARGUMENT
        if profile.paramId == pynvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR and profile.value > 100:
            return INVALID_ARGUMENT
        field = {0: pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_PERCENT_TMP_FLOOR,
                 1: pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_UP_RATE,
                 2: pynvml.NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_DOWN_RATE}.get(profile.paramId)  # fmt: skip
        if field is None:
            return INVALID_ARGUMENT
        # As the driver does: ramp rates are set in W/s and read back through the fields in mW/s.
        value = profile.value * 1000 if profile.paramId in (1, 2) else profile.value
        self.gpus[gpu_id].set_field(field, value, scope=profile.profileId, value_type=DOUBLE)
        return SUCCESS

    def _sym_nvmlDevicePowerSmoothingActivatePresetProfile(self, handle: Any, ref: Any) -> int:
        ret, gpu_id, profile = self._smoothing(handle, ref)
        if ret:
            return ret
        if profile.profileId >= pynvml.NVML_POWER_SMOOTHING_MAX_NUM_PROFILES:
            return INVALID_ARGUMENT
        self.gpus[gpu_id].set_field(pynvml.NVML_FI_PWR_SMOOTHING_ACTIVE_PRESET_PROFILE, profile.profileId)
        return SUCCESS

    def _sym_nvmlDevicePowerSmoothingSetState(self, handle: Any, ref: Any) -> int:
        ret, gpu_id, state = self._smoothing(handle, ref)
        if ret:
            return ret
        if state.version != pynvml.nvmlPowerSmoothingState_v1:
            return ARGUMENT_VERSION_MISMATCH
        self.gpus[gpu_id].set_field(pynvml.NVML_FI_PWR_SMOOTHING_ENABLED, int(state.state))
        return SUCCESS

    def _sym_nvmlDeviceGetFieldValues(self, handle: Any, count: Any, ref: Any) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        gpu, values = self.gpus[gpu_id], ref._obj
        looked_up: dict[tuple[str, tuple], Attr] = {}  # one driver query per state per call
        now_us = self.now_us()
        # As C would: read the requests from the array's memory and write each entry back whole.
        memory = (ctypes.c_char * (_FV_SIZE * count.value)).from_address(ctypes.addressof(values))
        for i, (field_id, scope) in enumerate(_FV_REQUEST.iter_unpack(memory.raw)):
            ret, value_type, value = self._field(gpu_id, gpu, (field_id, scope), looked_up)
            # A value type newer than pynvml's (a newer driver's) is written as its 8 raw bytes.
            union = _VALUE_PACK.get(value_type, _VALUE_PACK[3]).pack(value) if ret == SUCCESS else bytes(8)
            _FV_ENTRY.pack_into(memory, i * _FV_SIZE, field_id, scope, now_us, 12, value_type, ret, union)
        return SUCCESS

    def _field(
        self, gpu_id: int, gpu: FakeGpu, key: tuple[int, int], looked_up: dict[tuple[str, tuple], Attr]
    ) -> tuple[int, int, Any]:
        override = self._overrides.get((gpu_id, f"field:{key[0]}", (key[1],)))
        if override is not None:
            return (override[0], UINT, override[1])
        if key in gpu.fields:
            return gpu.fields[key]
        if gpu.power_instant_field and key in (
            (pynvml.NVML_FI_DEV_POWER_INSTANT, 0),
            (pynvml.NVML_FI_DEV_POWER_AVERAGE, 0),
        ):
            return (SUCCESS, UINT, gpu.power_mw())
        derived = _DERIVED_FIELDS.get(key[0])
        if derived is None:
            return (NOT_SUPPORTED, 0, None)
        state_key, extra_of, value_of, value_type = derived
        extra = extra_of(key[1])
        if extra is None:  # a scope the field does not have
            return (INVALID_ARGUMENT, 0, None)
        if (state_key, extra) not in looked_up:
            looked_up[(state_key, extra)] = self._lookup(gpu_id, state_key, extra)
        ret, state = looked_up[(state_key, extra)]
        if ret != SUCCESS:
            return (ret, 0, None)
        return (SUCCESS, value_type, value_of(state))

    # ----- telemetry --------------------------------------------------------------------------------

    def _sym_nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, ref: Any) -> int:
        return self._scalar(handle, "Temperature", ref, (sensor.value,))

    def _sym_nvmlDeviceGetTemperatureV(self, handle: Any, ref: Any) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        temp = ref._obj
        if temp.version != pynvml.nvmlTemperature_v1:
            return ARGUMENT_VERSION_MISMATCH
        ret, value = self._lookup(gpu_id, "Temperature", (temp.sensorType,))
        if ret == SUCCESS:
            temp.temperature = value
        return ret

    def _sym_nvmlDeviceGetUtilizationRates(self, handle: Any, ref: Any) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        ret, value = self._lookup(gpu_id, "UtilizationRates")
        if ret == SUCCESS:
            ref._obj.gpu, ref._obj.memory = value
        return ret

    def _sym_nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "CurrentClocksEventReasons", ref)

    def _sym_nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any, ref: Any) -> int:
        # The deprecated symbol reads the same register as its replacement.
        return self._scalar(handle, "CurrentClocksEventReasons", ref)

    # ----- memory errors ----------------------------------------------------------------------------

    def _sym_nvmlDeviceGetTotalEccErrors(self, handle: Any, err_type: Any, counter: Any, ref: Any) -> int:
        return self._scalar(handle, "TotalEccErrors", ref, (err_type.value, counter.value))

    def _sym_nvmlDeviceGetRetiredPages(self, handle: Any, cause: Any, count_ref: Any, pages: Any) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        ret, addresses = self._lookup(gpu_id, "RetiredPages", (cause.value,))
        if ret:
            return ret
        count = count_ref._obj
        # Two-call protocol: size query with a NULL buffer, then the fill.
        if pages is None or count.value < len(addresses):
            count.value = len(addresses)
            return INSUFFICIENT_SIZE if addresses else SUCCESS
        for i, address in enumerate(addresses):
            pages[i] = address
        count.value = len(addresses)
        return SUCCESS

    def _sym_nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "RetiredPagesPendingStatus", ref)

    def _sym_nvmlDeviceGetRemappedRows(self, handle: Any, corr: Any, unc: Any, pend: Any, fail: Any) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        ret, value = self._lookup(gpu_id, "RemappedRows")
        if ret == SUCCESS:
            corr._obj.value, unc._obj.value, pend._obj.value, fail._obj.value = value
        return ret

    # ----- links ------------------------------------------------------------------------------------

    def _sym_nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, ref: Any) -> int:
        return self._scalar(handle, "NvLinkState", ref, (getattr(link, "value", link),))

    def _sym_nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: Any, counter: Any, ref: Any) -> int:
        extra = (getattr(link, "value", link), getattr(counter, "value", counter))
        return self._scalar(handle, "NvLinkErrorCounter", ref, extra)

    def _sym_nvmlDeviceGetPcieReplayCounter(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "PcieReplayCounter", ref)

    def _sym_nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "CurrPcieLinkWidth", ref)

    def _sym_nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "MaxPcieLinkWidth", ref)

    def _sym_nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "CurrPcieLinkGeneration", ref)

    def _sym_nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "MaxPcieLinkGeneration", ref)

    # ----- events -----------------------------------------------------------------------------------

    def _event_set(self, handle: Any) -> _EventSet | None:
        address = ctypes.cast(handle, ctypes.c_void_p).value or 0
        i = address - _EVENT_SET_BASE
        if not 0 <= i < len(self._event_sets) or self._event_sets[i].freed:
            return None
        return self._event_sets[i]

    def _sym_nvmlEventSetCreate(self, ref: Any) -> int:
        ret = self._check_lib()
        if ret:
            return ret
        self._event_sets.append(_EventSet())
        self._write_pointer(ref, _EVENT_SET_BASE + len(self._event_sets) - 1)
        return SUCCESS

    def _sym_nvmlEventSetFree(self, handle: Any) -> int:
        es = self._event_set(handle)
        if es is None:
            return INVALID_ARGUMENT
        es.freed = True
        return SUCCESS

    def _sym_nvmlDeviceGetSupportedEventTypes(self, handle: Any, ref: Any) -> int:
        return self._scalar(handle, "SupportedEventTypes", ref)

    def _sym_nvmlDeviceRegisterEvents(self, handle: Any, mask: Any, set_handle: Any) -> int:
        ret, gpu_id = self._device(handle)
        if ret:
            return ret
        es = self._event_set(set_handle)
        if es is None:
            return INVALID_ARGUMENT
        ret, supported = self._lookup(gpu_id, "SupportedEventTypes")
        if ret:
            return ret
        # nvml.h: if any requested type is unsupported, none of them is registered.
        if mask.value & ~supported:
            return NOT_SUPPORTED
        es.registered[gpu_id] = es.registered.get(gpu_id, 0) | mask.value
        return SUCCESS

    def _sym_nvmlEventSetWait_v2(self, set_handle: Any, ref: Any, timeout_ms: Any) -> int:
        ret = self._check_lib()
        if ret:
            return ret
        es = self._event_set(set_handle)
        if es is None:
            return INVALID_ARGUMENT
        if any(self.gpus[gpu_id].lost for gpu_id in es.registered):
            return GPU_IS_LOST
        if self.wall_clock:
            # In real time (benchmarks): block as the driver does until an event is queued or a
            # registered GPU is lost, or the timeout passes; an event's due time is not kept then.
            with self._event_wake:
                self._event_wake.wait_for(
                    lambda: es.queue or any(self.gpus[i].lost for i in es.registered), timeout_ms.value / 1000
                )
            if any(self.gpus[gpu_id].lost for gpu_id in es.registered):
                return GPU_IS_LOST
            if not es.queue:
                return TIMEOUT
            es.queue[0].due_ms = self.now_ms
        deadline = self.now_ms + timeout_ms.value
        if not es.queue or es.queue[0].due_ms > deadline:
            self.now_ms = deadline
            return TIMEOUT
        event = es.queue.pop(0)
        self.now_ms = max(self.now_ms, event.due_ms)
        data = ref._obj
        # A new handle object each time, as the driver does (compare by UUID, never by handle).
        data.device = ctypes.cast(ctypes.c_void_p(_DEVICE_BASE + event.gpu_id), pynvml.c_nvmlDevice_t)
        data.eventType = event.event_type
        data.eventData = event.data
        data.gpuInstanceId = event.gpu_instance_id
        data.computeInstanceId = event.compute_instance_id
        return SUCCESS


_DYNAMIC: dict[str, Callable[[FakeGpu], Any]] = {
    # Values the power model computes when asked (the rest are stored in `FakeGpu.attrs`).
    "PowerUsage": FakeGpu.power_mw,
    "PowerManagementLimit": lambda gpu: gpu.requested_limit_mw,
    "EnforcedPowerLimit": FakeGpu.read_enforced_limit_mw,
    "PowerManagementDefaultLimit": lambda gpu: gpu.power_default_mw,
    "PowerManagementLimitConstraints": lambda gpu: (gpu.power_min_mw, gpu.power_max_mw),
    "TotalEnergyConsumption": lambda gpu: gpu.energy_mj,
    "CurrentClocksEventReasons": FakeGpu.clock_reasons,
    "SupportedEventTypes": lambda gpu: gpu.supported_events,
}

# The fake is C: it reads and writes the structures' memory, not through pynvml's Python
# `__getattribute__`/`__setattr__` (which decode and encode strings). Layout of c_nvmlFieldValue_t:
# fieldId, scopeId (u32), timestamp, latencyUsec (i64), valueType, nvmlReturn (u32), value (8 bytes).
_FV_SIZE = ctypes.sizeof(pynvml.c_nvmlFieldValue_t)
_FV_REQUEST = struct.Struct("=II32x")
_FV_ENTRY = struct.Struct("=IIqqII8s")
assert _FV_SIZE == _FV_ENTRY.size == _FV_REQUEST.size, "pynvml's c_nvmlFieldValue_t changed"
_VALUE_PACK = {
    value_type: struct.Struct("=" + code + "x" * (8 - struct.calcsize("=" + code)))
    for value_type, code in {0: "d", 1: "I", 2: "Q" if ctypes.sizeof(ctypes.c_ulong) == 8 else "I",
                             3: "Q", 4: "q", 5: "i", 6: "H"}.items()
}  # fmt: skip
_SAMPLE_TIME = pynvml.c_nvmlSample_t.timeStamp
_SAMPLE_VALUE = pynvml.c_nvmlSample_t.sampleValue


def _link_extra(*rest: int) -> Callable[[int], tuple | None]:
    """The function's extra arguments for a link-scoped field (scope = link)."""
    return lambda scope: (scope, *rest) if 0 <= scope < pynvml.NVML_NVLINK_MAX_LINKS else None


def _unscoped(extra: tuple) -> Callable[[int], tuple | None]:
    return lambda scope: extra if scope == 0 else None


def _nvlink_state(enabled: int) -> int:
    """GetNvLinkState's FEATURE_ENABLED/DISABLED as field 165's NVML_NVLINK_STATE_ACTIVE/INACTIVE."""
    return (
        pynvml.NVML_NVLINK_STATE_ACTIVE if enabled == pynvml.NVML_FEATURE_ENABLED else pynvml.NVML_NVLINK_STATE_INACTIVE
    )


_RETIRE_SBE = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
_RETIRE_DBE = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
_SAME = lambda value: value  # noqa: E731

_DERIVED_FIELDS: dict[int, tuple[str, Callable[[int], tuple | None], Callable[[Any], Any], int]] = {
    # field id: (state key, its extra from the scope, the field's value from the state, value type)
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: ("TotalEccErrors", _unscoped((_SBE, _VOL)), _SAME, ULL),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: ("TotalEccErrors", _unscoped((_DBE, _VOL)), _SAME, ULL),
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: ("TotalEccErrors", _unscoped((_SBE, _AGG)), _SAME, ULL),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: ("TotalEccErrors", _unscoped((_DBE, _AGG)), _SAME, ULL),
    pynvml.NVML_FI_DEV_RETIRED_SBE: ("RetiredPages", _unscoped((_RETIRE_SBE,)), len, ULL),
    pynvml.NVML_FI_DEV_RETIRED_DBE: ("RetiredPages", _unscoped((_RETIRE_DBE,)), len, ULL),
    pynvml.NVML_FI_DEV_RETIRED_PENDING: ("RetiredPagesPendingStatus", _unscoped(()), _SAME, UINT),
    pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: ("TotalEnergyConsumption", _unscoped(()), _SAME, ULL),
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: ("PcieReplayCounter", _unscoped(()), _SAME, UINT),
    pynvml.NVML_FI_DEV_REMAPPED_COR: ("RemappedRows", _unscoped(()), lambda rows: rows[0], UINT),
    pynvml.NVML_FI_DEV_REMAPPED_UNC: ("RemappedRows", _unscoped(()), lambda rows: rows[1], UINT),
    pynvml.NVML_FI_DEV_REMAPPED_PENDING: ("RemappedRows", _unscoped(()), lambda rows: rows[2], UINT),
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE: ("RemappedRows", _unscoped(()), lambda rows: rows[3], UINT),
    pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: ("EnforcedPowerLimit", _unscoped(()), _SAME, UINT),
    pynvml.NVML_FI_DEV_POWER_REQUESTED_LIMIT: ("PowerManagementLimit", _unscoped(()), _SAME, UINT),
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE: ("NvLinkState", _link_extra(), _nvlink_state, UINT),
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: (
        "NvLinkErrorCounter", _link_extra(pynvml.NVML_NVLINK_ERROR_DL_REPLAY), _SAME, ULL,
    ),
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: (
        "NvLinkErrorCounter", _link_extra(pynvml.NVML_NVLINK_ERROR_DL_RECOVERY), _SAME, ULL,
    ),
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: (
        "NvLinkErrorCounter", _link_extra(pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT), _SAME, ULL,
    ),
}  # fmt: skip
"""Fields the driver answers from the state its functions read (see the module doc)."""


def install(fake: FakeNvml) -> None:
    """Make the real pynvml talk to `fake` instead of libnvidia-ml.so.1."""
    pynvml.nvmlLib = fake
    pynvml._nvmlGetFunctionPointer_cache.clear()  # pointers cached from a previous fake
    pynvml._nvmlLib_refcount = 0


def uninstall() -> None:
    """Undo `install`, including messages pynvml cached from the fake's nvmlErrorString."""
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0
    builtin = {k: v for k, v in pynvml.NVMLError._errcode_to_string.items() if k <= 20 or k == 999}
    pynvml.NVMLError._errcode_to_string = builtin
