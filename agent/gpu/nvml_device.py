"""What every part of the NVML backend shares: this node's GPUs as NVML sees them, and how to call NVML.

It owns:

* NVML's return codes and field ids, and the mW -> W conversions (rounded to the budget's safe side);
* `NvmlGpu`, one GPU's adapter state, keyed by UUID (NVML handles are unhashable and compare by
  identity);
* `NvmlDevices`, the node's GPUs plus the call discipline the inventory, sampling, control and
  event parts all follow: a call that answers NOT_SUPPORTED or FUNCTION_NOT_FOUND (an older driver)
  is reported as `None` and not asked again, so a missing feature costs one call, not one a second;
  a GPU_IS_LOST answer from any call marks the GPU lost (by UUID) and queues one GPU_LOST observation
  for `poll_events`, and the GPU is skipped by every later read; a library-wide failure becomes a
  `BackendError` that says what to do.

It never imports `pynvml`: the imported module is handed in (`rasd.agent.gpu.nvml` is the only
importer). Reference: shared/reference/nvml-api.md (pynvml 13.615.71).
"""

from __future__ import annotations

import array
import collections
import contextlib
import ctypes
import dataclasses
import struct
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from rasd.agent import gpu as backend_api
from rasd.agent.core import model

SOURCE = "nvml"
"""The observations' source."""

# NVML return codes (nvml.h). Kept here so the backend needs pynvml only at open time; errors are always
# compared by `NVMLError.value` (pynvml's NVMLError is unhashable and `err == 3` raises).
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
LIB_RM_VERSION_MISMATCH = 18

ABSENT = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND})
"""Codes that mean "this feature is absent here", for good: stop asking."""
LIBRARY_FATAL = frozenset({UNINITIALIZED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, LIB_RM_VERSION_MISMATCH})
"""Codes that mean the library as a whole stopped working; no per-GPU answer is meaningful."""

FIELD_UNION = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
"""nvmlValue_t's member by NVML_VALUE_TYPE_* (field values and samples)."""
FIELD_ABSENT = frozenset({*ABSENT, INVALID_ARGUMENT})
"""A field-value entry's codes that mean "no such field (or scope) here", for good: an older driver
answers INVALID_ARGUMENT for a field id it does not know."""

# NVML field ids (nvml.h), used through nvmlDeviceGetFieldValues.
FI_POWER_INSTANT = 186
FI_RECOVERY_ACTION = 230
FI_PWR_SMOOTHING_ENABLED = 251


def w_up(mw: int) -> int:
    """Convert mW to W rounding up: a limit reported high keeps the power budget on the safe side."""
    return -(-mw // 1000)


def w_down(mw: int) -> int:
    """Convert mW to W rounding down: for a maximum that must never be exceeded."""
    return mw // 1000


@dataclasses.dataclass
class NvmlGpu:
    """Adapter state of one GPU, keyed by UUID (NVML handles are unhashable and compare by identity)."""

    uuid: str
    handle: Any
    info: model.GpuInfo | None = None  # set once identity and limits are read
    links: tuple[int, ...] = ()
    absent: set[str] = dataclasses.field(default_factory=set)
    lost: bool = False
    nvlinks: tuple[model.NvLinkCounters, ...] = ()  # last per-link reading
    nvlinks_unix_ns: int | None = None  # when it was taken
    pcie_link: tuple[int | None, int | None] = (None, None)  # width, generation: read with the NVLinks
    pcie_link_max: tuple[int | None, int | None] | None = None  # width, generation at best: read once
    power_seen_us: int = 0  # the driver's stamp of the newest power sample read from its buffer
    field_plans: dict[Any, tuple[int, tuple[tuple[int, int], ...], tuple[str, ...], tuple[int, ...]]] = (
        dataclasses.field(default_factory=dict)
    )
    """Field-value requests as of len(absent): (that length, entries asked, their absence keys, places)."""


class Lost(Exception):
    """Internal to the NVML backend: an NVML call on this GPU answered GPU_IS_LOST."""


class DirectCalls:
    """The agent's two hot NVML calls (field values, power samples), made through pynvml's C symbol lookup.

    pynvml's wrappers build and read their structures through pynvml's own Python
    `__getattribute__`/`__setattr__` (~1.6 µs an attribute, which decode strings), and
    `nvmlDeviceGetSamples` asks twice (size, then fill) and returns one Python object per sample.
    At 17 counter fields of 8 GPUs a second and some 50 power samples per GPU a second, that was a
    large share of the agent's CPU. Here each distinct request's array is built once and reused
    (`_FieldRequest`: its ids written back over the last answer, the answers read in bulk through
    memoryviews), the samples land in an array that holds a driver's whole ring (one call: NVML
    fills what fits), and both are read from their memory. Errors are pynvml's `NVMLError`, as from
    the wrappers.

    It uses `pynvml._nvmlGetFunctionPointer` (nvidia-ml-py is pinned; a canary test checks the name)
    and checks the structures' layouts; where either differs, `usable` is False and the callers use
    the public wrappers.
    """

    SAMPLE_CAPACITY = 256
    """Samples one read takes at most (a driver's ring holds ~120); the rest come with the next read."""

    def __init__(self, nvml: ModuleType) -> None:
        """Check the layouts and the symbol lookup of this pynvml."""
        self._n = nvml
        fv, sample, value = nvml.c_nvmlFieldValue_t, nvml.c_nvmlSample_t, nvml.c_nvmlValue_t
        self.usable = (
            callable(getattr(nvml, "_nvmlGetFunctionPointer", None))
            and ctypes.sizeof(fv) == 40
            and (fv.fieldId.offset, fv.scopeId.offset) == (0, 4)
            and (fv.valueType.offset, fv.nvmlReturn.offset, fv.value.offset) == (24, 28, 32)
            and ctypes.sizeof(sample) == 16
            and (sample.timeStamp.offset, sample.sampleValue.offset) == (0, 8)
            and ctypes.sizeof(value) == 8
        )
        self._request = struct.Struct("=II32x")
        self._requests: dict[tuple[tuple[int, int], ...], _FieldRequest] = {}
        ul = "Q" if ctypes.sizeof(ctypes.c_ulong) == 8 else "I"
        # A sample's value as array items: (typecode, items per 16-byte sample, index of the value).
        self._sample_layout = {0: ("d", 2, 1), 1: ("I", 4, 2), 2: (ul, 16 // ctypes.sizeof(ctypes.c_ulong), 1),
                               3: ("Q", 2, 1), 4: ("q", 2, 1), 5: ("i", 4, 2), 6: ("H", 8, 4)}  # fmt: skip

    def _call(self, name: str, *args: Any) -> None:
        ret = self._n._nvmlGetFunctionPointer(name)(*args)
        if ret != 0:
            raise self._n.NVMLError(ret)

    def field_values(self, handle: Any, ask: tuple[tuple[int, int], ...]) -> tuple[list[int], list[Any]]:
        """nvmlDeviceGetFieldValues: (nvmlReturn of each (field id, scope), value or None of each), in order.

        Raises:
            NVMLError: the call failed as a whole.
        """
        request = self._requests.get(ask)
        if request is None:
            request = self._requests[ask] = _FieldRequest(self._n.c_nvmlFieldValue_t, ask, self._request)
        # One reader at a time per prepared request; a concurrent one (a command's read-back while
        # the sampler reads) gets a request of its own for this call.
        if not request.lock.acquire(blocking=False):
            request = _FieldRequest(self._n.c_nvmlFieldValue_t, ask, self._request)
            request.lock.acquire()
        try:
            request.reset()
            self._call("nvmlDeviceGetFieldValues", handle, request.count, request.ref)
            return request.read()
        finally:
            request.lock.release()

    def samples(self, handle: Any, sampling_type: int, last_seen_us: int) -> tuple[array.array[int], array.array[Any]]:
        """nvmlDeviceGetSamples: (timestamps µs, values) of the samples newer than last_seen_us.

        Raises:
            NVMLError: as the wrapper does (NOT_FOUND: no newer sample).
        """
        n = self._n
        buffer = (n.c_nvmlSample_t * self.SAMPLE_CAPACITY)()
        value_type, count = ctypes.c_uint(), ctypes.c_uint(self.SAMPLE_CAPACITY)
        self._call(
            "nvmlDeviceGetSamples", handle, ctypes.c_uint(sampling_type), ctypes.c_ulonglong(last_seen_us),
            ctypes.byref(value_type), ctypes.byref(count), buffer,
        )  # fmt: skip
        filled = min(count.value, self.SAMPLE_CAPACITY)
        layout = self._sample_layout.get(value_type.value)
        if layout is None or not filled:
            return array.array("Q"), array.array("Q")
        raw = ctypes.string_at(ctypes.addressof(buffer), 16 * filled)
        typecode, per_sample, index = layout
        return array.array("Q", raw)[0::2], array.array(typecode, raw)[index::per_sample]


class _FieldRequest:
    """A field-value request built once and reused: its array, and views that read the answers in place.

    The array is the C call's own (no copy in or out): before each call the template (ids and
    scopes, the rest zero) is written back over it, and the entries' return codes, value types and
    union members are read through strided memoryviews of its bytes (a 40-byte entry: valueType at
    byte 24, nvmlReturn at 28, the value union at 32).
    """

    _FORMATS = {0: "d", 1: "I", 2: "L", 3: "Q", 4: "q", 5: "i", 6: "H"}
    """NVML_VALUE_TYPE_* -> the union member's memoryview format (L: C's unsigned long, this platform's)."""

    def __init__(self, entry_type: Any, ask: tuple[tuple[int, int], ...], request: struct.Struct) -> None:
        """Prepare the array for ask ((field id, scope) pairs) and its views."""
        self.template = b"".join(request.pack(f, scope) for f, scope in ask)
        self.values = (entry_type * len(ask))()
        self.count = ctypes.c_int32(len(ask))
        self.ref = ctypes.byref(self.values)
        self.lock = threading.Lock()
        self._bytes = memoryview(self.values).cast("B")
        u32 = self._bytes.cast("I")
        self._types, self._returns = u32[6::10], u32[7::10]
        # The union's first item of each entry, for each value type: entry i's union begins at byte 40 i + 32.
        self._views: dict[int, memoryview] = {}
        for value_type, fmt in self._FORMATS.items():
            items = self._bytes.cast(fmt)
            per_8 = 8 // items.itemsize
            self._views[value_type] = items[4 * per_8 :: 5 * per_8]

    def reset(self) -> None:
        """Write the request's ids and scopes back over the last answer."""
        self._bytes[:] = self.template

    def read(self) -> tuple[list[int], list[Any]]:
        """(each entry's nvmlReturn, its value or None): None also for a value type newer than this code."""
        returns, types = self._returns.tolist(), self._types.tolist()
        views = self._views
        # One list per value type present (a C call each), then each entry's item from its type's list.
        columns = {value_type: views[value_type].tolist() for value_type in set(types) if value_type in views}
        unknown = [None] * len(types)
        values = [
            None if ret else columns.get(value_type, unknown)[i]
            for i, (value_type, ret) in enumerate(zip(types, returns, strict=True))
        ]
        return returns, values


class NvmlDevices:
    """This node's GPUs as NVML sees them, and the calls every part of the backend makes through.

    Args:
        nvml: The imported `pynvml` module.
    """

    def __init__(self, nvml: ModuleType) -> None:
        """Start with no GPUs; `set_gpus` adds them once enumerated."""
        self.n = nvml
        self.gpus: list[NvmlGpu] = []
        self.by_uuid: dict[str, NvmlGpu] = {}
        self.pending: collections.deque[model.Observation] = collections.deque()
        """Lost-GPU observations waiting for `poll_events`."""
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self.direct = DirectCalls(nvml)

    def set_gpus(self, gpus: list[NvmlGpu]) -> None:
        """The GPUs found at open time, in inventory order."""
        self.gpus = gpus
        self.by_uuid = {g.uuid: g for g in gpus}

    def live_gpu(self, gpu_uuid: str) -> NvmlGpu:
        """The GPU to act on.

        Raises:
            GpuNotFound: The UUID is not one of this node's GPUs.
            GpuLost: The GPU fell off the bus.
        """
        g = self.by_uuid.get(gpu_uuid)
        if g is None:
            raise backend_api.GpuNotFound(gpu_uuid)
        if g.lost:
            raise backend_api.GpuLost(gpu_uuid)
        return g

    # ----- calls ------------------------------------------------------------------------------------

    def optional(self, g: NvmlGpu, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(handle, *args), or None when unsupported (remembered) or failing this once."""
        if key in g.absent:
            return None
        n = self.n
        try:
            return fn(g.handle, *args)
        except n.NVMLError as e:
            if e.value in ABSENT:
                g.absent.add(key)
                return None
            if e.value == GPU_IS_LOST:
                raise Lost from e
            if e.value in LIBRARY_FATAL:
                raise self.library_error(e, key) from e
            return None  # transient (UNKNOWN, NO_DATA, ...): unknown for this sample only

    def fields(self, g: NvmlGpu, field_ids: Sequence[int]) -> dict[int, Any]:
        """Field values by id (scope 0); None where the entry's own nvmlReturn is not SUCCESS.

        An entry answering NOT_SUPPORTED, FUNCTION_NOT_FOUND or INVALID_ARGUMENT is absent
        (`field_absent`) and not asked again.
        """
        return dict(zip(field_ids, self._field_list(g, tuple((f, 0) for f in field_ids), False), strict=True))

    def scoped_fields(self, g: NvmlGpu, wanted: Sequence[tuple[int, int]]) -> dict[tuple[int, int], Any]:
        """Field values by (id, scope) in one call; None where the entry's nvmlReturn is not SUCCESS.

        An absent entry is remembered as ``field:{id}:{scope}`` (``field:{id}`` by `fields`, for
        scope 0); nvmlDeviceGetFieldValues itself absent (very old drivers) makes every field absent.
        """
        wanted = tuple(wanted)
        return dict(zip(wanted, self._field_list(g, wanted, True), strict=True))

    def _field_list(self, g: NvmlGpu, wanted: tuple[tuple[int, int], ...], scoped_keys: bool) -> list[Any]:
        """The values of wanted, in its order (None where absent or failing), from one call."""
        out: list[Any] = [None] * len(wanted)
        ask, keys, positions = self._field_plan(g, wanted, scoped_keys)
        if not ask:
            return out
        if self.direct.usable:
            entries = self.optional(g, "field_values", self._direct_fields, ask)
        else:
            entries = self.optional(g, "field_values", self._wrapped_fields, list(ask))
        if entries is None:
            if "field_values" in g.absent:
                g.absent.update(keys)
            return out
        returns, values = entries  # in the order asked; a value is None unless its entry succeeded
        if len(ask) == len(wanted) and not any(returns):
            return values
        # The call succeeds as a whole; each entry carries its own return code (nvml-api.md §2.3).
        for position, key, ret, value in zip(positions, keys, returns, values, strict=True):
            if ret == 0:
                out[position] = value  # a value type newer than this code: None, unknown
            elif ret == GPU_IS_LOST:
                raise Lost
            elif ret in FIELD_ABSENT:
                g.absent.add(key)
        return out

    @staticmethod
    def _field_plan(
        g: NvmlGpu, wanted: tuple[tuple[int, int], ...], scoped_keys: bool
    ) -> tuple[tuple[tuple[int, int], ...], tuple[str, ...], tuple[int, ...]]:
        """(the entries of wanted still asked, their absence keys, their places in wanted).

        Built again only when g.absent grew: it only grows, so its size says whether a plan is still
        good, and the hot path builds no key.
        """
        plan = g.field_plans.get((wanted, scoped_keys))
        if plan is not None and plan[0] == len(g.absent):
            return plan[1:]
        keys = [f"field:{f}:{scope}" if scoped_keys else f"field:{f}" for f, scope in wanted]
        kept = [(i, key) for i, key in enumerate(keys) if key not in g.absent]
        positions = tuple(i for i, _ in kept)
        plan = (len(g.absent), tuple(wanted[i] for i in positions), tuple(key for _, key in kept), positions)
        g.field_plans[(wanted, scoped_keys)] = plan
        return plan[1:]

    def _direct_fields(self, handle: Any, ask: tuple[tuple[int, int], ...]) -> tuple[list[int], list[Any]]:
        return self.direct.field_values(handle, ask)

    def _wrapped_fields(self, handle: Any, ask: list[tuple[int, int]]) -> tuple[list[int], list[Any]]:
        values = self.n.nvmlDeviceGetFieldValues(handle, ask)
        returns = [fv.nvmlReturn for fv in values]
        member = [FIELD_UNION.get(fv.valueType) if ret == 0 else None for fv, ret in zip(values, returns, strict=True)]
        return returns, [None if m is None else getattr(fv.value, m) for fv, m in zip(values, member, strict=True)]

    def library_error(self, e: Any, during: str) -> backend_api.BackendError:
        """The BackendError for an NVML error no GPU-level answer explains."""
        if e.value == LIB_RM_VERSION_MISMATCH:
            return backend_api.BackendError(
                f"NVML/driver version mismatch during {during}: the driver was upgraded under the agent; "
                "reload the driver (or reboot) and restart the agent"
            )
        return backend_api.BackendError(f"NVML error during {during}: {e} (code {e.value})")

    # ----- loss -------------------------------------------------------------------------------------

    def mark_lost(self, g: NvmlGpu, now_unix_ns: int | None, during: str) -> None:
        """Mark the GPU lost (once) and queue its GPU_LOST observation."""
        with self._lock:
            if g.lost:
                return
            g.lost = True
        self.pending.append(
            model.Observation(
                kind=model.EventKind.GPU_LOST,
                observed_unix_ns=now_unix_ns or 0,
                message=f"NVML reports GPU_IS_LOST for {g.uuid} during {during}",
                source=SOURCE,
                gpu_uuid=g.uuid,
                severity=model.Severity.FATAL,
                attributes={"pci_bus_id": g.info.pci_bus_id} if g.info is not None else {},
            )
        )

    def drain_pending(self, now_unix_ns: int) -> list[model.Observation]:
        """The queued observations, stamped now where they were found without a clock."""
        out = []
        while self.pending:
            obs = self.pending.popleft()
            # Losses found where no clock was at hand (open, set) carry 0 until handed out.
            out.append(obs if obs.observed_unix_ns else dataclasses.replace(obs, observed_unix_ns=now_unix_ns))
        return out

    # ----- lifecycle --------------------------------------------------------------------------------

    def check_open(self) -> None:
        """Raise BackendError once the backend is closed."""
        if self.closed.is_set():
            raise backend_api.BackendError("NVML backend is closed")

    def shutdown_quietly(self) -> None:
        """Shut NVML down, ignoring a library that is already down."""
        # Already shut down, or the driver went away: nothing to undo.
        with contextlib.suppress(self.n.NVMLError):
            self.n.nvmlShutdown()
