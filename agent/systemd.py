"""sd_notify for the agent's systemd unit (Type=notify, WatchdogSec=): READY, WATCHDOG, STOPPING.

About fifteen lines of stdlib instead of a dependency. Without $NOTIFY_SOCKET (not under systemd)
every call is a no-op. The agent sends WATCHDOG=1 only after a successful sampling cycle, so a hung
NVML call gets the agent restarted by systemd.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends sd_notify datagrams to the socket systemd handed us."""

    def __init__(self, socket_path: str | None = None) -> None:
        """Use socket_path, or $NOTIFY_SOCKET when None."""
        path = socket_path if socket_path is not None else os.environ.get("NOTIFY_SOCKET", "")
        # "@name" is an abstract socket: the leading byte is NUL on the wire.
        self._address = "\0" + path[1:] if path.startswith("@") else path
        watchdog_usec = os.environ.get("WATCHDOG_USEC", "")
        self.watchdog_interval_s = int(watchdog_usec) / 2e6 if watchdog_usec.isdigit() else None
        """Half the watchdog timeout, as sd_watchdog_enabled(3) advises; None when no watchdog."""

    @property
    def enabled(self) -> bool:
        """True when running under a systemd unit that listens for notifications."""
        return bool(self._address)

    def notify(self, state: str) -> bool:
        """Send one state string (e.g. "READY=1"); False when not under systemd or the send failed."""
        if not self._address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(state.encode(), self._address)
        except OSError:
            return False
        return True

    def ready(self, status: str = "") -> bool:
        """Tell systemd start-up finished."""
        return self.notify("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def watchdog(self) -> bool:
        """Pet the watchdog."""
        return self.notify("WATCHDOG=1")

    def stopping(self) -> bool:
        """Tell systemd shutdown began."""
        return self.notify("STOPPING=1")
