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

import collections
import contextlib
import dataclasses
import threading
from collections.abc import Callable
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

_FIELD_UNION = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

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


class Lost(Exception):
    """Internal to the NVML backend: an NVML call on this GPU answered GPU_IS_LOST."""


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

    def fields(self, g: NvmlGpu, field_ids: list[int]) -> dict[int, Any]:
        """Field values by id (scope 0); None where the entry's own nvmlReturn is not SUCCESS."""
        out: dict[int, Any] = dict.fromkeys(field_ids)
        wanted = [f for f in field_ids if f"field:{f}" not in g.absent]
        if not wanted:
            return out
        values = self.optional(g, "field_values", self.n.nvmlDeviceGetFieldValues, wanted)
        if values is None:
            return out
        for fv in values:
            # The call succeeds as a whole; each entry carries its own return code (nvml-api.md §2.3).
            if fv.nvmlReturn == 0:
                member = _FIELD_UNION.get(fv.valueType)  # a value type newer than this code: unknown
                out[fv.fieldId] = getattr(fv.value, member) if member else None
            elif fv.nvmlReturn == GPU_IS_LOST:
                raise Lost
            elif fv.nvmlReturn in ABSENT:
                g.absent.add(f"field:{fv.fieldId}")
        return out

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
