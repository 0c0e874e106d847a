"""The remediation commit writer in its own process, so that a decision burst uses two cores, not one.

`RemediationStore.commit` is SQLAlchemy and SQLite in Python, costing per event about as much CPU
as deciding it, most of it holding the GIL. In the controller's process that time is taken from the
event loop that decides: deciding and committing then share one core whatever the machine has, and
pipelining them in one process only makes them take turns at the GIL.
Here the commit runs in a child process with its own engine; the controller's store thread sends
it each `Commit` (pickled, about 1.6 KB per event) and waits for the command ids it reports new.

What stays the same:
- **One writer, in order.** The child has one connection and takes one commit at a time, in the
  order they are sent; a failed commit is rolled back there and its exception comes back.
- **Fencing.** The fence is a value (`lease.Fence`), read when the commit is sent and checked in
  the child's transaction, as in-process.
- **A lost child is a store outage.** If the child dies, the commit in flight raises
  `repo.WriterLost`, one of `repo.STORE_UNAVAILABLE`: the caller keeps its events and tries again, and
  the next commit starts a new child. A commit the child finished before dying is durable anyway;
  deciding its events again yields the same command ids, which the outbox does not insert twice.

In-memory SQLite cannot be shared with another process; `CommitProcess` refuses such a URL.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from rasd.common import child_process
from rasd.controller.store import repo

SWITCH_INTERVAL_S = 0.00002
"""The interpreter's thread switch interval once a writer process runs (CPython's default: 5 ms).

The store thread that sends a commit and takes its answer needs the GIL for each of those steps,
while the event loop holds it deciding the next pass for milliseconds at a time; meanwhile the
child idles. With the default interval each hand-off waits out the decider's slice, and a burst's
p99 is set by those waits; a short interval lets the store thread in as soon as it is ready
(`bench/remediation.py` and `bench/remediation_ab.py` compare intervals; bench/RESULTS.md).
A short interval costs only while two threads want the GIL at once: an idle controller has none."""
START_TIMEOUT_S = 60.0
"""How long a new child may take to import, connect and answer that it is ready."""
STOP_TIMEOUT_S = 10.0


class CommitProcess:
    """Runs `RemediationStore.commit` in a child process; a drop-in for the store's commit.

    Thread-safe: commits from several threads are sent one at a time (the controller sends them
    from its single store thread anyway).
    """

    def __init__(self, url: str, *, fence: Callable[[], Callable[[Session], None] | None] | None = None) -> None:
        """Remember where to write; the child starts with `start` (or the first commit).

        Args:
            url: the store's SQLAlchemy URL (a file or a server; not in-memory SQLite).
            fence: returns, at each commit, the picklable fence its transaction must pass first
                (`leader.Leadership.current_fence`), or None for no fence.
        """
        parsed = sa.engine.make_url(url)
        if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
            raise ValueError(
                f"{url!r}: an in-memory SQLite store cannot be written from another process "
                "(commit in the store thread: --commit-writer thread)"
            )
        self._url = url
        self._fence = fence
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: multiprocessing.connection.Connection | None = None
        self.started = 0
        """Children started so far (for tests and diagnostics)."""

    @property
    def pid(self) -> int | None:
        """The running child's process id, if one runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def start(self) -> None:
        """Start the child unless one runs, and wait until it has connected (blocking).

        Also lowers this process's thread switch interval to `SWITCH_INTERVAL_S` (process-wide).
        """
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        with self._lock:
            self._ensure_started()

    def commit(self, change: Any) -> list[str]:
        """`RemediationStore.commit` in the child; returns the command ids that were new (blocking).

        Raises:
            repo.WriterLost: the child died (a new one starts at the next commit).
            Exception: what the child's commit raised (sent back as is).
        """
        fence = self._fence() if self._fence is not None else None
        payload = pickle.dumps((change, fence), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            conn = self._ensure_started()
            try:
                conn.send_bytes(payload)
                reply = conn.recv_bytes()
            except (EOFError, OSError) as exc:
                self._reap()
                why = exc or type(exc).__name__
                raise repo.WriterLost(f"the store writer process died during a commit: {why}") from exc
        status, value = pickle.loads(reply)
        if status == "ok":
            return list(value)
        raise value

    def close(self) -> None:
        """Ask the child to finish and wait for it (it ends after the commit it is on)."""
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    self._conn.send_bytes(b"")
            self._reap()

    def _ensure_started(self) -> multiprocessing.connection.Connection:
        if self._conn is not None and self._process is not None and self._process.poll() is None:
            return self._conn
        self._reap()
        # The URL goes over the socket, not the command line, where `ps` would show a password in it.
        process, conn = child_process.spawn("rasd.controller.store.writer")
        self._process, self._conn = process, conn
        try:
            conn.send_bytes(pickle.dumps(self._url))
            if not conn.poll(START_TIMEOUT_S):
                raise repo.WriterLost(f"the store writer process did not start within {START_TIMEOUT_S:.0f} s")
            status, value = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError) as exc:
            self._reap()
            raise repo.WriterLost(f"the store writer process exited while starting ({exc or 'EOF'})") from exc
        except BaseException:
            self._reap()
            raise
        if status != "ready":
            self._reap()
            raise value
        self.started += 1
        return conn

    def _reap(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            try:
                self._process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(STOP_TIMEOUT_S)
        self._process, self._conn = None, None


def serve(conn: multiprocessing.connection.Connection) -> None:
    """The child: one engine, one commit at a time, until an empty message or the parent is gone."""
    from rasd.controller.store import lease as lease_store  # imported here: the parent may not need them
    from rasd.controller.store import remediation as rstore

    try:
        url = pickle.loads(conn.recv_bytes())
        engine = repo.create_engine(url)
        repo.without_autocheckpoint(engine)  # the parent's WalCheckpointer checkpoints the file
        store = rstore.RemediationStore(engine)
        # Before "ready": the first decision's commit need not compile its statements, nor import
        # the module its fence unpickles from (9 ms of the first commit in `make demo`). A term-0
        # fence is refused wherever a lease was ever taken; its check is compiled all the same.
        with contextlib.suppress(lease_store.NotLeaderError):
            store.warm_up(fence=lease_store.Fence(0))
    except (EOFError, OSError):
        return
    except Exception as exc:
        conn.send_bytes(child_process.pickled("error", exc))
        return
    conn.send_bytes(pickle.dumps(("ready", None)))
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            break  # the parent is gone
        if not message:
            break
        change, fence = pickle.loads(message)
        store.fence = fence
        try:
            reply = child_process.pickled("ok", store.commit(change))
        except Exception as exc:
            reply = child_process.pickled("error", exc)
        try:
            conn.send_bytes(reply)
        except OSError:
            break
    engine.dispose()


if __name__ == "__main__":
    serve(multiprocessing.connection.Connection(int(sys.argv[1])))
