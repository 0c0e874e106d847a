"""The Kubernetes adapter in its own process, so that the ``kubernetes`` client's Python never takes the decider's GIL.

`KubernetesQuarantine` blocks on HTTP, so the remediation service calls it in threads; but the
client's own work per call (building the request, urllib3, reading the answer) is Python that holds
the interpreter lock, and in a quarantine storm hundreds of calls a second take it from the event loop
that decides. Here `KubernetesProcess` is the adapter the controller holds: each call is a small
pickled message to a child interpreter that owns the client (`serve`), and the calling thread waits
on the answer without the GIL. The child runs the calls in its own threads, as many at once as the
service makes them, and posts each quarantine's Event after its answer has gone back (`post_later`):
the repair that waits for the quarantine leaves one round trip sooner.

The remediation service calls it from its event loop (`call_async`), on a socket of that loop's own
(a `_Channel`, handed to the child over the first socket): the loop writes the call and reads its
answer as it reads any other socket, so no thread of the controller's process wakes for an async
call. Callers in threads (`quarantine_node` and the others) use the first socket, whose answers a
reader thread hands to them.

What stays the same: every call's semantics (the child runs `KubernetesQuarantine`), its outcome, and
its errors (sent back as they were raised). A child that dies fails the calls in flight with
`QuarantineUnavailableError` (retried as any API outage is) and the next call starts a new one. The
child starts on the first call or on `start`, and reads its settings from the socket.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import multiprocessing.connection
import multiprocessing.reduction
import os
import pickle
import socket
import struct
import subprocess
import threading
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from rasd.common import child_process
from rasd.common import logging as rasd_logging
from rasd.controller.executors.quarantine import k8s, k8s_drain
from rasd.controller.executors.quarantine.adapter import (
    QuarantineOutcome,
    QuarantineUnavailableError,
    log_drained,
    log_executed,
)

log = structlog.get_logger("rasd.controller")

CALLS = frozenset(
    {
        "quarantine_node", "release_node", "quarantine_gpu", "release_gpu", "quarantine_port", "release_port",
        "mark_rma", "drain_node", "sync_nodes", "heartbeat",
    }
)  # fmt: skip
"""The adapter's methods a parent may call in the child."""
LONG_CALLS = frozenset({"drain_node"})
"""Calls that take minutes (a drain waits out disruption budgets): their own threads, as in the service."""
CALL_THREADS = k8s.CALLS_AT_ONCE
"""Short calls the child runs at once (the service's adapter threads; one API connection each)."""
LONG_CALL_THREADS = 32
EVENT_THREADS = k8s.EVENT_POSTS_AT_ONCE
"""Threads that post Events after the calls that caused them have returned."""
START_TIMEOUT_S = 60.0
"""How long a new child may take to import the client, load its configuration and answer."""
STOP_TIMEOUT_S = 10.0
CHANNEL = "__channel__"
"""A control message on the first socket: the socket that follows it (SCM_RIGHTS) is a loop's channel."""


class KubernetesProcess:
    """`KubernetesQuarantine` in a child process; the same methods, outcomes and errors. Thread-safe.

    Args:
        settings: the adapter's settings (the child builds its API client from them, `k8s.api_client`).
    """

    name = "kubernetes"
    blocking = True
    """Its calls wait on another system (the service runs them after their dispatch commits)."""
    logs_calls = True
    """The child logs each quarantine, release and drain it carries out (`executors` does not)."""

    def __init__(self, settings: k8s.KubernetesSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        """Held to start or stop the child and to send (one message at a time on the socket)."""
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._pending: dict[int, _Pending] = {}
        """The running child's calls waiting for an answer (a new child gets a new table)."""
        self._lost = threading.Event()
        """Set when the running child's socket has closed (before the child can be reaped)."""
        self._ids = itertools.count(1)
        self._channels: dict[asyncio.AbstractEventLoop, asyncio.Task[_Channel]] = {}
        """Each event loop's channel to the child (`call_async`), as the task that opens it."""
        self.started = 0
        """Children started so far (for tests and diagnostics)."""

    @property
    def pid(self) -> int | None:
        """The running child's process id, if one runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def sync_period_s(self) -> float:
        """How often `sync_nodes` should run (0: never)."""
        return self._settings.node_sync_s

    def start(self) -> None:
        """Start the child unless one runs, and wait until its client is configured (blocking)."""
        with self._lock:
            self._ensure_started()

    async def call_async(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """One of the adapter's methods (`CALLS`) in the child, for a caller on an event loop; its value or error.

        On this loop's channel to the child; the first call opens it in a thread (which starts the
        child if none runs: seconds, importing the client), and a closed one (the child died) is
        opened again by the next call. Nothing else blocks the loop.
        """
        if method not in CALLS:
            raise ValueError(f"not a method of the Kubernetes adapter: {method!r}")
        loop = asyncio.get_running_loop()
        opening = self._channels.get(loop)
        if opening is None or (opening.done() and not _still_open(opening)):
            opening = loop.create_task(self._open_channel(loop), name="rasd-k8s-channel")
            self._channels[loop] = opening
        channel = await asyncio.shield(opening)  # a caller cancelled while it opens leaves it to the others
        return await channel.call(method, args, kwargs)

    async def _open_channel(self, loop: asyncio.AbstractEventLoop) -> _Channel:
        """A new socket pair: one end handed to the running child (started if none runs), the other read by loop."""
        ours, theirs = socket.socketpair()
        with theirs:
            # The handing thread's own copy of the child's end: a cancel of this opening (the loop
            # shutting down) closes `theirs`, never the descriptor the thread is about to send.
            handed = os.dup(theirs.fileno())
        try:
            await asyncio.to_thread(self._hand_over, handed)
            reader, writer = await asyncio.open_unix_connection(sock=ours)
        except BaseException:
            ours.close()
            raise
        return _Channel(reader, writer, forget=lambda channel: self._forget_channel(loop, channel))

    def _hand_over(self, handed: int) -> None:
        """Send the child a channel's socket (and close this copy of it); blocking: starts the child if none runs.

        The control message and the descriptor go together under the lock: the child reads the one
        byte that carries the descriptor right after the message, so nothing may come between.
        """
        try:
            with self._lock:
                conn = self._ensure_started()
                assert self._process is not None
                try:
                    conn.send_bytes(pickle.dumps((0, CHANNEL, (), {}), protocol=pickle.HIGHEST_PROTOCOL))
                    multiprocessing.reduction.send_handle(conn, handed, self._process.pid)
                except OSError as exc:
                    raise QuarantineUnavailableError(f"the Kubernetes adapter process is gone: {exc}") from exc
        finally:
            os.close(handed)

    def _forget_channel(self, loop: asyncio.AbstractEventLoop, channel: _Channel) -> None:
        """Drop loop's channel once it has closed (the next call opens another); not one opened since."""
        opening = self._channels.get(loop)
        if opening is not None and _opened(opening) is channel:
            del self._channels[loop]

    # ---- the adapter's methods, run in the child ----------------------------------------------

    def quarantine_node(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """`KubernetesQuarantine.quarantine_node` in the child."""
        return self._call("quarantine_node", node_id, reason=reason, ticket_id=ticket_id)

    def release_node(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """`KubernetesQuarantine.release_node` in the child."""
        return self._call("release_node", node_id, reason=reason, ticket_id=ticket_id)

    def quarantine_gpu(self, node_id: str, gpu_uuid: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """`KubernetesQuarantine.quarantine_gpu` in the child."""
        return self._call("quarantine_gpu", node_id, gpu_uuid, reason=reason, ticket_id=ticket_id)

    def release_gpu(self, node_id: str, gpu_uuid: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """`KubernetesQuarantine.release_gpu` in the child."""
        return self._call("release_gpu", node_id, gpu_uuid, reason=reason, ticket_id=ticket_id)

    def quarantine_port(self, node_id: str, port: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """`KubernetesQuarantine.quarantine_port` in the child."""
        return self._call("quarantine_port", node_id, port, reason=reason, ticket_id=ticket_id)

    def release_port(self, node_id: str, port: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """`KubernetesQuarantine.release_port` in the child."""
        return self._call("release_port", node_id, port, reason=reason, ticket_id=ticket_id)

    def mark_rma(self, node_id: str, *, reason: str, ticket_id: str) -> QuarantineOutcome:
        """`KubernetesQuarantine.mark_rma` in the child."""
        return self._call("mark_rma", node_id, reason=reason, ticket_id=ticket_id)

    def drain_node(
        self, node_id: str, *, reason: str, ticket_id: str, pods: str, deadline_s: float
    ) -> k8s_drain.DrainReport:
        """`KubernetesQuarantine.drain_node` in the child."""
        return self._call("drain_node", node_id, reason=reason, ticket_id=ticket_id, pods=pods, deadline_s=deadline_s)

    def sync_nodes(self, node_ids: Iterable[str]) -> dict[str, dict[str, str]]:
        """`KubernetesQuarantine.sync_nodes` in the child."""
        return self._call("sync_nodes", list(node_ids))

    def heartbeat(self, node_ids: Iterable[str]) -> int:
        """`KubernetesQuarantine.heartbeat` in the child."""
        return self._call("heartbeat", list(node_ids))

    def close(self) -> None:
        """Ask the child to finish (after the calls in flight and the Events queued) and wait for it."""
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    self._conn.send_bytes(b"")
            self._reap()

    # ---- the parent's side of the socket ------------------------------------------------------

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Send one call, wait for its answer (without the GIL); its value, or what it raised."""
        pending = _Pending()
        with self._lock:
            self._ensure_started()
            self._send(method, args, kwargs, pending)
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.value

    def _send(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], pending: _Pending) -> None:
        """Send one call to the running child; its answer settles pending. Under the lock."""
        assert self._conn is not None
        call_id = next(self._ids)
        self._pending[call_id] = pending
        try:
            self._conn.send_bytes(pickle.dumps((call_id, method, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL))
        except OSError as exc:
            self._pending.pop(call_id, None)
            raise QuarantineUnavailableError(f"{method}: the Kubernetes adapter process is gone: {exc}") from exc

    def _running(self) -> bool:
        """Whether a child runs whose socket is open. Under the lock."""
        alive = self._process is not None and self._process.poll() is None and not self._lost.is_set()
        return self._conn is not None and alive

    def _ensure_started(self) -> multiprocessing.connection.Connection:
        """The running child's connection; a new child (and its answer reader) if none runs. Under the lock."""
        if self._running():
            assert self._conn is not None
            return self._conn
        self._reap()
        process, conn = child_process.spawn("rasd.controller.executors.quarantine.k8s_child")
        self._process, self._conn = process, conn
        try:
            conn.send_bytes(pickle.dumps(self._settings))
            if not conn.poll(START_TIMEOUT_S):
                raise QuarantineUnavailableError(
                    f"the Kubernetes adapter process did not start within {START_TIMEOUT_S:.0f} s"
                )
            status, value = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError) as exc:
            self._reap()
            why = exc or "EOF"
            raise QuarantineUnavailableError(f"the Kubernetes adapter process exited while starting ({why})") from exc
        except BaseException:
            self._reap()
            raise
        if status != "ready":
            self._reap()
            raise value
        self._pending, self._lost = {}, threading.Event()
        reader = threading.Thread(
            target=_read_answers,
            args=(conn, self._pending, self._lost, self._lock),
            name="rasd-k8s-answers",
            daemon=True,
        )
        reader.start()
        self.started += 1
        return conn

    def _reap(self) -> None:
        """Wait for the child to end (killed after `STOP_TIMEOUT_S`), then close the socket.

        In that order: answers the child sends while it finishes still reach their calls.
        """
        if self._process is not None:
            try:
                self._process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(STOP_TIMEOUT_S)
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None


def _read_answers(
    conn: multiprocessing.connection.Connection,
    pending: dict[int, _Pending],
    lost: threading.Event,
    lock: threading.Lock,
) -> None:
    """Hand each answer to its waiting call; when the child is gone, say so and fail the calls waiting on it.

    Under lock (`KubernetesProcess._lock`): no call can join pending once lost is set.
    """
    while True:
        try:
            call_id, status, value = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            break
        waiting = pending.pop(call_id, None)
        if waiting is not None:
            waiting.settle(status, value)
    error = QuarantineUnavailableError("the Kubernetes adapter process exited during the call")
    with lock:
        lost.set()
        while pending:
            _call_id, waiting = pending.popitem()
            waiting.settle("error", error)


def _still_open(opening: asyncio.Task[_Channel]) -> bool:
    """Whether an opening (done) gave a channel that is still open."""
    channel = _opened(opening)
    return channel is not None and not channel.closed


def _opened(opening: asyncio.Task[_Channel]) -> _Channel | None:
    """The channel an opening gave; None while it runs, or if it failed."""
    if not opening.done() or opening.cancelled() or opening.exception() is not None:
        return None
    return opening.result()


class _Pending:
    """One call of a thread waiting for its answer."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def settle(self, status: str, value: Any) -> None:
        self.value, self.error = _answer(status, value)
        self.done.set()


def _answer(status: str, value: Any) -> tuple[Any, BaseException | None]:
    """An answer's value and error."""
    if status == "ok":
        return value, None
    return None, value if isinstance(value, BaseException) else RuntimeError(str(value))


class _Channel:
    """One event loop's socket to the child: calls written and answers read by that loop, no thread.

    The child frames its answers as `multiprocessing.connection.Connection` does (a 4-byte signed
    big-endian length; -1 and an 8-byte one for the huge), and reads the calls framed the same way.
    When the socket closes (the child died or the loop ended), the calls waiting fail as unavailable.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        forget: Callable[[_Channel], None],
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._forget = forget
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self.closed = False
        self._answers = asyncio.get_running_loop().create_task(self._read_answers(), name="rasd-k8s-answers")

    async def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.closed:
            raise QuarantineUnavailableError(f"{method}: the Kubernetes adapter process is gone")
        call_id = next(self._ids)
        message = pickle.dumps((call_id, method, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        answer = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = answer
        try:
            self._writer.write(struct.pack("!i", len(message)) + message)
            return await answer
        finally:
            self._waiting.pop(call_id, None)

    async def _read_answers(self) -> None:
        """Hand each answer to its call until the socket closes; then fail the calls still waiting."""
        try:
            while True:
                (size,) = struct.unpack("!i", await self._reader.readexactly(4))
                if size == -1:
                    (size,) = struct.unpack("!Q", await self._reader.readexactly(8))
                call_id, status, value = pickle.loads(await self._reader.readexactly(size))
                answer = self._waiting.get(call_id)
                if answer is None or answer.done():
                    continue  # its caller was cancelled
                result, error = _answer(status, value)
                if error is not None:
                    answer.set_exception(error)
                else:
                    answer.set_result(result)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self.closed = True
            self._writer.close()
            self._forget(self)
            error = QuarantineUnavailableError("the Kubernetes adapter process exited during the call")
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(error)


# --------------------------------------------------------------------------------------------
# The child


def serve(conn: multiprocessing.connection.Connection) -> None:
    """The child: one `KubernetesQuarantine`, calls run in threads, until an empty message or the parent is gone."""
    rasd_logging.configure_child()  # at the parent's --log-level
    try:
        settings = pickle.loads(conn.recv_bytes())
        events = concurrent.futures.ThreadPoolExecutor(EVENT_THREADS, "rasd-k8s-events")
        adapter = k8s.KubernetesQuarantine(
            k8s.api_client(settings, "quarantine.kubernetes."), settings, post_later=events.submit
        )
    except (EOFError, OSError):
        return
    except Exception as exc:
        conn.send_bytes(child_process.pickled("error", exc))
        return
    conn.send_bytes(pickle.dumps(("ready", None)))
    sending = {conn: threading.Lock()}
    """Each socket's lock: one answer at a time on it (and none once it is closed)."""
    calls = concurrent.futures.ThreadPoolExecutor(CALL_THREADS, "rasd-k8s-calls")
    long_calls = concurrent.futures.ThreadPoolExecutor(LONG_CALL_THREADS, "rasd-k8s-long-calls")

    def run(
        to: multiprocessing.connection.Connection,
        call_id: int,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        try:
            if method not in CALLS:
                raise ValueError(f"not a method of the Kubernetes adapter: {method!r}")
            value = getattr(adapter, method)(*args, **kwargs)
            _log_call(method, args, kwargs, value)
            reply = child_process.pickled(call_id, "ok", value)
        except Exception as exc:
            reply = child_process.pickled(call_id, "error", exc)
        try:
            with sending[to]:
                to.send_bytes(reply)
        except OSError:
            log.warning("kubernetes_answer_lost", call=method, why="its caller is gone")

    while _serve_messages(conn, sending, run, calls, long_calls):
        pass
    for pool in (calls, long_calls, events):
        pool.shutdown(wait=True)
    adapter.close()
    for channel in sending:
        channel.close()


def _log_call(method: str, args: tuple[Any, ...], kwargs: dict[str, Any], value: Any) -> None:
    """The audit line `executors` writes in-process, written here for a call the child carried out."""
    if isinstance(value, QuarantineOutcome) and method.startswith(("quarantine_", "release_")):
        log_executed("release" if method.startswith("release_") else method, value)
    elif method == "drain_node":
        log_drained(args[0], kwargs["ticket_id"], value)


def _serve_messages(
    conn: multiprocessing.connection.Connection,
    sending: dict[multiprocessing.connection.Connection, threading.Lock],
    run: Any,
    calls: concurrent.futures.ThreadPoolExecutor,
    long_calls: concurrent.futures.ThreadPoolExecutor,
) -> bool:
    """Take the messages ready on the first socket and the channels; False once the parent is gone or says stop."""
    for ready in multiprocessing.connection.wait(list(sending)):
        assert isinstance(ready, multiprocessing.connection.Connection)
        try:
            message = ready.recv_bytes()
        except (EOFError, OSError):
            message = b""
        if not message:
            if ready is conn:
                return False  # the parent is gone, or closes the adapter
            with sending.pop(ready):  # a loop's channel closed: its answers in flight are lost with it
                ready.close()
            continue
        call_id, method, args, kwargs = pickle.loads(message)
        if method == CHANNEL and ready is conn:
            channel = multiprocessing.connection.Connection(multiprocessing.reduction.recv_handle(conn))
            sending[channel] = threading.Lock()
            continue
        (long_calls if method in LONG_CALLS else calls).submit(run, ready, call_id, method, args, kwargs)
    return True
