"""The NVML GPU backend: reads and caps this node's GPUs through NVIDIA's pynvml (nvidia-ml-py).

This is the only rasd module that imports `pynvml`, and it does so inside `open_nvml_backend()`, so
importing `rasd.agent.gpu` never needs libnvidia-ml. `NvmlBackend` is the `GpuBackend` over NVML; it
opens the library and hands the imported module to its parts, one module per concern:

* `nvml_device`: NVML's codes, the per-GPU state and the call discipline every part follows (NVML
  units and error codes to `rasd.agent.core.model` types and the `rasd.agent.gpu` errors; per-GPU
  capability memory; lost GPUs marked by UUID and reported once);
* `nvml_inventory`: which GPUs the node has and what they can do, read at open;
* `nvml_sampling`: power (the driver's sample buffer where it keeps one) and counters in batched
  field-value calls, the agent's hot path;
* `nvml_control`: power limits read back, and power-smoothing profiles;
* `nvml_events`: the NVML event set that turns XID, ECC and row-remap events into observations.

Reference: shared/reference/nvml-api.md (pynvml 13.615.71). The NVML quirks the parts work around
are named where they matter. Threading: reads and `poll_events` may run on different threads (the C
library is thread-safe and pynvml releases the GIL in the blocking wait), but `close()` must not race
a `poll_events` call that is waiting on the event set.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from rasd.agent import gpu as backend_api
from rasd.agent.core import model
from rasd.agent.gpu import nvml_control, nvml_device, nvml_events, nvml_inventory, nvml_sampling


class NvmlBackend:
    """`GpuBackend` over the NVML library of this node.

    Args:
        nvml: The imported `pynvml` module (the real one; tests install a fake C library under it).
        watch_events: Register an NVML event set for XID/ECC events; False leaves `poll_events`
            reporting only lost GPUs.
        max_events_per_poll: Upper bound on events drained by one `poll_events` call, so an event
            storm cannot starve the power loop.
        nvlink_interval_s: How often per-link NVLink state and error counters are read.
        power_buffer_max_spacing_ms: Read power from the driver's own sample buffer
            (`power_sample_buffer`) when every GPU's holds samples at least every this many ms
            (the agent's power sample interval); 0 never does, and the agent polls `read_power`.

    Raises:
        BackendError: NVML could not be initialised (no library, driver not loaded, version mismatch).
    """

    name = "nvml"
    power_sample_buffer = False
    """Set at open: the driver's power-sample buffer is read (`read_power_samples`)."""
    power_buffer_note = "not probed"
    """Why the buffer is or is not used, for the agent's start-up log."""
    event_wait_blocks = True
    """`poll_events` waits in nvmlEventSetWait (the GIL released) up to its timeout: the agent gives
    it a thread of its own rather than polling."""

    def __init__(
        self,
        nvml: ModuleType,
        *,
        watch_events: bool = True,
        max_events_per_poll: int = 256,
        nvlink_interval_s: float = 10.0,
        power_buffer_max_spacing_ms: float = 0.0,
    ):
        """Initialise NVML, read the inventory, probe the power buffer and (with watch_events) the event set."""
        self._devices = nvml_device.NvmlDevices(nvml)
        self._sampler = nvml_sampling.NvmlSampler(self._devices, nvlink_interval_s=nvlink_interval_s)
        self._control = nvml_control.NvmlControl(self._devices)
        self._events = nvml_events.NvmlEvents(self._devices, max_events_per_poll=max_events_per_poll)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise backend_api.BackendError(f"NVML unavailable: {e} (code {e.value})") from e
        try:
            self._devices.set_gpus(nvml_inventory.enumerate_gpus(self._devices))
            self._inventory = tuple(g.info for g in self._devices.gpus if g.info is not None)
            if power_buffer_max_spacing_ms > 0:
                probe = self._sampler.probe_power_buffer(power_buffer_max_spacing_ms)
                self.power_sample_buffer, self.power_buffer_note = probe.usable, probe.why
            if watch_events:
                self._events.open()
        except BaseException:
            self._devices.shutdown_quietly()
            raise

    def inventory(self) -> Sequence[model.GpuInfo]:
        """The GPUs found at open time, ordered by PCI bus id (stable across reboots, unlike NVML indexes)."""
        return self._inventory

    def read_power(self, now_unix_ns: int) -> Sequence[model.PowerReading]:
        """Instant power of every answering GPU; lost or power-blind GPUs are skipped, never zero."""
        self._devices.check_open()
        return self._sampler.read_power(now_unix_ns)

    def read_power_samples(self, now_unix_ns: int) -> Sequence[model.PowerSamples]:
        """Every answering GPU's power samples since the last read, from the driver's buffer (none without one)."""
        self._devices.check_open()
        if not self.power_sample_buffer:
            return ()
        return self._sampler.read_power_samples(now_unix_ns)

    def read_counters(self, now_unix_ns: int) -> Sequence[model.GpuCounters]:
        """Counters of every answering GPU; a field the GPU does not support is None, never 0."""
        self._devices.check_open()
        return self._sampler.read_counters(now_unix_ns)

    def poll_events(self, now_unix_ns: int, timeout_s: float) -> Sequence[model.Observation]:
        """Lost GPUs seen since the last poll, then NVML events, waiting up to `timeout_s` for the first.

        Observations carry `now_unix_ns` as their time: NVML events have no timestamp of their own.

        Raises:
            BackendError: The library stopped working (driver unloaded or upgraded under the agent).
        """
        self._devices.check_open()
        return self._events.poll(now_unix_ns, timeout_s)

    def set_power_limit(self, gpu_uuid: str, power_limit_w: int) -> int:
        """Set the GPU's power limit (W), then read back and return the enforced limit (W).

        Raises:
            GpuNotFound, InvalidValue, NoPermission, NotSupported, GpuLost, BackendError: see
                `NvmlControl.set_power_limit`.
        """
        self._devices.check_open()
        return self._control.set_power_limit(gpu_uuid, power_limit_w)

    def set_power_smoothing(
        self, gpu_uuid: str, *, enabled: bool, floor_pct: float, ramp_up_w_per_s: float, ramp_down_w_per_s: float
    ) -> None:
        """Write floor and ramp rates into rasd's preset profile, activate it, and switch smoothing on/off.

        Raises:
            GpuNotFound, GpuLost, NotSupported, NoPermission, InvalidValue: as for set_power_limit.
        """
        self._devices.check_open()
        self._control.set_power_smoothing(
            gpu_uuid,
            enabled=enabled,
            floor_pct=floor_pct,
            ramp_up_w_per_s=ramp_up_w_per_s,
            ramp_down_w_per_s=ramp_down_w_per_s,
        )

    def close(self) -> None:
        """Free the event set and shut NVML down; later calls raise BackendError. Idempotent."""
        if self._devices.closed.is_set():
            return
        self._devices.closed.set()
        self._events.close()
        self._devices.shutdown_quietly()


def open_nvml_backend(
    *,
    watch_events: bool = True,
    max_events_per_poll: int = 256,
    nvlink_interval_s: float = 10.0,
    power_buffer_max_spacing_ms: float = 0.0,
) -> NvmlBackend:
    """Import pynvml and open the NVML backend.

    Args:
        watch_events: Register an NVML event set for XID/ECC events.
        max_events_per_poll: Upper bound on events drained by one `poll_events` call.
        nvlink_interval_s: How often per-link NVLink state and error counters are read.
        power_buffer_max_spacing_ms: As for `NvmlBackend` (0: never read the driver's power buffer).

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
        pynvml,
        watch_events=watch_events,
        max_events_per_poll=max_events_per_poll,
        nvlink_interval_s=nvlink_interval_s,
        power_buffer_max_spacing_ms=power_buffer_max_spacing_ms,
    )
