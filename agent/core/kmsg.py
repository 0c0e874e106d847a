r"""Kernel-log parser: text lines in, facts out (``rasd.common.kernel_log.KernelEvent``). Pure.

It owns the knowledge of what the NVIDIA driver (NVRM), the NVSwitch driver and the RDMA stack print,
and nothing about where the lines come from (``rasd.agent.kmsg_source`` follows /dev/kmsg or
journald; ``rasctl kmsg classify`` reads stdin) nor about what a fault means: the controller's
classifier decides severity and repair from these facts (``rasd.controller.core.remediation.classify``).
No I/O, logging or clock reads happen here.

Accepted line shapes (the parser searches for the message, so any prefix works):

* raw /dev/kmsg records ``4,1234,5678901,-;NVRM: ...`` (``\xNN`` escapes are decoded; dictionary
  lines that start with a space are ignored);
* dmesg ``[12345.678901] ...``, ``[Fri Aug 30 11:43:09 2024] ...`` and
  ``kern  :err   : 2025-01-25T10:34:54,859532+00:00 ...``;
* journald/syslog ``Nov 30 05:33:20 host kernel: ...``, with or without a dmesg stamp after it;
* a bare message.

Recognised messages:

* ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., <text>``: with or without pid/name, with a MIG
  suffix (``PCI:0000:3b:00 GPU-I:01 GPU-CI:02``) or a ``0000:3b:00.0`` address; Xid 74 NVLink
  registers; Xid 144-150 ``<SUBCODE> <Fatal|Nonfatal> XC0 i0 Link N (<7 registers>)``; Xid 154
  ``GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)``.
* "fallen off the bus" without an Xid: ``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.``, the
  older drivers' ``NVRM: GPU at 0000:01:00.0 has fallen off the bus.`` and the three-line probe
  message ``NVRM: The NVIDIA GPU 0000:b3:00.0`` / ``(PCI ID: ...) installed in this system has`` /
  ``fallen off the bus and is not responding to commands.`` (tests/fixtures/kmsg/
  fallen_off_bus_wordings.txt holds every wording known, with its source).
* ``nvidia-nvswitchN: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 48 LTSSM Fault Up``. The driver
  prints each SXid as up to three lines (``Data {...}``, the description, ``Severity N Engine
  instance ...``); only the description line is an event, so one fault is one event.
* RDMA port state ``mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN`` (IB core, recent kernels),
  ``mlx5_core 0000:53:00.0 enp83s0f0np0: Link down`` (mlx5 netdev), ``ib0: Link DOWN``, and
  ``mlx5_core 0000:08:00.0: Port module event: module 0, Cable unplugged``.

PCI addresses are normalised to ``dddd:bb:dd.f`` lower case (``PCI:0000:3B:00`` -> ``0000:3b:00.0``),
the form ``normalize_pci`` also gives NVML's ``00000000:3B:00.0``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from rasd.agent.core.model import Observation, Severity
from rasd.common import kernel_log, xid_catalog
from rasd.common.kernel_log import KernelEvent, KernelEventKind
from rasd.common.vocabulary import XID_MAX
from rasd.common.xid_catalog import RecoveryAction

OBSERVATION_SOURCE = "kmsg"


# --- prefixes -----------------------------------------------------------------------------------

# 4,1234,5678901,-;message   (extra comma fields before ';' are allowed by the kmsg ABI)
_KMSG_RECORD = re.compile(
    r"^(?P<prio>[0-9]{1,4}),(?P<seq>[0-9]{1,20}),(?P<usec>[0-9]{1,20}),[^;]*;(?P<msg>.*)$", re.DOTALL
)
_DMESG_STAMP = re.compile(r"\[\s*(?P<sec>[0-9]{1,12})\.(?P<frac>[0-9]{1,9})\]")
_HEX_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")

# --- NVRM ---------------------------------------------------------------------------------------

_PCI_ANY = re.compile(
    r"(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})"
    r"(?:\.(?P<fn>[0-7]))?"
)
# Digit runs are bounded everywhere: int() refuses decimal strings over 4300 digits, and the
# parser must not raise on any input.
_XID = re.compile(r"NVRM: Xid \((?P<loc>[^()]*)\): (?P<xid>[0-9]{1,6})(?:,\s?(?P<rest>.*))?$", re.DOTALL)
_MIG_GI = re.compile(r"GPU-I(?::|\s+)(?P<gi>[0-9]{1,4})")
_MIG_CI = re.compile(r"(?:GPU-CI|(?<![A-Za-z])CI)(?::|\s+)(?P<ci>[0-9]{1,4})")  # not the "CI" of "PCI:"
# pid=1234 / pid='<unknown>' / pid=<n/a>, optionally followed by name=... (up to the next ", ").
_PID_NAME = re.compile(
    r"^pid=(?P<pid>'[^']*'|<[^>]*>|[^,\s]*),?\s*(?:name=(?P<name>.*?)(?:,\s*|$))?(?P<text>.*)$", re.DOTALL
)
_XID74 = re.compile(r"link (?P<link>[0-9]{1,4})\s*(?:\((?P<regs>0x[0-9a-fA-F]+(?:,\s*0x[0-9a-fA-F]+)*)\))?")
_NVLINK5 = re.compile(
    r"^(?P<sub>[A-Z0-9_]+)\s+(?P<fatal>Fatal|Nonfatal|Non-fatal)\b.*?Link\s+(?P<link>-?[0-9]{1,4})\s*"
    r"\((?P<regs>0x[0-9a-fA-F]+(?:[\s,]+0x[0-9a-fA-F]+)*)\)",
    re.IGNORECASE,
)
_RECOVERY = re.compile(
    r"recovery action changed from (?P<from_v>0x[0-9a-fA-F]{1,8}|[0-9]{1,9})\s*(?:\((?P<from_t>[^)]*)\))?\s*"
    r"to (?P<to_v>0x[0-9a-fA-F]{1,8}|[0-9]{1,9})\s*(?:\((?P<to_t>[^)]*)\))?",
    re.IGNORECASE,
)
_GPU_AT = re.compile(r"NVRM: GPU at (?P<pci>PCI:[0-9a-fA-F:.]+): (?P<uuid>GPU-[0-9a-fA-F-]+)")
# "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus." (the driver's GPU-lost handler, with or without an
# Xid 79 before it) and the older drivers' "NVRM: GPU at 0000:01:00.0 has fallen off the bus.", which no
# Xid line accompanies.
_FALLEN_ONE_LINE = re.compile(
    r"NVRM: GPU (?:at )?(?P<pci>(?:PCI:)?[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?):?\s+"
    r"(?P<text>(?:GPU )?has fallen off the bus.*)$",
    re.IGNORECASE,
)
_FALLEN_START = re.compile(
    r"NVRM: The NVIDIA GPU (?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)(?P<text>.*)$"
)
_NVRM_CONT = re.compile(r"NVRM:\s?(?P<text>.*)$")
_FALLEN_TEXT = re.compile(r"fallen off the bus", re.IGNORECASE)
# The three-line message arrives within a few lines; give up waiting after this many.
_FALLEN_MAX_LINES = 4

# --- NVSwitch -----------------------------------------------------------------------------------

_SXID = re.compile(
    r"(?P<switch>nvidia-nvswitch\d+): SXid \((?P<loc>[^()]*)\): (?P<sxid>[0-9]{1,6})(?:,\s?(?P<rest>.*))?$",
    re.DOTALL,
)
_SXID_DETAIL = re.compile(r"^(?:Data \{|Severity [0-9]+ Engine instance)")
_SXID_FATALITY = re.compile(r"^(?P<fatal>Fatal|Non-fatal|Nonfatal)\s*,?\s*(?P<text>.*)$", re.IGNORECASE | re.DOTALL)

# --- RDMA / mlx5 --------------------------------------------------------------------------------

_PCI_FULL = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_IB_PORT = re.compile(
    rf"(?:(?P<driver>[\w-]{{1,32}}) (?P<pci>{_PCI_FULL}) )?(?P<dev>[\w.-]{{1,64}}): Port:? (?P<port>[0-9]{{1,4}}) Link "
    r"(?P<state>DOWN|INIT|ARMED|ACTIVE_DEFER|ACTIVE|NOP)\b"
)
_NETDEV_LINK = re.compile(rf"mlx5_core (?P<pci>{_PCI_FULL}) (?P<dev>[\w.-]{{1,64}}): Link (?P<state>up|down)\b")
_IPOIB_LINK = re.compile(r"(?<![\w-])(?P<dev>ib[\w.]{0,62}): Link (?P<state>DOWN|UP|down|up)\b")
_PORT_MODULE = re.compile(
    rf"(?:mlx5_core (?P<pci>{_PCI_FULL}): )?(?:mlx5_port_module_event:[0-9]{{1,9}}:\(pid [0-9]{{1,10}}\): )?"
    r"Port module event(?P<err>\[error\])?: module (?P<module>[0-9]{1,4}), (?P<status>.*)$"
)


def normalize_pci(text: str) -> str | None:
    """Normalise a PCI address to ``dddd:bb:dd.f`` lower case.

    Accepts ``PCI:0000:3b:00`` (the Xid form, function 0 implied), ``0000:3b:00.0``, NVML's
    ``00000000:3B:00.0`` (the 8-digit domain is truncated when its upper half is 0) and ``3b:00.0``.

    Args:
        text: the address as printed.

    Returns:
        The normalised address, or None when ``text`` holds none.
    """
    m = _PCI_ANY.search(text)
    if m is None:
        return None
    domain = int(m["domain"] or "0", 16)
    return f"{domain:04x}:{m['bus'].lower()}:{m['dev'].lower()}.{m['fn'] or '0'}"


def _unescape_kmsg(text: str) -> str:
    # /dev/kmsg escapes non-printable bytes (including embedded newlines) as \xNN.
    return _HEX_ESCAPE.sub(lambda m: chr(int(m[1], 16)), text)


def _split_record(line: str) -> tuple[str, int | None]:
    """Strip a /dev/kmsg header or find a dmesg stamp; return (message, kernel_time_us)."""
    m = _KMSG_RECORD.match(line)
    if m is not None:
        return _unescape_kmsg(m["msg"]), int(m["usec"])
    stamp = _DMESG_STAMP.search(line)
    if stamp is not None and stamp.start() < 80:
        frac = (stamp["frac"] + "000000")[:6]
        return line, int(stamp["sec"]) * 1_000_000 + int(frac)
    return line, None


def _parse_pid(text: str | None) -> int | None:
    if text and re.fullmatch(r"[0-9]{1,10}", text):
        return int(text)
    return None


def _parse_process(text: str | None) -> str | None:
    if text is None:
        return None
    name = text.strip().strip("'")
    if not name or name.startswith("<"):
        return None
    return name


def _to_recovery_action(value: str, label: str | None) -> RecoveryAction | None:
    number = int(value, 16) if value.lower().startswith("0x") else int(value)
    try:
        return RecoveryAction(number)
    except ValueError:
        return xid_catalog.parse_recovery_action_text(label or "")


class KmsgParser:
    """Stateful line parser: ``feed`` one line, get the events it completes.

    State is small and bounded: the PCI -> GPU UUID map from ``NVRM: GPU at`` lines and a pending
    multi-line "fallen off the bus" message. It never raises on any input.
    """

    _MAX_UUIDS = 256

    def __init__(self) -> None:
        self._uuid_by_pci: dict[str, str] = {}
        self._pending_pci: str | None = None
        self._pending_lines: list[str] = []
        self._pending_raw: list[str] = []
        self._pending_time_us: int | None = None

    def feed(self, line: str) -> list[KernelEvent]:
        """Parse one line (or one /dev/kmsg record, which may hold several lines).

        Args:
            line: the text as read, with or without its trailing newline.

        Returns:
            The events the line completes; usually zero or one.
        """
        if not line or (line[0] in " \t" and "NVRM" not in line):
            # kmsg dictionary lines (" SUBSYSTEM=pci") and blank lines carry no message.
            return []
        message, time_us = _split_record(line.rstrip("\r\n"))
        events: list[KernelEvent] = []
        for part in message.split("\n"):
            events.extend(self._feed_one(part, raw=line.rstrip("\r\n"), time_us=time_us))
        return events

    def feed_all(self, lines: Iterable[str]) -> list[KernelEvent]:
        """Feed many lines; return every event in order."""
        out: list[KernelEvent] = []
        for line in lines:
            out.extend(self.feed(line))
        return out

    def _feed_one(self, text: str, *, raw: str, time_us: int | None) -> list[KernelEvent]:
        if self._pending_pci is not None:
            consumed, done = self._continue_fallen(text, raw)
            if consumed:
                return _opt(done)
        if "NVRM:" in text:
            return self._nvrm(text, raw, time_us)
        if "SXid" in text:
            return _opt(_parse_sxid(text, raw, time_us))
        if "Link" in text or "Port module event" in text:
            return _opt(_parse_ib(text, raw, time_us))
        return []

    # -- NVRM --

    def _nvrm(self, text: str, raw: str, time_us: int | None) -> list[KernelEvent]:
        m = _XID.search(text)
        if m is not None:
            event = _parse_xid(m, raw, time_us)
            if event is not None and event.pci is not None:
                event = dataclasses.replace(event, gpu_uuid=self._uuid_by_pci.get(event.pci, ""))
            return _opt(event)
        m = _GPU_AT.search(text)
        if m is not None:
            pci = normalize_pci(m["pci"])
            if pci is not None:
                if len(self._uuid_by_pci) >= self._MAX_UUIDS and pci not in self._uuid_by_pci:
                    self._uuid_by_pci.pop(next(iter(self._uuid_by_pci)))
                self._uuid_by_pci[pci] = m["uuid"]
            return []
        m = _FALLEN_ONE_LINE.search(text)
        if m is not None:
            pci = normalize_pci(m["pci"])
            return [self._fallen(pci, m["text"].strip(), raw, time_us)]
        m = _FALLEN_START.search(text)
        if m is not None:
            pci = normalize_pci(m["pci"])
            rest = m["text"].strip()
            if _FALLEN_TEXT.search(rest):  # the whole message on one line
                return [self._fallen(pci, f"The NVIDIA GPU {m['pci']} {rest}", raw, time_us)]
            self._pending_pci = pci
            self._pending_lines = [f"The NVIDIA GPU {m['pci']}" + (f" {rest}" if rest else "")]
            self._pending_raw = [raw]
            self._pending_time_us = time_us
        return []

    def _continue_fallen(self, text: str, raw: str) -> tuple[bool, KernelEvent | None]:
        """Offer a line to the pending multi-line message: (line consumed?, completed event)."""
        m = _NVRM_CONT.search(text)
        starts_other = m is not None and any(p.search(text) for p in (_XID, _GPU_AT, _FALLEN_ONE_LINE, _FALLEN_START))
        if m is None or starts_other or len(self._pending_lines) >= _FALLEN_MAX_LINES:
            self._pending_pci = None  # something else came between: not the message we waited for
            return False, None
        self._pending_lines.append(m["text"].strip())
        if raw not in self._pending_raw:
            self._pending_raw.append(raw)
        if not _FALLEN_TEXT.search(m["text"]):
            return True, None
        event = self._fallen(
            self._pending_pci,
            " ".join(self._pending_lines),
            "\n".join(self._pending_raw),
            self._pending_time_us,
        )
        self._pending_pci = None
        return True, event

    def _fallen(self, pci: str | None, message: str, raw: str, time_us: int | None) -> KernelEvent:
        return KernelEvent(
            kind=KernelEventKind.FALLEN_OFF_BUS,
            message=message,
            raw=raw,
            pci=pci,
            gpu_uuid=self._uuid_by_pci.get(pci or "", ""),
            kernel_time_us=time_us,
        )


def _opt(event: KernelEvent | None) -> list[KernelEvent]:
    return [] if event is None else [event]


def _parse_xid(m: re.Match[str], raw: str, time_us: int | None) -> KernelEvent | None:
    loc = m["loc"]
    xid = int(m["xid"])
    if not 1 <= xid <= XID_MAX:
        return None  # a garbled number: no Xid the catalog knows, and the controller would refuse it
    gi = _MIG_GI.search(loc)
    ci = _MIG_CI.search(loc[gi.end() :] if gi else loc)
    rest = (m["rest"] or "").strip()
    pid = process = None
    pm = _PID_NAME.match(rest)
    if pm is not None:
        pid = _parse_pid(pm["pid"])
        process = _parse_process(pm["name"])
        rest = pm["text"].strip()
    fields: dict[str, object] = {}
    if xid == 74:
        nm = _XID74.search(rest)
        if nm is not None:
            fields["nvlink"] = int(nm["link"])
            fields["registers"] = tuple(int(r, 16) for r in re.findall(r"0x[0-9a-fA-F]+", nm["regs"] or ""))
    elif 144 <= xid <= 150:
        nm = _NVLINK5.search(rest)
        if nm is not None:
            fields["nvlink"] = int(nm["link"])
            fields["nvlink_subcode"] = nm["sub"]
            fields["nvlink_fatal"] = nm["fatal"].lower() == "fatal"
            fields["registers"] = tuple(int(r, 16) for r in re.findall(r"0x[0-9a-fA-F]+", nm["regs"]))
    elif xid == 154:
        rm = _RECOVERY.search(rest)
        if rm is not None:
            fields["previous_recovery_action"] = _to_recovery_action(rm["from_v"], rm["from_t"])
            fields["recovery_action"] = _to_recovery_action(rm["to_v"], rm["to_t"])
    return KernelEvent(
        kind=KernelEventKind.XID,
        message=rest,
        raw=raw,
        xid=xid,
        pci=normalize_pci(loc),
        pid=pid,
        process=process,
        kernel_time_us=time_us,
        gpu_instance=int(gi["gi"]) if gi else None,
        compute_instance=int(ci["ci"]) if ci else None,
        **fields,  # type: ignore[arg-type]
    )


def _parse_sxid(text: str, raw: str, time_us: int | None) -> KernelEvent | None:
    m = _SXID.search(text)
    if m is None:
        return None
    rest = (m["rest"] or "").strip()
    if _SXID_DETAIL.match(rest):
        return None  # Data/Severity lines belong to the description line of the same SXid
    fatal = None
    fm = _SXID_FATALITY.match(rest)
    if fm is not None:
        fatal = fm["fatal"].lower() == "fatal"
    sxid = int(m["sxid"])
    return KernelEvent(
        kind=KernelEventKind.SXID,
        message=rest,
        raw=raw,
        pci=normalize_pci(m["loc"]),
        kernel_time_us=time_us,
        sxid=sxid,
        sxid_fatal=fatal,
        nvswitch=m["switch"],
    )


def _parse_ib(text: str, raw: str, time_us: int | None) -> KernelEvent | None:
    m = _IB_PORT.search(text)
    if m is not None:
        return KernelEvent(
            kind=KernelEventKind.IB_LINK,
            message=text[m.start("dev") :].strip(),
            raw=raw,
            pci=normalize_pci(m["pci"]) if m["pci"] else None,
            kernel_time_us=time_us,
            ib_device=m["dev"],
            ib_port=int(m["port"]),
            ib_state=m["state"],
        )
    m = _NETDEV_LINK.search(text)
    if m is None:
        m = _IPOIB_LINK.search(text)
    if m is not None:
        pci = m.groupdict().get("pci")
        return KernelEvent(
            kind=KernelEventKind.IB_LINK,
            message=text[m.start("dev") :].strip(),
            raw=raw,
            pci=normalize_pci(pci) if pci else None,
            kernel_time_us=time_us,
            ib_device=m["dev"],
            ib_state=m["state"].upper(),
        )
    m = _PORT_MODULE.search(text)
    if m is not None:
        status = m["status"].strip()
        if m["err"] or "error" in status.lower():
            state = "MODULE_ERROR"
        elif "unplugged" in status.lower():
            state = "MODULE_UNPLUGGED"
        elif "plugged" in status.lower():
            state = "MODULE_PLUGGED"
        else:
            state = "MODULE_EVENT"
        return KernelEvent(
            kind=KernelEventKind.IB_LINK,
            message=f"module {m['module']}, {status}",
            raw=raw,
            pci=normalize_pci(m["pci"]) if m["pci"] else None,
            kernel_time_us=time_us,
            ib_state=state,
        )
    return None


def parse_lines(lines: Iterable[str]) -> list[KernelEvent]:
    """Parse a whole log with a fresh parser (convenience for tests and ``rasctl``)."""
    return KmsgParser().feed_all(lines)


# --- Observation ----------------------------------------------------------------------------------


def to_observation(event: KernelEvent, observed_unix_ns: int) -> Observation:
    """Convert an event into the agent's Observation (Xid 154 becomes EventKind.RECOVERY_ACTION).

    The agent decides nothing about it: the severity stays UNSPECIFIED and the facts go in
    ``kernel_log``, which the controller classifies.

    Args:
        event: the parsed event.
        observed_unix_ns: when the agent saw it (the caller owns the clock).

    Returns:
        The observation.
    """
    return Observation(
        kind=kernel_log.event_kind(event),
        observed_unix_ns=observed_unix_ns,
        message=event.message,
        source=OBSERVATION_SOURCE,
        gpu_uuid=event.gpu_uuid,
        xid=event.xid,
        severity=Severity.UNSPECIFIED,
        kernel_log=event,
    )
