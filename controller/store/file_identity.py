"""Whether a SQLite store is still the file it was opened as (deleted or replaced under a running controller).

With the SQLite files deleted under it, the controller kept acking events into the unlinked file
(its connections still held it open), logged nothing and stayed SERVING; on restart those events,
and an operator's quarantine, were gone. Every transaction now first checks that the path still
names the file the engine first opened (device and inode); when it does not, the transaction is
refused with `StoreFileLost`, a store outage (`repo.STORE_UNAVAILABLE`): nothing more is acked, and
agents keep their events in their spools until a controller with its store is back.
"""

from __future__ import annotations

import os
import threading


class StoreFileLost(Exception):
    """The SQLite file was deleted or replaced since the engine opened it: the store is unavailable."""


class SqliteFileIdentity:
    """The (device, inode) a SQLite path named when first opened, and whether it still names it."""

    def __init__(self, path: str) -> None:
        """Watch path; its identity is taken at the first `note_opened`."""
        self.path = path
        self._identity: tuple[int, int] | None = None
        self._lock = threading.Lock()

    def _now(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return (stat.st_dev, stat.st_ino)

    def note_opened(self) -> None:
        """A connection was opened: the first one fixes the identity; a later one must match it.

        Raises:
            StoreFileLost: the path names another file (sqlite3 made a new empty one for a deleted path).
        """
        with self._lock:
            if self._identity is None:
                self._identity = self._now()
                return
        self.check()

    def problem(self) -> str | None:
        """Why the path no longer names the opened file; None while it does (or before it was opened)."""
        if self._identity is None:
            return None
        now = self._now()
        if now is None:
            return f"{self.path}: deleted while in use"
        if now != self._identity:
            return f"{self.path}: replaced by another file while in use"
        return None

    def check(self) -> None:
        """Raise `StoreFileLost` if the path no longer names the opened file."""
        problem = self.problem()
        if problem is not None:
            raise StoreFileLost(problem)
