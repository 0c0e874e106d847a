"""The NVML backend's events: the NVML event set that turns XID, ECC and row-remap events into observations.

Every live GPU is registered for the event types rasd wants and the GPU supports (one unsupported
bit makes NVML register none). `poll` hands out the lost-GPU observations queued by any part of the
backend first, then drains the event set, waiting up to the caller's timeout for the first event and
not at all for the rest, at most `max_events_per_poll` at a time so that a storm cannot starve the
power loop. A set holding a lost GPU answers every wait with GPU_IS_LOST, so it is rebuilt without
it. Threading: `poll` may wait in another thread than the reads (pynvml releases the GIL in the
blocking wait), but `close()` must not race a `poll` that is waiting on the set.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from rasd.agent.core import model
from rasd.agent.gpu import nvml_device as device

_MISSING_MIG_ID = 0xFFFFFFFF


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


class NvmlEvents:
    """The node's NVML event set, or none (then only lost GPUs are reported).

    Args:
        devices: The node's GPUs and the NVML call discipline.
        max_events_per_poll: Upper bound on events drained by one `poll` call.
    """

    def __init__(self, devices: device.NvmlDevices, *, max_events_per_poll: int) -> None:
        """Bind to the node's GPUs; no event set until `open()`."""
        self._devices = devices
        self._max_events = max_events_per_poll
        self._kinds = _event_kinds(devices.n)
        self._event_set: Any = None
        self._event_set_uuids: frozenset[str] = frozenset()  # GPUs registered in the current set
        self._unattributed_loss_reported = False

    def open(self) -> None:
        """Build the event set over the live GPUs."""
        self._event_set = self._build_event_set()

    def poll(self, now_unix_ns: int, timeout_s: float) -> Sequence[model.Observation]:
        """Lost GPUs seen since the last poll, then NVML events, waiting up to `timeout_s` for the first.

        Observations carry `now_unix_ns` as their time: NVML events have no timestamp of their own.

        Raises:
            BackendError: The library stopped working (driver unloaded or upgraded under the agent).
        """
        devices = self._devices
        out = devices.drain_pending(now_unix_ns)
        if self._holds_lost_gpu():
            # A set holding a lost GPU answers every wait with GPU_IS_LOST: replace it first.
            self._rebuild_event_set()
        if self._event_set is None:
            if not out and timeout_s > 0:
                devices.closed.wait(timeout_s)  # keeps the caller's loop paced; close() cuts it short
            return out
        n = devices.n
        # Already have something to report: look for more events, but do not block.
        timeout_ms = 0 if out else min(math.ceil(max(timeout_s, 0.0) * 1000), 0xFFFFFFFF)
        for _ in range(self._max_events):
            try:
                data = n.nvmlEventSetWait(self._event_set, timeout_ms)
            except n.NVMLError as e:
                if e.value == device.TIMEOUT:  # also what an interrupted wait returns
                    break
                if e.value == device.GPU_IS_LOST:
                    found = self._on_wait_lost(now_unix_ns)
                    out.extend(devices.drain_pending(now_unix_ns))
                    if not found and timeout_s > 0:
                        devices.closed.wait(timeout_s)  # nothing to rebuild around: do not spin
                    break
                raise devices.library_error(e, "nvmlEventSetWait") from e
            out.append(self._event_observation(data, now_unix_ns))
            timeout_ms = 0  # drain whatever else is queued without waiting again
        return out

    def close(self) -> None:
        """Free the event set (if any)."""
        if self._event_set is None:
            return
        event_set, self._event_set = self._event_set, None
        self._event_set_uuids = frozenset()
        # Freeing after a driver failure can fail too; there is nothing left to release then.
        with contextlib.suppress(self._devices.n.NVMLError):
            self._devices.n.nvmlEventSetFree(event_set)

    def _build_event_set(self) -> Any:
        """An event set with every live GPU registered for the wanted types it supports."""
        devices = self._devices
        n = devices.n
        wanted_mask = 0
        for bit in self._kinds:
            wanted_mask |= bit
        event_set = n.nvmlEventSetCreate()
        registered = set()
        for g in devices.gpus:
            if g.lost:
                continue
            try:
                supported = devices.optional(g, "event_types", n.nvmlDeviceGetSupportedEventTypes)
            except device.Lost:
                devices.mark_lost(g, None, "event registration")
                continue
            # Register only wanted & supported: one unsupported bit makes NVML register none of them.
            mask = wanted_mask & (supported or 0)
            if not mask:
                continue
            try:
                n.nvmlDeviceRegisterEvents(g.handle, mask, event_set)
                registered.add(g.uuid)
            except n.NVMLError as e:
                if e.value == device.GPU_IS_LOST:
                    devices.mark_lost(g, None, "event registration")
                elif e.value not in device.ABSENT:
                    n.nvmlEventSetFree(event_set)
                    raise devices.library_error(e, "nvmlDeviceRegisterEvents") from e
        self._event_set_uuids = frozenset(registered)
        return event_set

    def _event_observation(self, data: Any, now_unix_ns: int) -> model.Observation:
        n = self._devices.n
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
            source=device.SOURCE,
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
        devices = self._devices
        n = devices.n
        for g in devices.gpus:
            if g.lost:
                continue
            try:
                n.nvmlDeviceGetPerformanceState(g.handle)  # any answer but GPU_IS_LOST means alive
            except n.NVMLError as e:
                if e.value == device.GPU_IS_LOST:
                    devices.mark_lost(g, now_unix_ns, "event wait")
        if not self._holds_lost_gpu():
            if not self._unattributed_loss_reported:
                self._unattributed_loss_reported = True
                devices.pending.append(
                    model.Observation(
                        kind=model.EventKind.GPU_LOST,
                        observed_unix_ns=now_unix_ns,
                        message="NVML event wait reports a lost GPU, but every GPU still answers",
                        source=device.SOURCE,
                        severity=model.Severity.ERROR,
                    )
                )
            return False
        self._rebuild_event_set()
        return True

    def _holds_lost_gpu(self) -> bool:
        return any(self._devices.by_uuid[u].lost for u in self._event_set_uuids)

    def _rebuild_event_set(self) -> None:
        # Events still queued in the old set are dropped with it; the kernel-log source sees the
        # same Xids, and the lost GPU itself is reported as GPU_LOST.
        self.close()
        self._event_set = self._build_event_set()
