"""GPU backends: where the agent's view of its GPUs comes from.

A backend is anything that satisfies `GpuBackend`. The agent picks one by name through
`open_backend()`; `nvml` is imported lazily so that machines without libnvidia-ml never load it.
Backends return `rasd.agent.core.model` types only and raise the errors below, never vendor errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rasd.agent.core import model


class BackendError(Exception):
    """A backend call failed for a reason the agent should log and survive."""


class GpuNotFound(BackendError):
    """The GPU UUID is not one of this node's GPUs."""


class NotSupported(BackendError):
    """The GPU or driver does not support the operation."""


class GpuLost(BackendError):
    """The GPU stopped answering (NVML GPU_IS_LOST, fallen off the bus)."""


class InvalidValue(BackendError):
    """A value is outside what the GPU accepts (e.g. a power limit outside its constraints)."""


class NoPermission(BackendError):
    """The agent lacks the privilege for the operation (setting limits needs root)."""


class GpuBackend(Protocol):
    """Source of GPU truth for one node."""

    name: str
    """Short backend name reported in Hello: "nvml", "simulated", "replay"."""

    power_sample_buffer: bool
    """True when the backend keeps the GPUs' power samples itself (NVML's driver buffer): the agent
    then reads them with `read_power_samples` every so often instead of `read_power` at its rate."""

    def inventory(self) -> Sequence[model.GpuInfo]:
        """The node's GPUs, in a stable order."""
        ...

    def read_power(self, now_unix_ns: int) -> Sequence[model.PowerReading]:
        """Instant power of every GPU that answers; a lost GPU is skipped, not zero."""
        ...

    def read_power_samples(self, now_unix_ns: int) -> Sequence[model.PowerSamples]:
        """The power samples each answering GPU took since the last call, in time order.

        None when `power_sample_buffer` is False; a lost GPU is skipped, not zero.
        """
        ...

    def read_counters(self, now_unix_ns: int) -> Sequence[model.GpuCounters]:
        """Counters of every GPU that answers."""
        ...

    def poll_events(self, now_unix_ns: int, timeout_s: float) -> Sequence[model.Observation]:
        """Health observations since the last poll (XID/ECC events, lost GPUs); may block up to timeout_s."""
        ...

    def set_power_limit(self, gpu_uuid: str, power_limit_w: int) -> int:
        """Set a GPU's power limit and return the enforced limit read back, in watts."""
        ...

    def set_power_smoothing(
        self, gpu_uuid: str, *, enabled: bool, floor_pct: float, ramp_up_w_per_s: float, ramp_down_w_per_s: float
    ) -> None:
        """Apply a power-smoothing profile (floor and ramp rates) and switch smoothing on or off.

        Raises:
            NotSupported: the GPU has no power-smoothing hardware (before Blackwell).
        """
        ...

    def close(self) -> None:
        """Release the backend's resources."""
        ...


BACKEND_NAMES = ("simulated", "nvml")
