"""The NVML backend's inventory: which GPUs this node has, who they are, and what they can do.

Read once, when the backend opens: every GPU's UUID, model, PCI bus id, serial, VBIOS, memory, power
limit constraints and default, whether it has power-smoothing hardware, and which NVLinks it has. A
GPU lost before its UUID is known is reported by NVML index; one NVML counts but that is not ours
(NO_PERMISSION in a container) is skipped. Inventory order is PCI bus id, stable across reboots,
unlike NVML indexes.
"""

from __future__ import annotations

from typing import Any

from rasd.agent.core import model
from rasd.agent.gpu import nvml_device as device


def enumerate_gpus(devices: device.NvmlDevices) -> list[device.NvmlGpu]:
    """Every GPU NVML counts that answers as ours, described, ordered by PCI bus id.

    Raises:
        BackendError: The library failed during enumeration.
    """
    n = devices.n
    gpus = []
    for index in range(n.nvmlDeviceGetCount()):
        try:
            handle = n.nvmlDeviceGetHandleByIndex(index)
            gpus.append(_describe(devices, handle, index))
        except (n.NVMLError, device.Lost) as e:
            if isinstance(e, device.Lost) or e.value == device.GPU_IS_LOST:
                # Lost before we learnt its UUID: report it by NVML index and PCI order instead.
                devices.pending.append(
                    model.Observation(
                        kind=model.EventKind.GPU_LOST,
                        observed_unix_ns=0,  # stamped when poll_events hands it out
                        message=f"NVML GPU index {index} is lost at agent start; its UUID is unknown",
                        source=device.SOURCE,
                        severity=model.Severity.FATAL,
                        attributes={"nvml_index": str(index)},
                    )
                )
                continue
            if e.value == device.NO_PERMISSION:
                continue  # counted by NVML but not ours (cgroup/container): not this agent's GPU
            raise devices.library_error(e, "enumeration") from e
    gpus.sort(key=lambda g: g.info.pci_bus_id)
    return gpus


def _describe(devices: device.NvmlDevices, handle: Any, index: int) -> device.NvmlGpu:
    n, optional = devices.n, devices.optional
    uuid = n.nvmlDeviceGetUUID(handle)
    g = device.NvmlGpu(uuid=uuid, handle=handle)
    limits = optional(g, "constraints", n.nvmlDeviceGetPowerManagementLimitConstraints)
    lo_mw, hi_mw = limits if limits is not None else (0, 0)
    default_mw = optional(g, "default_limit", n.nvmlDeviceGetPowerManagementDefaultLimit) or 0
    memory = optional(g, "memory", n.nvmlDeviceGetMemoryInfo)
    smoothing = devices.fields(g, [device.FI_PWR_SMOOTHING_ENABLED])[device.FI_PWR_SMOOTHING_ENABLED]
    g.info = model.GpuInfo(
        uuid=uuid,
        model=n.nvmlDeviceGetName(handle),
        pci_bus_id=n.nvmlDeviceGetPciInfo(handle).busId,
        # A GPU that cannot be capped reports 0 W limits: GpuInfo has no "unknown" for them.
        power_limit_min_w=device.w_up(lo_mw),
        power_limit_max_w=device.w_down(hi_mw),
        power_limit_default_w=device.w_up(default_mw),
        serial=optional(g, "serial", n.nvmlDeviceGetSerial) or "",
        vbios_version=optional(g, "vbios", n.nvmlDeviceGetVbiosVersion) or "",
        memory_total_mib=memory.total // (1024 * 1024) if memory is not None else 0,
        power_smoothing_supported=smoothing is not None,
        # The NVML index, as dcgm-exporter's `gpu` label has it (the exporter's join key; never a name).
        labels={"index": str(index)},
    )
    g.links = _nvlinks(devices, g)
    return g


def _nvlinks(devices: device.NvmlDevices, g: device.NvmlGpu) -> tuple[int, ...]:
    """Link indexes the GPU has: INVALID_ARGUMENT marks an index past its last link."""
    n = devices.n
    links = []
    for link in range(n.NVML_NVLINK_MAX_LINKS):
        try:
            n.nvmlDeviceGetNvLinkState(g.handle, link)
        except n.NVMLError as e:
            if e.value in device.ABSENT and link == 0:
                break  # no NVLink on this GPU
            if e.value in (device.INVALID_ARGUMENT, *device.ABSENT):
                continue
            if e.value == device.GPU_IS_LOST:
                raise
            raise devices.library_error(e, "nvmlDeviceGetNvLinkState") from e
        links.append(link)
    return tuple(links)
