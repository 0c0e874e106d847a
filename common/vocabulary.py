"""rasd's shared vocabulary: how bad, what kind of health signal, how a command ended, which GPU.

One definition for the agent, the controller and rasctl, so that the three cannot drift apart. Each
enum has the names and values of its rasd.api.v1 enum without the prefix (``Severity.FATAL`` is
``SEVERITY_FATAL = 4``); ``tests/unit/common/test_vocabulary.py`` pins them to the proto both ways, so
a value added to the proto without its entry here fails a test. `GpuInfo` has the fields of the
rasd.api.v1 ``GpuInfo`` message.

Pure values: no I/O, and no import of a component or of the generated wire code (the decision cores,
which must not know the wire format, import this module).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

XID_MAX = 99_999
"""The largest Xid number rasd takes: NVIDIA's catalog ends in the hundreds, so a larger number is a
garbled line, not a fault. The agent's parser drops such a line and the controller's edge refuses
it, from this one bound, so that no line the agent parses makes the controller refuse its batch."""


class Severity(enum.IntEnum):
    """Severity of an observation or incident, lowest first (rasd.api.v1.Severity)."""

    UNSPECIFIED = 0
    INFO = 1
    WARNING = 2
    ERROR = 3
    FATAL = 4


class EventKind(enum.IntEnum):
    """Kind of health observation (rasd.api.v1.EventKind); the proto comments say what each one means."""

    UNSPECIFIED = 0
    XID = 1
    ECC_DBE = 2
    ECC_SBE_RATE = 3
    ROW_REMAP_PENDING = 4
    ROW_REMAP_FAILURE = 5
    RETIRED_PAGES = 6
    FALLEN_OFF_BUS = 7
    GPU_LOST = 8
    NVLINK_DOWN = 9
    NVLINK_ERRORS = 10
    PCIE_REPLAY = 11
    IB_LINK_STATE = 12
    SXID = 13
    RECOVERY_ACTION = 14
    POWER_EXCURSION = 15
    THERMAL = 16
    SDC_SUSPECT = 17
    STRAGGLER = 18
    NODE_LOST = 19


class ActionOutcome(enum.IntEnum):
    """How a command ended (rasd.api.v1.ActionOutcome)."""

    UNSPECIFIED = 0
    SUCCEEDED = 1
    FAILED = 2
    REFUSED = 3
    NOT_SUPPORTED = 4
    TIMED_OUT = 5
    DRY_RUN = 6


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One GPU's identity and power-limit constraints, as its node read them at start-up."""

    uuid: str
    """NVML's UUID, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx": GPUs are named by it, never by index."""
    model: str
    pci_bus_id: str
    """As NVML prints it, e.g. "00000000:17:00.0"."""
    power_limit_min_w: int
    power_limit_max_w: int
    power_limit_default_w: int
    serial: str = ""
    vbios_version: str = ""
    memory_total_mib: int = 0
    power_smoothing_supported: bool = False
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """GPU-level topology labels, e.g. nvlink_domain, numa_node."""
