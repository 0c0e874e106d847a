"""InfiniBand port state and link-flap counters from sysfs, and the observations two readings imply.

``read_ib_ports`` is the I/O half: it reads ``<root>/<device>/ports/<n>/state`` ("4: ACTIVE"),
``phys_state``, ``link_layer``, ``rate`` and ``counters/{link_downed,link_error_recovery,symbol_error}``
under a configurable root (``/sys/class/infiniband`` by default, a fixture tree in tests).

``ib_observations`` is the pure half: given the previous and the current reading it returns
``EventKind.IB_LINK_STATE`` observations, each with ``attributes["signal"]``:

=====================  ========  ====================================================================
signal                 severity  when
=====================  ========  ====================================================================
state_change           warning   the logical state changed to anything but ACTIVE
state_change           info      the logical state changed to ACTIVE
link_downed            warning   link_downed went up (the port lost its link, i.e. a flap)
link_error_recovery    warning   link_error_recovery went up (the link retrained)
symbol_error           warning   symbol_error went up by at least ``symbol_error_min_delta`` (a few
                                 symbol errors are normal on healthy links; the rate is in metrics)
port_removed           warning   a port present before is gone (HCA unbound or lost)
port_added             info      a port appeared after the first reading (hot-plug, driver reload)
=====================  ========  ====================================================================

The first reading (``previous`` None) yields nothing: it is the baseline. These counters are small
saturating fields in the IB PortCounters (link_downed and link_error_recovery 8 bits, symbol_error
16 bits): a saturated counter stops moving, and a counter lower than before was reset (driver reload
or ``perfquery -R``), so its delta is its current value.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path

from rasd.agent.core.model import EventKind, Observation, Severity

DEFAULT_ROOT = "/sys/class/infiniband"
OBSERVATION_SOURCE = "ib_sysfs"
COUNTERS = ("link_downed", "link_error_recovery", "symbol_error")


@dataclasses.dataclass(frozen=True)
class IbPortReading:
    """One port's state and counters at one moment; None where the file is absent or unreadable."""

    device: str
    port: int
    state: str  # "ACTIVE", "DOWN", "INIT", "ARMED", ...; "" when unreadable
    state_code: int | None = None  # the number before the name: 4 for ACTIVE
    phys_state: str = ""  # "LinkUp", "Polling", "Disabled", ...
    link_layer: str = ""  # "InfiniBand" or "Ethernet" (RoCE)
    rate: str = ""  # "400 Gb/sec (4X NDR)"
    link_downed: int | None = None
    link_error_recovery: int | None = None
    symbol_error: int | None = None


IbReadings = Mapping[tuple[str, int], IbPortReading]

_STATE = re.compile(r"^\s*(?:(?P<code>[0-9]{1,3}):\s*)?(?P<name>\S.*?)\s*$")


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        # Some counters return EINVAL on RoCE ports, and a device being unbound vanishes mid-read.
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    if text is None or not re.fullmatch(r"[0-9]{1,20}", text):
        return None
    return int(text)


def parse_state(text: str | None) -> tuple[int | None, str]:
    """Split a sysfs state such as "4: ACTIVE" or "5: LinkUp" into (4, "ACTIVE"); (None, "") if empty."""
    if not text:
        return None, ""
    m = _STATE.match(text)
    if m is None:
        return None, ""
    return (int(m["code"]) if m["code"] else None), m["name"]


def read_ib_ports(root: str | os.PathLike[str] = DEFAULT_ROOT) -> dict[tuple[str, int], IbPortReading]:
    """Read every port of every IB device under ``root``.

    Args:
        root: the ``/sys/class/infiniband`` folder (or a copy of it).

    Returns:
        Readings keyed by (device, port); empty when ``root`` does not exist (no HCA).
    """
    readings: dict[tuple[str, int], IbPortReading] = {}
    base = Path(root)
    try:
        devices = sorted(p for p in base.iterdir() if p.is_dir())
    except OSError:
        return readings
    for device in devices:
        try:
            ports = sorted((p for p in (device / "ports").iterdir() if p.name.isdecimal()), key=lambda p: int(p.name))
        except OSError:
            continue
        for port_dir in ports:
            code, state = parse_state(_read_text(port_dir / "state"))
            _, phys = parse_state(_read_text(port_dir / "phys_state"))
            counters = {name: _read_int(port_dir / "counters" / name) for name in COUNTERS}
            reading = IbPortReading(
                device=device.name,
                port=int(port_dir.name),
                state=state,
                state_code=code,
                phys_state=phys,
                link_layer=_read_text(port_dir / "link_layer") or "",
                rate=_read_text(port_dir / "rate") or "",
                **counters,
            )
            readings[(reading.device, reading.port)] = reading
    return readings


def _delta(before: int | None, after: int | None) -> int:
    if before is None or after is None:
        return 0
    return after - before if after >= before else after  # lower than before: the counter was reset


def ib_observations(
    previous: IbReadings | None,
    current: IbReadings,
    *,
    observed_unix_ns: int,
    symbol_error_min_delta: int = 100,
) -> tuple[Observation, ...]:
    """Compare two readings and return what changed (rules in the module docstring). Pure.

    Example: previous mlx5_0/1 ACTIVE link_downed=3, current DOWN link_downed=4 -> two observations,
    signal "state_change" (ACTIVE -> DOWN, warning) and signal "link_downed" (delta 1, warning).

    Args:
        previous: the last reading, or None for the first one (baseline, nothing reported).
        current: this reading.
        observed_unix_ns: when ``current`` was read.
        symbol_error_min_delta: smallest symbol_error increase worth an observation.

    Returns:
        Observations in (device, port) order; per port the state change comes before the counters.
    """
    if previous is None:
        return ()
    out: list[Observation] = []

    def emit(reading: IbPortReading, signal: str, severity: Severity, message: str, **extra: str) -> None:
        attrs = {
            "signal": signal,
            "ib_device": reading.device,
            "ib_port": str(reading.port),
            "ib_state": reading.state,
            "phys_state": reading.phys_state,
            "link_layer": reading.link_layer,
        }
        attrs.update(extra)
        for name in COUNTERS:
            value = getattr(reading, name)
            if value is not None:
                attrs[name] = str(value)
        out.append(
            Observation(
                kind=EventKind.IB_LINK_STATE,
                observed_unix_ns=observed_unix_ns,
                message=f"{reading.device} port {reading.port}: {message}",
                source=OBSERVATION_SOURCE,
                severity=severity,
                attributes=attrs,
            )
        )

    for key in sorted(set(previous) | set(current)):
        before, after = previous.get(key), current.get(key)
        if after is None:
            if before is not None:
                emit(before, "port_removed", Severity.WARNING, "port is gone")
            continue
        if before is None:
            emit(after, "port_added", Severity.INFO, f"port appeared in state {after.state or 'unknown'}")
            continue
        if after.state != before.state:
            severity = Severity.INFO if after.state == "ACTIVE" else Severity.WARNING
            emit(
                after,
                "state_change",
                severity,
                f"{before.state or 'unknown'} -> {after.state or 'unknown'}",
                previous_ib_state=before.state,
            )
        for name in COUNTERS:
            delta = _delta(getattr(before, name), getattr(after, name))
            threshold = symbol_error_min_delta if name == "symbol_error" else 1
            if delta >= max(threshold, 1):
                emit(after, name, Severity.WARNING, f"{name} +{delta}", delta=str(delta))
    return tuple(out)
