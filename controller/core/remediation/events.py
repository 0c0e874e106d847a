"""The controller's own health-event value: one observation from a node, as the core sees it.

`HealthEvent` is what classification, correlation and escalation consume. It is independent of
the protobuf wire type (``rasd.controller.wire.agent`` converts ``rasd.api.v1.HealthEvent`` into it).
`EventKind` and `Severity` are rasd's shared vocabulary (``rasd.common.vocabulary``, pinned to the
wire enums by its tests).

Time is float Unix seconds everywhere in the controller core (``observed_at``, ``now``); the wire
carries nanoseconds and ``wire.py`` divides.

Besides the raw fields the agent sends, an event carries optional counter-derived signals
(rates and counts the service computes from telemetry, or parses from the event's attributes)
and the topology the service knows about the GPU (``nvlink_domain``), because classification
and correlation must not look anything up.

Pure: plain frozen values, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rasd.common.vocabulary import EventKind, Severity


@dataclasses.dataclass(frozen=True)
class HealthEvent:
    """One health observation from one node, with the signals the controller derived for it.

    Optional signal fields are None when unknown or unsupported, which is different from zero.
    """

    node_id: str
    """The node that reported it."""
    kind: EventKind
    """What was observed."""
    observed_at: float
    """When the agent observed it, Unix seconds (agent clock)."""
    gpu_uuid: str = ""
    """The GPU it concerns; empty for node-level events (IB port, SXID)."""
    xid: int | None = None
    """The Xid (or SXID) number for XID and SXID events."""
    severity: Severity = Severity.UNSPECIFIED
    """The agent's own view; the controller classifies again with its policy."""
    message: str = ""
    """The raw kernel-log line or a human summary."""
    source: str = ""
    """Where it came from: "nvml", "kmsg", "sysfs", "simulated", "validation"."""
    attributes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Parsed extras: link, ib_device, ib_port, ib_state, pid, intr_info, error_status, ..."""
    seq: int = 0
    """The agent's spool position (strictly increasing per node); 0 when not spooled."""
    nvlink_domain: str = ""
    """The NVLink domain of the GPU (or node), from inventory labels; empty when unknown."""
    recovery_action: int | None = None
    """NVML GPU recovery action (field 230): 0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain and reset."""
    ecc_sbe_rate_per_s: float | None = None
    """Corrected (single-bit) ECC errors per second over the agent's window."""
    remapped_rows_uncorrectable: int | None = None
    """Rows remapped because of uncorrectable errors (NVML remapped rows, unc.)."""
    remapped_rows_correctable: int | None = None
    """Rows remapped because of correctable errors."""
    retired_pages: int | None = None
    """Retired pages, single- plus double-bit (pre-Ampere page retirement)."""
    retired_pages_pending: bool | None = None
    """A page retirement waits for the next reset."""
    nvlink_crc_rate_per_s: float | None = None
    """NVLink CRC (flit + data) errors per second on the worst link."""
    pcie_replay_rate_per_s: float | None = None
    """PCIe replay counter increase per second."""

    @property
    def ib_port(self) -> str:
        """The InfiniBand port as "device/port" (e.g. "mlx5_0/1"), or "" when not an IB event."""
        device = self.attributes.get("ib_device", "")
        port = self.attributes.get("ib_port", "")
        if not device and not port:
            return ""
        return f"{device}/{port}"

    @property
    def nvlink(self) -> str:
        """The NVLink number from the attributes, or "" when not given."""
        return self.attributes.get("link", "")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict; `from_dict` reverses it."""
        out = dataclasses.asdict(self)
        out["kind"] = self.kind.name
        out["severity"] = self.severity.name
        out["attributes"] = dict(self.attributes)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HealthEvent:
        """Rebuild an event from `to_dict` output.

        Args:
            data: the dict; enum fields are names ("XID", "FATAL").

        Returns:
            The event.
        """
        fields = dict(data)
        fields["kind"] = EventKind[fields["kind"]]
        fields["severity"] = Severity[fields.get("severity", "UNSPECIFIED")]
        fields["attributes"] = dict(fields.get("attributes", {}))
        return cls(**fields)
