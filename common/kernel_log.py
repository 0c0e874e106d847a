"""What one kernel-log message says, as facts: the value the agent's parser makes and the controller classifies.

`KernelEvent` is what ``rasd.agent.core.kmsg`` finds in an NVIDIA driver, NVSwitch or RDMA line: the Xid
and its PCI address, pid and process, NVLink link, registers and subcode, the recovery action of an
Xid 154, an SXid and its fatality, an InfiniBand port and state. It holds no opinion: the severity and
the repair are decided by the controller's classifier (``rasd.controller.core.remediation.classify``),
which ``rasctl kmsg classify`` runs too.

The agent sends the facts as the typed ``KernelLogFacts`` of a rasd.api.v1 ``HealthEvent``. Where a
store keeps only a text map (the agent's spool, the controller's event table), `to_attributes` writes
them with the attribute names that agents before the typed field sent (``pci``, ``registers``,
``nvlink_subcode``, ...) and `from_attributes` reads them back, so an event from such an agent and a
stored event read the same way.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from rasd.common import xid_catalog
from rasd.common.vocabulary import EventKind
from rasd.common.xid_catalog import RecoveryAction

KIND_ATTRIBUTE = "kernel_event"
"""The attribute that marks an event's attributes as a kernel event's facts; its value is the `KernelEventKind`."""
RAW_ATTRIBUTE = "raw"


class KernelEventKind(enum.StrEnum):
    """What a kernel event is about; the values are the ``kind`` strings of ``rasctl kmsg classify``."""

    XID = "xid"
    FALLEN_OFF_BUS = "fallen_off_bus"
    SXID = "sxid"
    IB_LINK = "ib_link"


@dataclasses.dataclass(frozen=True)
class KernelEvent:
    """One fault or state change found in the kernel log. Fields that a message lacks are None/empty."""

    kind: KernelEventKind
    message: str  # the message text after the address/pid/name fields
    raw: str  # the input line(s) the event came from
    xid: int | None = None
    pci: str | None = None  # normalised dddd:bb:dd.f
    pid: int | None = None
    process: str | None = None
    gpu_uuid: str = ""  # from an earlier "NVRM: GPU at PCI:...: GPU-..." line, when seen
    kernel_time_us: int | None = None  # microseconds since boot, from the kmsg/dmesg stamp
    # MIG
    gpu_instance: int | None = None
    compute_instance: int | None = None
    # NVLink (Xid 74 and 144-150)
    nvlink: int | None = None
    registers: tuple[int, ...] = ()
    nvlink_subcode: str = ""
    nvlink_fatal: bool | None = None
    # Xid 154
    recovery_action: RecoveryAction | None = None
    previous_recovery_action: RecoveryAction | None = None
    # SXid
    sxid: int | None = None
    sxid_fatal: bool | None = None
    nvswitch: str = ""
    # InfiniBand / mlx5
    ib_device: str = ""
    ib_port: int | None = None
    ib_state: str = ""


_EVENT_KIND = {
    KernelEventKind.XID: EventKind.XID,
    KernelEventKind.FALLEN_OFF_BUS: EventKind.FALLEN_OFF_BUS,
    KernelEventKind.SXID: EventKind.SXID,
    KernelEventKind.IB_LINK: EventKind.IB_LINK_STATE,
}
_KERNEL_KIND = {event_kind: kernel_kind for kernel_kind, event_kind in _EVENT_KIND.items()}
_KERNEL_KIND[EventKind.RECOVERY_ACTION] = KernelEventKind.XID
_RECOVERY_XID = 154


def event_kind(event: KernelEvent) -> EventKind:
    """The health event kind of a kernel event; an Xid 154 is a RECOVERY_ACTION event."""
    if event.kind is KernelEventKind.XID and event.xid == _RECOVERY_XID:
        return EventKind.RECOVERY_ACTION
    return _EVENT_KIND[event.kind]


def kernel_kind(kind: EventKind) -> KernelEventKind | None:
    """The kernel event kind that reports as ``kind``, or None when the kernel log never does."""
    return _KERNEL_KIND.get(kind)


def facts(event: KernelEvent) -> dict[str, object]:
    """The event's facts besides kind, message, raw, Xid and GPU, as JSON values; unknown ones are left out.

    Registers are "0x%08x" strings and recovery actions their names, as the driver's own notation.
    """
    named = {
        "pci": event.pci,
        "pid": event.pid,
        "process": event.process,
        "kernel_time_us": event.kernel_time_us,
        "gpu_instance": event.gpu_instance,
        "compute_instance": event.compute_instance,
        "nvlink": event.nvlink,
        "nvlink_subcode": event.nvlink_subcode or None,
        "nvlink_fatal": event.nvlink_fatal,
        "registers": [f"0x{r:08x}" for r in event.registers] or None,
        "recovery_action": event.recovery_action.name if event.recovery_action is not None else None,
        "previous_recovery_action": (
            event.previous_recovery_action.name if event.previous_recovery_action is not None else None
        ),
        "sxid": event.sxid,
        "sxid_fatal": event.sxid_fatal,
        "nvswitch": event.nvswitch or None,
        "ib_device": event.ib_device or None,
        "ib_port": event.ib_port,
        "ib_state": event.ib_state or None,
    }
    return {key: value for key, value in named.items() if value is not None}


def to_attributes(event: KernelEvent) -> dict[str, str]:
    """The event's facts as a text map, in the attribute names agents sent before the typed field.

    Example: an Xid 149 NVLink line gives ``{"kernel_event": "xid", "raw": "...", "pci": "0000:00:00.0",
    "nvlink": "0", "nvlink_subcode": "NETIR_LINK_EVT", "nvlink_fatal": "true", "registers": "0x025001c6
    0x00000000 ..."}``. `from_attributes` reverses it.
    """
    out = {KIND_ATTRIBUTE: event.kind.value, RAW_ATTRIBUTE: event.raw}
    for key, value in facts(event).items():
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, list):
            out[key] = " ".join(value)
        else:
            out[key] = str(value)
    return out


def from_attributes(
    attributes: Mapping[str, str], *, message: str = "", xid: int | None = None, gpu_uuid: str = ""
) -> KernelEvent | None:
    """Read a kernel event's facts back from a text map (`to_attributes`, or what an older agent sent).

    Text that does not parse is taken as unknown, never an error: these maps come from the network.

    Args:
        attributes: the event's attributes.
        message: the health event's message (the text after the address, pid and name).
        xid: the health event's Xid.
        gpu_uuid: the health event's GPU.

    Returns:
        The event, or None when the map does not say it is one (no valid ``kernel_event`` key).
    """
    try:
        kind = KernelEventKind(attributes.get(KIND_ATTRIBUTE, ""))
    except ValueError:
        return None
    return KernelEvent(
        kind=kind,
        message=message,
        raw=attributes.get(RAW_ATTRIBUTE, ""),
        xid=xid,
        pci=attributes.get("pci") or None,
        pid=_int(attributes.get("pid")),
        process=attributes.get("process") or None,
        gpu_uuid=gpu_uuid,
        kernel_time_us=_int(attributes.get("kernel_time_us")),
        gpu_instance=_int(attributes.get("gpu_instance")),
        compute_instance=_int(attributes.get("compute_instance")),
        nvlink=_int(attributes.get("nvlink")),
        registers=_registers(attributes.get("registers", "")),
        nvlink_subcode=attributes.get("nvlink_subcode", ""),
        nvlink_fatal=_bool(attributes.get("nvlink_fatal")),
        recovery_action=_recovery_action(attributes.get("recovery_action")),
        previous_recovery_action=_recovery_action(attributes.get("previous_recovery_action")),
        sxid=_int(attributes.get("sxid")),
        sxid_fatal=_bool(attributes.get("sxid_fatal")),
        nvswitch=attributes.get("nvswitch", ""),
        ib_device=attributes.get("ib_device", ""),
        ib_port=_int(attributes.get("ib_port")),
        ib_state=attributes.get("ib_state", ""),
    )


_MAX_NUMBER_CHARS = 24
"""Longer digit strings are not a pid, port or time (and int() of thousands of digits is slow)."""


def _int(text: str | None) -> int | None:
    if not text or len(text) > _MAX_NUMBER_CHARS:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _bool(text: str | None) -> bool | None:
    return {"true": True, "false": False}.get((text or "").lower())


def _registers(text: str) -> tuple[int, ...]:
    words = text.split()
    if not words or any(len(word) > _MAX_NUMBER_CHARS for word in words):
        return ()
    try:
        return tuple(int(word, 16) for word in words)
    except ValueError:
        return ()  # one bad word: the positions of the others are not known either


def _recovery_action(text: str | None) -> RecoveryAction | None:
    if not text:
        return None
    if text.isdigit() and len(text) <= _MAX_NUMBER_CHARS:
        try:
            return RecoveryAction(int(text))
        except ValueError:
            return None
    return xid_catalog.parse_recovery_action_text(text)
