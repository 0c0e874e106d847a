"""The controller's own health-event value: one observation from a node, as the core sees it.

`HealthEvent` is what classification, correlation and escalation consume. It is independent of
the protobuf wire type (``rasd.controller.wire.agent`` converts ``rasd.api.v1.HealthEvent`` into it).
`EventKind` and `Severity` are rasd's shared vocabulary (``rasd.common.vocabulary``, pinned to the
wire enums by its tests); the facts of a kernel-log line are ``rasd.common.kernel_log.KernelEvent``.

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

from rasd.common import kernel_log
from rasd.common.kernel_log import KernelEvent
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
    """The source's own rating, UNSPECIFIED for kernel-log events; the controller classifies with its policy."""
    message: str = ""
    """The message text (of a kernel-log line: after its address, pid and name) or a human summary."""
    source: str = ""
    """Where it came from: "nvml", "kmsg", "sysfs", "simulated", "validation"."""
    attributes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Free extras: link, ib_device, ib_port, ib_state, ...; a kernel-log event's facts as text where the
    event went through a text-only store or came from an agent before the typed facts (`kernel_log_of`)."""
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
    kernel_log: KernelEvent | None = None
    """The facts of the kernel-log line the event came from, when it came from one and the caller has
    them typed (else `kernel_log_of` reads them from ``attributes``)."""

    @property
    def ib_port(self) -> str:
        """The InfiniBand port as "device/port" (e.g. "mlx5_0/1"), or "" when not an IB event."""
        if self.kernel_log is not None:
            device = self.kernel_log.ib_device
            port = "" if self.kernel_log.ib_port is None else str(self.kernel_log.ib_port)
        else:
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
        """A JSON-friendly dict; `from_dict` reverses it (the facts' message, Xid and GPU are the event's)."""
        out = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        out["kind"] = self.kind.name
        out["severity"] = self.severity.name
        out["attributes"] = dict(self.attributes)
        out["kernel_log"] = None if self.kernel_log is None else kernel_log.to_attributes(self.kernel_log)
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
        facts = fields.get("kernel_log")
        if facts is not None:
            fields["kernel_log"] = kernel_log.from_attributes(
                facts, message=fields.get("message", ""), xid=fields.get("xid"), gpu_uuid=fields.get("gpu_uuid", "")
            )
        return cls(**fields)


def kernel_log_of(event: HealthEvent) -> KernelEvent | None:
    """The facts of the kernel-log line an event came from, or None when it did not come from one.

    Typed when the event carries them; else read from its attributes, which is where the controller's
    event store keeps them and where agents before the typed ``HealthEvent.kernel_log`` put them
    (``rasd.common.kernel_log.from_attributes``).

    Example: attributes ``{"kernel_event": "xid", "registers": "0x025001c6 0x00000000", "nvlink_subcode":
    "NETIR_LINK_EVT"}`` give a KernelEvent with ``registers == (0x025001c6, 0)``.
    """
    if event.kernel_log is not None:
        return event.kernel_log
    if kernel_log.KIND_ATTRIBUTE not in event.attributes:
        return None  # most events: not from the kernel log
    return kernel_log.from_attributes(event.attributes, message=event.message, xid=event.xid, gpu_uuid=event.gpu_uuid)
