"""Address helpers shared by the daemons and the CLI."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """True when host names this machine only (localhost, 127.0.0.0/8, ::1)."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_host_port(address: str) -> tuple[str, int]:
    """Split "host:port" (IPv6 as "[::1]:port") into its parts, naming what is wrong on bad input."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"address {address!r} is not host:port")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"address {address!r} has a non-numeric port {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"address {address!r} has port {port} outside 0..65535")
    return host.strip("[]"), port
