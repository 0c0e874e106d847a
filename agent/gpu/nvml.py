"""The NVML GPU backend: reads and caps this node's GPUs through NVIDIA's pynvml (nvidia-ml-py).

This is the only rasd module that imports `pynvml`, and it does so inside `open_nvml_backend()` (and
`NvmlBackend.__init__`), so importing `rasd.agent.gpu` never needs libnvidia-ml. It owns:

* the mapping from NVML calls, units and error codes to `rasd.agent.core.model` types and the
  `rasd.agent.gpu` errors (mW -> W, `NVMLError.value` -> `NotSupported`/`GpuLost`/...);
* per-GPU capability memory: a call that answers NOT_SUPPORTED or FUNCTION_NOT_FOUND (an older
  driver) is reported as `None` and not asked again, so a missing feature costs one call, not one a
  second;
* lost GPUs: a GPU_IS_LOST answer from any call marks the GPU lost (by UUID), queues one GPU_LOST
  observation for `poll_events`, and the GPU is skipped by every later read;
* the NVML event set that turns XID, ECC and row-remap events into observations.

Reference: shared/reference/nvml-api.md (pynvml 13.615.71). The NVML quirks this code works around
are named where they matter. Threading: reads and `poll_events` may run on different threads (the C
library is thread-safe and pynvml releases the GIL in the blocking wait), but `close()` must not race
a `poll_events` call that is waiting on the event set.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from rasd.agent import gpu as backend_api
from rasd.agent.core import model

_SOURCE = "nvml"

# NVML return codes (nvml.h). Kept here so the module needs pynvml only at open time; errors are always
# compared by `NVMLError.value` (pynvml's NVMLError is unhashable and `err == 3` raises).
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_INVALID_ARGUMENT = 2
_UNINITIALIZED = 1
_DRIVER_NOT_LOADED = 9
_TIMEOUT = 10
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_LIB_RM_VERSION_MISMATCH = 18

# Codes that mean "this feature is absent here", for good: stop asking.
_ABSENT = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})
# Codes that mean the library as a whole stopped working; no per-GPU answer is meaningful.
_LIBRARY_FATAL = frozenset({_UNINITIALIZED, _DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND, _LIB_RM_VERSION_MISMATCH})

_FIELD_UNION = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

# NVML field ids (nvml.h), used through nvmlDeviceGetFieldValues.
_FI_POWER_INSTANT = 186
_FI_RECOVERY_ACTION = 230
_FI_PWR_SMOOTHING_ENABLED = 251
_SMOOTHING_PROFILE = 0  # the preset profile rasd writes and activates

_MISSING_MIG_ID = 0xFFFFFFFF

# How long set_power_limit waits for the limiter to take a new limit, and how often it looks. An H200
# took 10-12 ms; a limit still not taken after 250 ms is reported as it stands (unconfirmed).
_ENFORCE_SETTLE_S = 0.25
_ENFORCE_POLL_S = 0.002


def _w_up(mw: int) -> int:
    """Convert mW to W rounding up: a limit reported high keeps the power budget on the safe side."""
    return -(-mw // 1000)


def _w_down(mw: int) -> int:
    """Convert mW to W rounding down: for a maximum that must never be exceeded."""
    return mw // 1000


@dataclasses.dataclass
class _Gpu:
    """Adapter state of one GPU, keyed by UUID (NVML handles are unhashable and compare by identity)."""

    uuid: str
    handle: Any
    info: model.GpuInfo | None = None  # set once identity and limits are read
    links: tuple[int, ...] = ()
    absent: set[str] = dataclasses.field(default_factory=set)
    lost: bool = False
    nvlinks: tuple[model.NvLinkCounters, ...] = ()  # last per-link reading
    nvlinks_unix_ns: int | None = None  # when it was taken


class _Lost(Exception):
    """Internal: an NVML call on this GPU answered GPU_IS_LOST."""


def _event_kinds(n: ModuleType) -> dict[int, tuple[model.EventKind, model.Severity, str]]:
    """Map the NVML event type bits rasd registers to (kind, severity, wording).

    Plain single-bit ECC events are left out on purpose: one event per corrected error is noise; the
    SBE rate comes from the counters and from the SBE-storm event.
    """
    return {
        n.nvmlEventTypeXidCriticalError: (model.EventKind.XID, model.Severity.UNSPECIFIED, "Xid"),
        n.nvmlEventTypeDoubleBitEccError: (model.EventKind.ECC_DBE, model.Severity.ERROR, "double-bit ECC"),
        n.nvmlEventTypeSingleBitEccErrorStorm: (
            model.EventKind.ECC_SBE_RATE,
            model.Severity.WARNING,
            "single-bit ECC storm",
        ),
        n.nvmlEventTypeDramRetirementEvent: (
            model.EventKind.ROW_REMAP_PENDING,
            model.Severity.WARNING,
            "DRAM row retirement/remap",
        ),
        n.nvmlEventTypeDramRetirementFailure: (
            model.EventKind.ROW_REMAP_FAILURE,
            model.Severity.ERROR,
            "DRAM row retirement/remap failure",
        ),
        n.nvmlEventTypeGpuRecoveryAction: (
            model.EventKind.RECOVERY_ACTION,
            model.Severity.WARNING,
            "GPU recovery action",
        ),
    }


class NvmlBackend:
    """`GpuBackend` over the NVML library of this node.

    Args:
        nvml: The imported `pynvml` module (the real one; tests install a fake C library under it).
        watch_events: Register an NVML event set for XID/ECC events; False leaves `poll_events`
            reporting only lost GPUs.
        max_events_per_poll: Upper bound on events drained by one `poll_events` call, so an event
            storm cannot starve the power loop.

    Raises:
        BackendError: NVML could not be initialised (no library, driver not loaded, version mismatch).
    """

    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType,
        *,
        watch_events: bool = True,
        max_events_per_poll: int = 256,
        nvlink_interval_s: float = 10.0,
    ):
        self._n = nvml
        self._max_events = max_events_per_poll
        # Per-link state and error counters are ~4 NVML calls per link (72 per H100) and move slowly;
        # reading them every nvlink_interval_s keeps the agent under 1% of a core (bench/RESULTS.md).
        self._nvlink_interval_ns = int(nvlink_interval_s * 1e9)
        self._lock = threading.Lock()
        self._pending: collections.deque[model.Observation] = collections.deque()
        self._closed = threading.Event()
        self._event_set: Any = None
        self._event_set_uuids: frozenset[str] = frozenset()  # GPUs registered in the current set
        self._unattributed_loss_reported = False
        self._kinds = _event_kinds(nvml)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise backend_api.BackendError(f"NVML unavailable: {e} (code {e.value})") from e
        try:
            self._gpus = self._enumerate()
            self._by_uuid = {g.uuid: g for g in self._gpus}
            self._inventory = tuple(g.info for g in self._gpus if g.info is not None)
            if watch_events:
                self._event_set = self._build_event_set()
        except BaseException:
            self._shutdown_quietly()
            raise

    # ----- GpuBackend -------------------------------------------------------------------------------

    def inventory(self) -> Sequence[model.GpuInfo]:
        """The GPUs found at open time, ordered by PCI bus id (stable across reboots, unlike NVML indexes)."""
        return self._inventory

    def read_power(self, now_unix_ns: int) -> Sequence[model.PowerReading]:
        """Instant power of every answering GPU; lost or power-blind GPUs are skipped, never zero."""
        self._check_open()
        readings = []
        for g in self._gpus:
            if g.lost:
                continue
            try:
                power_mw = self._power_mw(g)
            except _Lost:
                self._mark_lost(g, now_unix_ns, "power read")
                continue
            if power_mw is not None:
                readings.append(model.PowerReading(g.uuid, now_unix_ns, power_mw / 1000.0))
        return readings

    def read_counters(self, now_unix_ns: int) -> Sequence[model.GpuCounters]:
        """Counters of every answering GPU; a field the GPU does not support is None, never 0."""
        self._check_open()
        out = []
        for g in self._gpus:
            if g.lost:
                continue
            try:
                out.append(self._counters(g, now_unix_ns))
            except _Lost:
                self._mark_lost(g, now_unix_ns, "counter read")
        return out

    def poll_events(self, now_unix_ns: int, timeout_s: float) -> Sequence[model.Observation]:
        """Lost GPUs seen since the last poll, then NVML events, waiting up to `timeout_s` for the first.

        Observations carry `now_unix_ns` as their time: NVML events have no timestamp of their own.

        Raises:
            BackendError: The library stopped working (driver unloaded or upgraded under the agent).
        """
        self._check_open()
        out = self._drain_pending(now_unix_ns)
        if self._holds_lost_gpu():
            # A set holding a lost GPU answers every wait with GPU_IS_LOST: replace it first.
            self._rebuild_event_set()
        if self._event_set is None:
            if not out and timeout_s > 0:
                self._closed.wait(timeout_s)  # keeps the caller's loop paced; close() cuts it short
            return out
        n = self._n
        # Already have something to report: look for more events, but do not block.
        timeout_ms = 0 if out else min(math.ceil(max(timeout_s, 0.0) * 1000), 0xFFFFFFFF)
        for _ in range(self._max_events):
            try:
                data = n.nvmlEventSetWait(self._event_set, timeout_ms)
            except n.NVMLError as e:
                if e.value == _TIMEOUT:  # also what an interrupted wait returns
                    break
                if e.value == _GPU_IS_LOST:
                    found = self._on_wait_lost(now_unix_ns)
                    out.extend(self._drain_pending(now_unix_ns))
                    if not found and timeout_s > 0:
                        self._closed.wait(timeout_s)  # nothing to rebuild around: do not spin
                    break
                raise self._library_error(e, "nvmlEventSetWait") from e
            out.append(self._event_observation(data, now_unix_ns))
            timeout_ms = 0  # drain whatever else is queued without waiting again
        return out

    def set_power_limit(self, gpu_uuid: str, power_limit_w: int) -> int:
        """Set the GPU's power limit (W), then read back and return the enforced limit (W).

        The enforced limit can be lower than the request when an out-of-band limit (BMC) is lower.

        Raises:
            GpuNotFound: The UUID is not one of this node's GPUs.
            InvalidValue: The limit is outside the GPU's constraints.
            NoPermission: The agent is not root.
            NotSupported: The GPU cannot be capped.
            GpuLost: The GPU fell off the bus.
            BackendError: The set call returned success but the limit did not change.
        """
        self._check_open()
        g = self._by_uuid.get(gpu_uuid)
        if g is None:
            raise backend_api.GpuNotFound(gpu_uuid)
        if g.lost:
            raise backend_api.GpuLost(gpu_uuid)
        n = self._n
        limit_mw = int(power_limit_w) * 1000
        try:
            lo_mw, hi_mw = n.nvmlDeviceGetPowerManagementLimitConstraints(g.handle)
            if not lo_mw <= limit_mw <= hi_mw:
                raise backend_api.InvalidValue(
                    f"{gpu_uuid}: {power_limit_w} W outside [{lo_mw / 1000:g}, {hi_mw / 1000:g}] W"
                )
            before_mw = n.nvmlDeviceGetEnforcedPowerLimit(g.handle)
            self._set_limit_mw(g, limit_mw)
            requested_mw = n.nvmlDeviceGetPowerManagementLimit(g.handle)
            enforced_mw = self._settled_enforced_mw(g, requested_mw, before_mw)
        except n.NVMLError as e:
            if e.value == _GPU_IS_LOST:
                self._mark_lost(g, None, "set power limit")
                raise backend_api.GpuLost(gpu_uuid) from e
            raise self._set_error(e, gpu_uuid, power_limit_w) from e
        # Read back: a set that "succeeded" without effect (the _v2 path, or a driver that ignores it)
        # must not be reported as applied; the power budget relies on this (DESIGN §2.1).
        if abs(requested_mw - limit_mw) >= 1000:
            raise backend_api.BackendError(
                f"{gpu_uuid}: set {limit_mw} mW but the driver reports {requested_mw} mW requested"
            )
        return _w_up(enforced_mw)

    def set_power_smoothing(
        self, gpu_uuid: str, *, enabled: bool, floor_pct: float, ramp_up_w_per_s: float, ramp_down_w_per_s: float
    ) -> None:
        """Write floor and ramp rates into rasd's preset profile, activate it, and switch smoothing on/off.

        rasd owns preset profile 0. Ramp rates go to NVML in W/s (its read-back fields report mW/s).
        Blackwell and newer only; setters need root.

        Raises:
            GpuNotFound, GpuLost, NotSupported, NoPermission, InvalidValue: as for set_power_limit.
        """
        self._check_open()
        g = self._by_uuid.get(gpu_uuid)
        if g is None:
            raise backend_api.GpuNotFound(gpu_uuid)
        if g.lost:
            raise backend_api.GpuLost(gpu_uuid)
        if g.info is not None and not g.info.power_smoothing_supported:
            raise backend_api.NotSupported(f"{gpu_uuid}: no power-smoothing hardware")
        n = self._n
        try:
            profile = n.c_nvmlPowerSmoothingProfile_v1_t()
            profile.profileId = _SMOOTHING_PROFILE
            for param, value in (
                (n.NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR, float(floor_pct)),
                # The set call takes W/s (NVML's nvmlDevicePowerSmoothingUpdatePresetProfileParam); only the
                # read-back fields (NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_*_RATE) are in mW/s.
                (n.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_UP_RATE, float(ramp_up_w_per_s)),
                (n.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_DOWN_RATE, float(ramp_down_w_per_s)),
            ):
                profile.paramId = param
                profile.value = value
                # These wrappers pass the struct through as given: the caller must byref() it.
                n.nvmlDevicePowerSmoothingUpdatePresetProfileParam(g.handle, n.byref(profile))
            n.nvmlDevicePowerSmoothingActivatePresetProfile(g.handle, n.byref(profile))
            state = n.c_nvmlPowerSmoothingState_v1_t()
            state.state = n.NVML_FEATURE_ENABLED if enabled else n.NVML_FEATURE_DISABLED
            n.nvmlDevicePowerSmoothingSetState(g.handle, n.byref(state))
        except n.NVMLError as e:
            if e.value == _GPU_IS_LOST:
                self._mark_lost(g, None, "set power smoothing")
                raise backend_api.GpuLost(gpu_uuid) from e
            what = f"{gpu_uuid}: set power smoothing: {e}"
            if e.value == _NO_PERMISSION:
                raise backend_api.NoPermission(what) from e
            if e.value == _INVALID_ARGUMENT:
                raise backend_api.InvalidValue(what) from e
            if e.value in _ABSENT:
                raise backend_api.NotSupported(what) from e
            raise self._library_error(e, "set power smoothing") from e

    def close(self) -> None:
        """Free the event set and shut NVML down; later calls raise BackendError. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._free_event_set()
        self._shutdown_quietly()

    # ----- open -------------------------------------------------------------------------------------

    def _enumerate(self) -> list[_Gpu]:
        n = self._n
        gpus = []
        for index in range(n.nvmlDeviceGetCount()):
            try:
                handle = n.nvmlDeviceGetHandleByIndex(index)
                gpus.append(self._describe(handle))
            except (n.NVMLError, _Lost) as e:
                if isinstance(e, _Lost) or e.value == _GPU_IS_LOST:
                    # Lost before we learnt its UUID: report it by NVML index and PCI order instead.
                    self._pending.append(
                        model.Observation(
                            kind=model.EventKind.GPU_LOST,
                            observed_unix_ns=0,  # stamped when poll_events hands it out
                            message=f"NVML GPU index {index} is lost at agent start; its UUID is unknown",
                            source=_SOURCE,
                            severity=model.Severity.FATAL,
                            attributes={"nvml_index": str(index)},
                        )
                    )
                    continue
                if e.value == _NO_PERMISSION:
                    continue  # counted by NVML but not ours (cgroup/container): not this agent's GPU
                raise self._library_error(e, "enumeration") from e
        gpus.sort(key=lambda g: g.info.pci_bus_id)
        return gpus

    def _describe(self, handle: Any) -> _Gpu:
        n = self._n
        uuid = n.nvmlDeviceGetUUID(handle)
        g = _Gpu(uuid=uuid, handle=handle)
        limits = self._optional(g, "constraints", n.nvmlDeviceGetPowerManagementLimitConstraints)
        lo_mw, hi_mw = limits if limits is not None else (0, 0)
        default_mw = self._optional(g, "default_limit", n.nvmlDeviceGetPowerManagementDefaultLimit) or 0
        memory = self._optional(g, "memory", n.nvmlDeviceGetMemoryInfo)
        smoothing = self._fields(g, [_FI_PWR_SMOOTHING_ENABLED])[_FI_PWR_SMOOTHING_ENABLED]
        g.info = model.GpuInfo(
            uuid=uuid,
            model=n.nvmlDeviceGetName(handle),
            pci_bus_id=n.nvmlDeviceGetPciInfo(handle).busId,
            # A GPU that cannot be capped reports 0 W limits: GpuInfo has no "unknown" for them.
            power_limit_min_w=_w_up(lo_mw),
            power_limit_max_w=_w_down(hi_mw),
            power_limit_default_w=_w_up(default_mw),
            serial=self._optional(g, "serial", n.nvmlDeviceGetSerial) or "",
            vbios_version=self._optional(g, "vbios", n.nvmlDeviceGetVbiosVersion) or "",
            memory_total_mib=memory.total // (1024 * 1024) if memory is not None else 0,
            power_smoothing_supported=smoothing is not None,
        )
        g.links = self._nvlinks(g)
        return g

    def _nvlinks(self, g: _Gpu) -> tuple[int, ...]:
        """Link indexes the GPU has: INVALID_ARGUMENT marks an index past its last link."""
        n = self._n
        links = []
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                n.nvmlDeviceGetNvLinkState(g.handle, link)
            except n.NVMLError as e:
                if e.value in _ABSENT and link == 0:
                    break  # no NVLink on this GPU
                if e.value in (_INVALID_ARGUMENT, *_ABSENT):
                    continue
                if e.value == _GPU_IS_LOST:
                    raise
                raise self._library_error(e, "nvmlDeviceGetNvLinkState") from e
            links.append(link)
        return tuple(links)

    def _build_event_set(self) -> Any:
        """An event set with every live GPU registered for the wanted types it supports."""
        n = self._n
        wanted_mask = 0
        for bit in self._kinds:
            wanted_mask |= bit
        event_set = n.nvmlEventSetCreate()
        registered = set()
        for g in self._gpus:
            if g.lost:
                continue
            try:
                supported = self._optional(g, "event_types", n.nvmlDeviceGetSupportedEventTypes)
            except _Lost:
                self._mark_lost(g, None, "event registration")
                continue
            # Register only wanted & supported: one unsupported bit makes NVML register none of them.
            mask = wanted_mask & (supported or 0)
            if not mask:
                continue
            try:
                n.nvmlDeviceRegisterEvents(g.handle, mask, event_set)
                registered.add(g.uuid)
            except n.NVMLError as e:
                if e.value == _GPU_IS_LOST:
                    self._mark_lost(g, None, "event registration")
                elif e.value not in _ABSENT:
                    n.nvmlEventSetFree(event_set)
                    raise self._library_error(e, "nvmlDeviceRegisterEvents") from e
        self._event_set_uuids = frozenset(registered)
        return event_set

    # ----- reads ------------------------------------------------------------------------------------

    def _optional(self, g: _Gpu, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(handle, *args), or None when unsupported (remembered) or failing this once."""
        if key in g.absent:
            return None
        n = self._n
        try:
            return fn(g.handle, *args)
        except n.NVMLError as e:
            if e.value in _ABSENT:
                g.absent.add(key)
                return None
            if e.value == _GPU_IS_LOST:
                raise _Lost from e
            if e.value in _LIBRARY_FATAL:
                raise self._library_error(e, key) from e
            return None  # transient (UNKNOWN, NO_DATA, ...): unknown for this sample only

    def _fields(self, g: _Gpu, field_ids: list[int]) -> dict[int, Any]:
        """Field values by id (scope 0); None where the entry's own nvmlReturn is not SUCCESS."""
        out: dict[int, Any] = dict.fromkeys(field_ids)
        wanted = [f for f in field_ids if f"field:{f}" not in g.absent]
        if not wanted:
            return out
        values = self._optional(g, "field_values", self._n.nvmlDeviceGetFieldValues, wanted)
        if values is None:
            return out
        for fv in values:
            # The call succeeds as a whole; each entry carries its own return code (nvml-api.md §2.3).
            if fv.nvmlReturn == 0:
                member = _FIELD_UNION.get(fv.valueType)  # a value type newer than this code: unknown
                out[fv.fieldId] = getattr(fv.value, member) if member else None
            elif fv.nvmlReturn == _GPU_IS_LOST:
                raise _Lost
            elif fv.nvmlReturn in _ABSENT:
                g.absent.add(f"field:{fv.fieldId}")
        return out

    def _power_mw(self, g: _Gpu) -> int | None:
        # nvmlDeviceGetPowerUsage is a 1 s average on Ampere (except GA100) and newer; the instant
        # field is what a 10 Hz sampler needs. Fall back where the field is absent (older drivers).
        instant = self._fields(g, [_FI_POWER_INSTANT])[_FI_POWER_INSTANT]
        if instant is not None:
            return int(instant)
        return self._optional(g, "power_usage", self._n.nvmlDeviceGetPowerUsage)

    def _counters(self, g: _Gpu, now_unix_ns: int) -> model.GpuCounters:
        n, opt = self._n, self._optional
        enforced_mw = opt(g, "enforced_limit", n.nvmlDeviceGetEnforcedPowerLimit)
        requested_mw = opt(g, "requested_limit", n.nvmlDeviceGetPowerManagementLimit)
        # nvmlDeviceGetTemperature is deprecated in 13.0; its V replacement is missing in older drivers.
        temperature = opt(g, "temperature_v", n.nvmlDeviceGetTemperatureV, n.NVML_TEMPERATURE_GPU)
        if temperature is None and "temperature_v" in g.absent:
            temperature = opt(g, "temperature", n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU)
        utilization = opt(g, "utilization", n.nvmlDeviceGetUtilizationRates)
        reasons = opt(g, "clock_events", n.nvmlDeviceGetCurrentClocksEventReasons)
        if reasons is None and "clock_events" in g.absent:
            reasons = opt(g, "clock_throttle", n.nvmlDeviceGetCurrentClocksThrottleReasons)
        ecc = {
            (kind, counter): opt(g, f"ecc:{kind}:{counter}", n.nvmlDeviceGetTotalEccErrors, kind, counter)
            for kind in (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
            for counter in (n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC)
        }
        # Page retirement is the pre-Ampere mechanism (NOT_SUPPORTED on Ampere+, which remaps rows).
        sbe_pages = opt(
            g,
            "retired_sbe",
            n.nvmlDeviceGetRetiredPages,
            n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        dbe_pages = opt(
            g, "retired_dbe", n.nvmlDeviceGetRetiredPages, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        pages_pending = opt(g, "retired_pending", n.nvmlDeviceGetRetiredPagesPendingStatus)
        remap = opt(g, "remapped_rows", n.nvmlDeviceGetRemappedRows)  # (corr, unc, pending, failure)
        fields = self._fields(g, [_FI_RECOVERY_ACTION, _FI_PWR_SMOOTHING_ENABLED])
        smoothing = fields[_FI_PWR_SMOOTHING_ENABLED]
        vol, agg = n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC
        sbe, dbe = n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return model.GpuCounters(
            gpu_uuid=g.uuid,
            sample_unix_ns=now_unix_ns,
            enforced_power_limit_w=None if enforced_mw is None else _w_up(enforced_mw),
            requested_power_limit_w=None if requested_mw is None else _w_up(requested_mw),
            total_energy_mj=opt(g, "energy", n.nvmlDeviceGetTotalEnergyConsumption),
            temperature_c=temperature,
            utilization_gpu_pct=None if utilization is None else utilization.gpu,
            clock_event_reasons=reasons,
            ecc_sbe_volatile=ecc[(sbe, vol)],
            ecc_dbe_volatile=ecc[(dbe, vol)],
            ecc_sbe_aggregate=ecc[(sbe, agg)],
            ecc_dbe_aggregate=ecc[(dbe, agg)],
            retired_pages_sbe=None if sbe_pages is None else len(sbe_pages),
            retired_pages_dbe=None if dbe_pages is None else len(dbe_pages),
            retired_pages_pending=None if pages_pending is None else bool(pages_pending),
            remapped_rows_correctable=None if remap is None else remap[0],
            remapped_rows_uncorrectable=None if remap is None else remap[1],
            remapped_rows_pending=None if remap is None else bool(remap[2]),
            remapped_rows_failure=None if remap is None else bool(remap[3]),
            pcie_replay_count=opt(g, "pcie_replay", n.nvmlDeviceGetPcieReplayCounter),
            recovery_action=fields[_FI_RECOVERY_ACTION],
            nvlinks=self._nvlinks_due(g, now_unix_ns),
            power_smoothing_enabled=None if smoothing is None else bool(smoothing),
            nvlink_sample_unix_ns=g.nvlinks_unix_ns,
        )

    def _nvlinks_due(self, g: _Gpu, now_unix_ns: int) -> tuple[model.NvLinkCounters, ...]:
        """The links' counters, read again only when the last reading is nvlink_interval_s old."""
        if g.nvlinks_unix_ns is None or now_unix_ns - g.nvlinks_unix_ns >= self._nvlink_interval_ns:
            g.nvlinks = self._nvlink_counters(g)
            g.nvlinks_unix_ns = now_unix_ns
        return g.nvlinks

    def _nvlink_counters(self, g: _Gpu) -> tuple[model.NvLinkCounters, ...]:
        n, out = self._n, []
        for link in g.links:
            state = self._optional(g, f"nvlink_state:{link}", n.nvmlDeviceGetNvLinkState, link)
            if state is None:
                continue  # unknown this sample: reporting it inactive would raise a false NVLINK_DOWN

            def counter(kind: int, link: int = link) -> int | None:
                # NOT_SUPPORTED on Blackwell (NVLink5); those GPUs report None here.
                return self._optional(g, f"nvlink:{link}:{kind}", n.nvmlDeviceGetNvLinkErrorCounter, link, kind)

            out.append(
                model.NvLinkCounters(
                    link=link,
                    active=state == n.NVML_FEATURE_ENABLED,
                    # Flit CRC: the counter nvidia-smi and DCGM report as "CRC errors".
                    crc_errors=counter(n.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                    replay_errors=counter(n.NVML_NVLINK_ERROR_DL_REPLAY),
                    recovery_errors=counter(n.NVML_NVLINK_ERROR_DL_RECOVERY),
                )
            )
        return tuple(out)

    # ----- set --------------------------------------------------------------------------------------

    def _set_limit_mw(self, g: _Gpu, limit_mw: int) -> None:
        n = self._n
        try:
            # v1 checks its return code, so NO_PERMISSION etc. raise.
            n.nvmlDeviceSetPowerManagementLimit(g.handle, limit_mw)
            return
        except n.NVMLError as e:
            if e.value != _FUNCTION_NOT_FOUND:
                raise
        # Only a driver without the v1 symbol gets here. pynvml's nvmlDeviceSetPowerManagementLimit_v2
        # ignores the C return code and always returns 0 (nvml-api.md §9.1), so call the C symbol
        # through pynvml's own lookup and check the code ourselves.
        value = n.c_nvmlPowerValue_v2_t()
        value.version = n.nvmlPowerValue_v2
        value.powerScope = n.NVML_POWER_SCOPE_GPU
        value.powerValueMw = limit_mw
        ret = n._nvmlGetFunctionPointer("nvmlDeviceSetPowerManagementLimit_v2")(g.handle, n.byref(value))
        if ret != n.NVML_SUCCESS:
            raise n.NVMLError(ret)

    def _settled_enforced_mw(self, g: _Gpu, requested_mw: int, before_mw: int) -> int:
        """The enforced limit once the limiter has taken the new request, or as it stands after the settle time.

        The power limiter takes a new limit a little after the set call returns: on an H200 (driver
        580.159) the enforced limit still read the old value at once and followed 10-12 ms after the
        set (bench/RESULTS.md "NVML on a real GPU"). Returning that first read would report a cap that
        was in fact applied as unconfirmed (a decrease) or not yet raised. Polls until the enforced
        limit equals the request, or has moved to below it (an out-of-band limit holds it lower), for at
        most _ENFORCE_SETTLE_S; whatever it reads then is the truth the controller gets.
        """
        n = self._n
        deadline = time.monotonic() + _ENFORCE_SETTLE_S
        enforced_mw = n.nvmlDeviceGetEnforcedPowerLimit(g.handle)
        while enforced_mw != requested_mw and (enforced_mw > requested_mw or enforced_mw == before_mw):
            if time.monotonic() >= deadline:
                break
            time.sleep(_ENFORCE_POLL_S)
            enforced_mw = n.nvmlDeviceGetEnforcedPowerLimit(g.handle)
        return enforced_mw

    def _set_error(self, e: Any, gpu_uuid: str, power_limit_w: int) -> backend_api.BackendError:
        what = f"{gpu_uuid}: set power limit {power_limit_w} W: {e}"
        if e.value == _NO_PERMISSION:
            return backend_api.NoPermission(what)
        if e.value == _INVALID_ARGUMENT:
            return backend_api.InvalidValue(what)
        if e.value in _ABSENT:
            return backend_api.NotSupported(what)
        return self._library_error(e, "set power limit")

    # ----- events and loss --------------------------------------------------------------------------

    def _event_observation(self, data: Any, now_unix_ns: int) -> model.Observation:
        n = self._n
        try:
            # data.device is a fresh handle object each time: identify the GPU by UUID.
            uuid = n.nvmlDeviceGetUUID(data.device)
        except n.NVMLError:
            uuid = ""
        kind, severity, wording = self._kinds.get(
            data.eventType, (model.EventKind.UNSPECIFIED, model.Severity.UNSPECIFIED, "NVML event")
        )
        attributes = {"nvml_event_type": f"0x{data.eventType:x}"}
        if data.gpuInstanceId != _MISSING_MIG_ID:
            attributes["gpu_instance_id"] = str(data.gpuInstanceId)
        if data.computeInstanceId != _MISSING_MIG_ID:
            attributes["compute_instance_id"] = str(data.computeInstanceId)
        xid = None
        if kind == model.EventKind.XID:
            xid = int(data.eventData)  # 999 means an Xid the driver could not name
            message = f"Xid {xid} on {uuid or 'unknown GPU'}"
        else:
            message = f"{wording} event on {uuid or 'unknown GPU'}"
        if kind == model.EventKind.RECOVERY_ACTION:
            attributes["recovery_action"] = str(data.eventData)
        return model.Observation(
            kind=kind,
            observed_unix_ns=now_unix_ns,
            message=message,
            source=_SOURCE,
            gpu_uuid=uuid,
            xid=xid,
            severity=severity,
            attributes=attributes,
        )

    def _on_wait_lost(self, now_unix_ns: int) -> bool:
        """The event wait said GPU_IS_LOST without naming the GPU: find it, rebuild the set without it.

        Returns:
            True when the set held a lost GPU and was rebuilt without it.
        """
        n = self._n
        for g in self._gpus:
            if g.lost:
                continue
            try:
                n.nvmlDeviceGetPerformanceState(g.handle)  # any answer but GPU_IS_LOST means alive
            except n.NVMLError as e:
                if e.value == _GPU_IS_LOST:
                    self._mark_lost(g, now_unix_ns, "event wait")
        if not self._holds_lost_gpu():
            if not self._unattributed_loss_reported:
                self._unattributed_loss_reported = True
                self._pending.append(
                    model.Observation(
                        kind=model.EventKind.GPU_LOST,
                        observed_unix_ns=now_unix_ns,
                        message="NVML event wait reports a lost GPU, but every GPU still answers",
                        source=_SOURCE,
                        severity=model.Severity.ERROR,
                    )
                )
            return False
        self._rebuild_event_set()
        return True

    def _holds_lost_gpu(self) -> bool:
        return any(self._by_uuid[u].lost for u in self._event_set_uuids)

    def _rebuild_event_set(self) -> None:
        # Events still queued in the old set are dropped with it; the kernel-log source sees the
        # same Xids, and the lost GPU itself is reported as GPU_LOST.
        self._free_event_set()
        self._event_set = self._build_event_set()

    def _mark_lost(self, g: _Gpu, now_unix_ns: int | None, during: str) -> None:
        with self._lock:
            if g.lost:
                return
            g.lost = True
        self._pending.append(
            model.Observation(
                kind=model.EventKind.GPU_LOST,
                observed_unix_ns=now_unix_ns or 0,
                message=f"NVML reports GPU_IS_LOST for {g.uuid} during {during}",
                source=_SOURCE,
                gpu_uuid=g.uuid,
                severity=model.Severity.FATAL,
                attributes={"pci_bus_id": g.info.pci_bus_id} if g.info is not None else {},
            )
        )

    def _drain_pending(self, now_unix_ns: int) -> list[model.Observation]:
        out = []
        while self._pending:
            obs = self._pending.popleft()
            # Losses found where no clock was at hand (open, set) carry 0 until handed out.
            out.append(obs if obs.observed_unix_ns else dataclasses.replace(obs, observed_unix_ns=now_unix_ns))
        return out

    # ----- lifecycle --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise backend_api.BackendError("NVML backend is closed")

    def _library_error(self, e: Any, during: str) -> backend_api.BackendError:
        if e.value == _LIB_RM_VERSION_MISMATCH:
            return backend_api.BackendError(
                f"NVML/driver version mismatch during {during}: the driver was upgraded under the agent; "
                "reload the driver (or reboot) and restart the agent"
            )
        return backend_api.BackendError(f"NVML error during {during}: {e} (code {e.value})")

    def _free_event_set(self) -> None:
        if self._event_set is None:
            return
        event_set, self._event_set = self._event_set, None
        self._event_set_uuids = frozenset()
        # Freeing after a driver failure can fail too; there is nothing left to release then.
        with contextlib.suppress(self._n.NVMLError):
            self._n.nvmlEventSetFree(event_set)

    def _shutdown_quietly(self) -> None:
        # Already shut down, or the driver went away: nothing to undo.
        with contextlib.suppress(self._n.NVMLError):
            self._n.nvmlShutdown()


def open_nvml_backend(
    *, watch_events: bool = True, max_events_per_poll: int = 256, nvlink_interval_s: float = 10.0
) -> NvmlBackend:
    """Import pynvml and open the NVML backend.

    Args:
        watch_events: Register an NVML event set for XID/ECC events.
        max_events_per_poll: Upper bound on events drained by one `poll_events` call.
        nvlink_interval_s: How often per-link NVLink state and error counters are read.

    Returns:
        The open backend; call `close()` when done.

    Raises:
        BackendError: nvidia-ml-py is not installed, or NVML could not be initialised.
    """
    try:
        import pynvml  # noqa: TID251  (this module is the one place allowed to import it)
    except ImportError as e:
        raise backend_api.BackendError("the nvml backend needs nvidia-ml-py (pip install rasd[nvml])") from e
    return NvmlBackend(
        pynvml, watch_events=watch_events, max_events_per_poll=max_events_per_poll, nvlink_interval_s=nvlink_interval_s
    )
