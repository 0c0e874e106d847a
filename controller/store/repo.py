"""The controller's store: every read and write the controller makes to SQL goes through `Store`.

Blocking (SQLAlchemy sync engine); the async service calls it from one dedicated writer thread so
writes are serialized and the event loop never blocks on I/O. Any SQLAlchemy URL works; SQLite gets
WAL mode so admin reads do not block ingest. Methods take and return core values, never ORM rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.orm import Session, sessionmaker

from rasd.controller.core import fleet
from rasd.controller.store import file_identity, migrate, paging, schema, write_probe


class WriterLost(Exception):
    """The store writer process (`rasd.controller.store.writer`) died during a call: a store outage."""


STORE_UNAVAILABLE: tuple[type[Exception], ...] = (
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    WriterLost,
    file_identity.StoreFileLost,
    write_probe.StoreUnwritable,
)
"""What a store call raises while the database is unreachable, restarting or locked: nothing of the
call was committed, and the same call can succeed later (the pool's pre-ping replaces dead connections;
a SQLite file deleted under the controller needs its restart; a PostgreSQL that refuses writes is
probed until it takes them again, `write_probe`)."""

_FILE_IDENTITIES: weakref.WeakKeyDictionary[sa.Engine, file_identity.SqliteFileIdentity] = weakref.WeakKeyDictionary()


_WRITE_PROBES: weakref.WeakKeyDictionary[sa.Engine, write_probe.WriteProbe] = weakref.WeakKeyDictionary()


def probe_writes(engine: sa.Engine) -> str | None:
    """Run engine's write probe (PostgreSQL; blocking): why its store refuses writes, or None.

    None too for engines without a probe (SQLite: its writes fail as they happen, and its file is
    watched by `file_problem`). While the probe fails, the engine's transactions are refused.
    """
    probe = _WRITE_PROBES.get(engine)
    return probe.run() if probe is not None else None


def write_probe_of(engine: sa.Engine) -> write_probe.WriteProbe | None:
    """engine's write probe (PostgreSQL engines of `create_engine`), or None."""
    return _WRITE_PROBES.get(engine)


def file_problem(engine: sa.Engine) -> str | None:
    """Why engine's SQLite file is no longer the one it opened (deleted, replaced); None if it is, or not a file."""
    identity = _FILE_IDENTITIES.get(engine)
    return identity.problem() if identity is not None else None


@dataclasses.dataclass(frozen=True)
class StoredEvent:
    """A health event as stored, with the wire values kept as plain data."""

    node_id: str
    seq: int
    observed_unix_ns: int
    received_unix_ns: int
    kind: int
    severity: int
    gpu_uuid: str
    xid: int | None
    message: str
    source: str
    attributes: Mapping[str, str]
    spool_epoch: int | None = None
    """The epoch of the node's spool its seq counts in (`HelloOutcome.spool_epoch`): set for events from a
    stream (its Hello's epoch) and from the store; None where it is not known (taken to be the node's
    current epoch)."""


def controller_event(
    node_id: str,
    kind: int,
    severity: int,
    *,
    now_unix_ns: int,
    message: str,
    source: str,
    gpu_uuid: str = "",
    attributes: Mapping[str, str] | None = None,
) -> StoredEvent:
    """An event the controller itself raises (an accusation, a straggler's rung, a lost node) for the ladder.

    Seq 0: it is no agent's spool entry, so it is decided, never acked or stored as one.
    """
    return StoredEvent(
        node_id=node_id,
        seq=0,
        observed_unix_ns=now_unix_ns,
        received_unix_ns=now_unix_ns,
        kind=kind,
        severity=severity,
        gpu_uuid=gpu_uuid,
        xid=None,
        message=message,
        source=source,
        attributes=dict(attributes or {}),
    )


class SpoolEpochChanged(Exception):
    """A batch of events counts its seqs in a spool epoch the node has left: a newer Hello started another.

    Its stream was replaced (the node's agent came back with a new spool); stored now, its old seqs
    would be taken for the new spool's and the new spool's events with those seqs dropped as duplicates.
    """


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSighting:
    """When a node was last heard from by any replica, and its stored state (`Store.silent_nodes`)."""

    node_id: str
    last_seen_unix_ns: int
    state: fleet.ComponentState


@dataclasses.dataclass(frozen=True)
class ExpectedAppend:
    """A node's events that a caller expects `append_events` to store every one of, and where that leaves the node.

    The decision on events that have just arrived is written in the transaction that stores them
    (`plan_expected`, `write_appends`): one sync of the disk for both instead of one each. It is decided before
    that transaction can say which of them are new, so the caller states what it expects from
    what the stream told it (the node's acked position at Hello and since, the stream's spool
    epoch), and the transaction checks it: anything else (a resend, an event another stream stored
    first, a spool the node has left, a node the store does not know) rolls it all back.
    """

    node_id: str
    events: tuple[StoredEvent, ...]
    """Seqs acked_seq - len(events) + 1 ... acked_seq of one spool epoch, each once."""
    acked_seq: int
    """The node's acked position once they are stored, at least: their highest seq."""


class EventsNotAsExpected(Exception):
    """Storing arriving events gave another outcome than the caller expected (`ExpectedAppend`): nothing was written."""


class GpuClaimRefused(Exception):
    """A Hello lists a GPU that another node's last Hello listed: a claim alone never moves a GPU.

    A GPU changes node only on evidence that it moved: its node's own Hello leaves it out, or an
    operator says so (`Store.forget_gpu_owner`). Before, a node's Hello that named an offline
    node's GPUs took them, its fatal events on them were acted on, and the real owner was then
    refused as the impostor.
    """

    def __init__(self, field: str, gpu_uuid: str, owner: str) -> None:
        self.problem = (
            f"GPU {gpu_uuid} belongs to node {owner}, whose last Hello listed it; it moves only once "
            f"{owner}'s Hello leaves it out or an operator forgets its owner (rasctl gpu forget-owner)"
        )
        super().__init__(f"{field}: {self.problem}")
        self.field = field
        self.gpu_uuid = gpu_uuid
        self.owner = owner


HelloArrival = tuple[fleet.NodeHello, int] | tuple[fleet.NodeHello, int, bool]
"""A Hello, when it arrived (unix ns) and, optionally, whether it was certified (`Store.register_hello`)."""


@dataclasses.dataclass(frozen=True)
class HelloOutcome:
    """What registering a Hello decided about the node's event spool."""

    acked_seq: int
    spool_reset: bool
    rebooted: bool
    lost_seqs: tuple[int, int] | None = None
    """(first, last) seqs the agent had had acked and dropped that the store does not hold: its last
    acks were lost (a restore from backup, a failover to a standby behind the primary)."""
    spool_epoch: int = 0
    """The epoch the node's seqs count in from this Hello on (a new spool starts the next one)."""


IDS_PER_QUERY = 500
"""Ids to one ``IN`` list where a read names rows by id (`rows_for_ids`): bounded bound values per statement."""


def rows_for_ids(
    run: Callable[[sa.Select[Any]], Iterable[Any]],
    query: sa.Select[Any],
    column: Any,
    ids: Sequence[str],
    per_query: int,
) -> list[Any]:
    """The rows of query whose column is one of ids, per_query ids to an ``IN`` list (bounded bound values).

    run: executes a query (``session.scalars`` for ORM rows, ``connection.execute`` for plain ones).
    """
    return [
        row
        for first in range(0, len(ids), per_query)
        for row in run(query.where(column.in_(ids[first : first + per_query])))
    ]


def json_text(value: Any) -> str:
    """The JSON text the store writes for a JSON column (the engines' serializer).

    orjson, not the standard library: a remediation burst writes tens of megabytes of ladder
    states, incidents and outbox payloads, and the standard encoder was a quarter of the store
    thread's time (and holds the GIL the decision thread needs). Keys that are not strings become
    strings, as the standard encoder makes them. Non-finite floats become null (valid JSON on both
    backends; PostgreSQL refuses the standard encoder's NaN); the wire and telemetry checks refuse
    them before they get here.
    """
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS).decode()


def _json_default(value: Any) -> Any:
    """Numbers orjson does not take as they are (numpy scalars, int and float subclasses)."""
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    item = getattr(value, "item", None)  # a numpy scalar
    if callable(item) and type(value).__module__ == "numpy":
        return item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def create_engine(url: str) -> sa.Engine:
    """An engine for url; SQLite files get WAL and a busy timeout; JSON columns are written by `json_text`."""
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as exc:  # ValueError: e.g. a port that is not a number
        raise ValueError(f"--db {_redact_unparsed(url)!r} is not a SQLAlchemy URL: {exc}") from None
    if parsed.get_backend_name() == "sqlite":
        engine = sa.create_engine(
            url,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
            json_serializer=json_text,
        )
        identity = None
        if parsed.database not in (None, "", ":memory:"):
            identity = file_identity.SqliteFileIdentity(str(parsed.database))
            _FILE_IDENTITIES[engine] = identity

            @sa_event.listens_for(engine, "begin")
            def _same_file(_connection: sa.Connection) -> None:
                identity.check()  # a stat (~2 us): never commit, nor ack, into a deleted file

        @sa_event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            if parsed.database not in (None, "", ":memory:"):
                cursor.execute("PRAGMA journal_mode=WAL")
                # FULL: a commit syncs the log before it returns. An agent drops an event from its
                # spool once the controller acks it, and an agent's command log keeps the ids it
                # ran: an ack or a dispatched command must outlive the controller host's crash or
                # power loss (DESIGN.md invariants 2 and 3), as PostgreSQL's synchronous_commit
                # and the agent's own spool (FULL) make sure. NORMAL would sync only at a
                # checkpoint, and a crash could roll back what an agent was told was durable.
                cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()
            if identity is not None:
                identity.note_opened()

        return engine
    if parsed.get_backend_name() != "postgresql":
        return sa.create_engine(url, pool_pre_ping=True, json_serializer=json_text)
    engine = _postgres_engine(url, pool_pre_ping=True)
    probe = write_probe.WriteProbe(_postgres_engine(url, poolclass=sa.pool.NullPool))
    _WRITE_PROBES[engine] = probe

    @sa_event.listens_for(engine, "begin")
    def _writable(_connection: sa.Connection) -> None:
        probe.check()  # while the last write probe failed, nothing is committed, nor acked

    return engine


def _postgres_engine(url: str, **options: Any) -> sa.Engine:
    """A PostgreSQL engine with the store's client and session settings; a refused write raises StoreUnwritable."""
    parsed = sa.engine.make_url(url)
    client = {name: value for name, value in POSTGRES_CLIENT_SETTINGS.items() if name not in parsed.query}
    engine = sa.create_engine(url, json_serializer=json_text, connect_args=client, **options)
    sa_event.listen(engine, "handle_error", write_probe.raise_unwritable)
    # Settings the URL's own `options` name are the operator's: kept.
    session = {name: value for name, value in POSTGRES_SESSION_SETTINGS.items() if name not in url}

    @sa_event.listens_for(engine, "connect")
    def _postgres_session(dbapi_connection: Any, _record: Any) -> None:
        if not session:
            return
        calls = ", ".join("set_config(%s, %s, false)" for _ in session)
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SELECT {calls}", [part for item in session.items() for part in item])
        dbapi_connection.commit()

    return engine


def with_session_setting(url: str, name: str, value: str) -> str:
    """url with a PostgreSQL server setting added to libpq's ``options`` (``-c name=value``).

    A URL that already names the setting is returned as it is: the operator's wins, as in
    `create_engine`. Other backends' URLs are returned as they are.
    """
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "postgresql" or name in url:
        return url
    options = str(parsed.query.get("options", ""))
    added = f"-c {name}={value}"
    parsed = parsed.update_query_dict({"options": f"{options} {added}" if options else added})
    return parsed.render_as_string(hide_password=False)


POSTGRES_SESSION_SETTINGS = {
    # A client that stops inside a transaction (its host lost power, a partition: no FIN reaches
    # the server) keeps the transaction's locks until the server gives up on it. Among them the
    # lease row's shared lock that every fenced commit takes: a takeover waited behind it without
    # bound. No transaction of rasd waits on its client for seconds; a hung or dead one is ended.
    "idle_in_transaction_session_timeout": "10s",
    # The server notices a vanished client in ~25 s rather than the kernel's two hours.
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
}
"""Server settings every PostgreSQL session of the store starts with (`set_config` at connect)."""

POSTGRES_CLIENT_SETTINGS = {
    # libpq's: a connect or a server that vanished fails in seconds, so a leader's renewal that
    # cannot reach the database fails (and it steps down) instead of hanging for minutes.
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
"""libpq connection parameters of the store's PostgreSQL connections (a URL's own query wins)."""


WAL_CHECKPOINT_AFTER_BYTES = 4 * 1024 * 1024
"""How much of the write-ahead log gathers before `WalCheckpointer` copies it into the database
(SQLite's own automatic checkpoint runs at 1,000 pages, 4 MiB at the default page size)."""

WAL_TRUNCATE_ABOVE_BYTES = 64 * 1024 * 1024
"""The WAL file size past which `WalCheckpointer` truncates it (a TRUNCATE checkpoint).

A PASSIVE checkpoint copies the log into the database, and the next commit writes the log again
from its start, but the file keeps the largest size it ever had: a burst while a reader held an
old snapshot (so no checkpoint could catch up) left a 373 MB WAL that was never given back while
the controller ran. Sixteen times the checkpoint threshold: a steady store never reaches it."""

WAL_TRUNCATE_EVERY_S = 10.0
"""At most how often a truncation is tried. It is tried only while the store is idle (no commit since
the last look, the whole log already copied into the database), and one that finds a reader in the
log gives up at once (`WAL_TRUNCATE_BUSY_MS`) and is tried again this much later."""

WAL_TRUNCATE_BUSY_MS = 0
"""How long a TRUNCATE checkpoint waits for readers and the writer. While it waits it holds new writers
back: at 200 ms, the tries during a remediation burst (whose WAL passed the bound) made the
decision p99 73-162 ms against 27-46 ms without them (bench/remediation.py, sqlite, on a quiet
machine). So it never waits, and is tried only when no commit is under way."""

SQLITE_BUSY_TIMEOUT_S = 30
"""How long a SQLite connection of the store waits for another's lock before it fails (busy)."""

# The wal-index header at the start of the -shm file (https://www.sqlite.org/walformat.html §2.1),
# in the machine's byte order: two copies of WalIndexHdr (48 bytes each), then WalCkptInfo.
_SHM_HEADER_BYTES = 136
_SHM_CHANGE_AT = 8  # WalIndexHdr.iChange, u32: counts the write transactions
_SHM_PAGE_SIZE_AT = 14  # WalIndexHdr.szPage, u16 (1 means 65,536)
_SHM_MAX_FRAME_AT = 16  # WalIndexHdr.mxFrame, u32: frames in the log
_SHM_BACKFILL_AT = 96  # WalCkptInfo.nBackfill, u32: frames already copied into the database


class WalIndex:
    """Reads how much of a SQLite file's write-ahead log is not yet checkpointed, from its wal-index.

    The wal-index header in the ``-shm`` file says it without a lock and without touching the
    database (the only other way to learn it, ``PRAGMA wal_checkpoint``, checkpoints).

    The ``-shm`` file stays open until `close`, read with ``pread``: closing any descriptor of a
    file drops every POSIX lock this process holds on it, SQLite's own included (its write lock
    and its claim on the shared index). Opening and closing the file for each read let another
    process write while this one held the write lock (seen with the commit writer process, found
    by its tests). Close it only once this process's connections to the database are closed.
    """

    def __init__(self, database_path: str) -> None:
        """Nothing is opened until the first read (the ``-shm`` file appears with the first connection)."""
        self._path = f"{database_path}-shm"
        self._fd: int | None = None

    def pending_bytes(self) -> int | None:
        """Bytes of the log not yet copied into the database.

        None when there is no readable header (no WAL yet, or the two copies differ because a writer
        is updating it): the caller should checkpoint, which is always safe.
        """
        frames = self.frames()
        return None if frames is None else unbackfilled_bytes(frames)

    def frames(self) -> tuple[int, int, int, int] | None:
        """The write transactions counter, the page size, the frames in the log and those already copied.

        None when there is no readable header (see `pending_bytes`). The counter changes with every
        commit (the frame count alone may come back to the same value after the log restarts).
        """
        try:
            if self._fd is None:
                self._fd = os.open(self._path, os.O_RDONLY)
            header = os.pread(self._fd, _SHM_HEADER_BYTES, 0)
        except OSError:
            return None
        if len(header) < _SHM_HEADER_BYTES or header[:48] != header[48:96]:
            return None
        page_size = int.from_bytes(header[_SHM_PAGE_SIZE_AT : _SHM_PAGE_SIZE_AT + 2], sys.byteorder)
        max_frame = int.from_bytes(header[_SHM_MAX_FRAME_AT : _SHM_MAX_FRAME_AT + 4], sys.byteorder)
        backfilled = int.from_bytes(header[_SHM_BACKFILL_AT : _SHM_BACKFILL_AT + 4], sys.byteorder)
        change = int.from_bytes(header[_SHM_CHANGE_AT : _SHM_CHANGE_AT + 4], sys.byteorder)
        return change, (65536 if page_size == 1 else page_size), max_frame, backfilled

    def close(self) -> None:
        """Close the ``-shm`` descriptor (after this process's connections to the database are closed)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def unbackfilled_bytes(frames: tuple[int, int, int, int]) -> int:
    """Bytes of the log not yet copied into the database, from one `WalIndex.frames` reading."""
    _change, page_size, max_frame, backfilled = frames
    return max(0, max_frame - backfilled) * page_size


def without_autocheckpoint(engine: sa.Engine) -> bool:
    """Turn off checkpointing on commit for engine's new connections, if it is a SQLite file; returns whether it is.

    The file is then checkpointed by a `WalCheckpointer` (one per file: the controller's).
    """
    url = engine.url
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return False

    @sa_event.listens_for(engine, "connect")
    def _no_autocheckpoint(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA wal_autocheckpoint=0")
        cursor.close()

    return True


class WalCheckpointer:
    """Checkpoints a SQLite file's write-ahead log from its own thread, so that no commit has to.

    By default the connection whose commit takes the WAL past 1,000 pages copies it into the
    database and syncs it there and then: in a remediation burst that was a stall of tens of
    milliseconds every few commits, on the path from event to dispatch. This store's connections
    turn that off, and a PASSIVE checkpoint (it never blocks a writer or a reader) runs here once
    ``checkpoint_after_bytes`` have gathered, looked at every ``interval_s``.

    Why not checkpoint whatever is there each time: a checkpoint that catches up makes the next
    commit restart the log, and restarting syncs the new log header from that commit's connection.
    With a checkpoint every half second, a quiet controller synced on its commit path twice a
    second, and on a disk busy with other writes (the first ``make demo`` after a fresh clone's
    pip install) one sync took 80 to 800 ms, a decision's dispatch waiting behind it. Waiting for
    4 MiB makes that one restart per 4 MiB written. Durability is unchanged: a commit is synced into
    the WAL (``synchronous=FULL``) either way.

    A log restarted from its start keeps its file's size, so a WAL file past ``truncate_above_bytes``
    is emptied by a TRUNCATE checkpoint, tried at most every ``truncate_every_s`` and only while no
    commit came since the last look and the log is all copied (`WAL_TRUNCATE_BUSY_MS`): the file
    stays bounded while the controller runs, and no burst of commits waits for it.
    """

    def __init__(
        self,
        engine: sa.Engine,
        interval_s: float = 0.5,
        checkpoint_after_bytes: int = WAL_CHECKPOINT_AFTER_BYTES,
        truncate_above_bytes: int = WAL_TRUNCATE_ABOVE_BYTES,
        truncate_every_s: float = WAL_TRUNCATE_EVERY_S,
    ) -> None:
        """Start watching engine's database every interval_s (call `stop` to end it)."""
        self._engine = engine
        self._interval_s = interval_s
        self._checkpoint_after_bytes = checkpoint_after_bytes
        self._truncate_above_bytes = truncate_above_bytes
        self._truncate_every_s = truncate_every_s
        self._wal_path = (engine.url.database or "") + "-wal"
        self._truncate_tried_s = float("-inf")
        self._index = WalIndex(engine.url.database or "")
        self.checkpoints = 0
        """Checkpoints run so far (for tests and diagnostics)."""
        self.truncations = 0
        """TRUNCATE checkpoints that emptied the WAL file so far (for tests and diagnostics)."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rasd-wal-checkpoint", daemon=True)
        self._thread.start()

    @classmethod
    def for_engine(cls, engine: sa.Engine) -> WalCheckpointer | None:
        """A checkpointer for a SQLite file engine (its connections stop checkpointing); else None."""
        if not without_autocheckpoint(engine):
            return None
        engine.dispose()  # connections opened before (the migration's) are replaced by ones without it
        return cls(engine, truncate_above_bytes=WAL_TRUNCATE_ABOVE_BYTES)  # read now: bench/wal_size.py sets it

    def stop(self) -> None:
        """Stop the thread after a last checkpoint of everything in the log (then `close`)."""
        self._stopped.set()
        self._thread.join(timeout=10)
        self._checkpoint()

    def close(self) -> None:
        """Close the wal-index (`WalIndex.close`): after the engine's connections are closed."""
        self._index.close()

    def _run(self) -> None:
        seen: tuple[int, int, int, int] | None = None
        while not self._stopped.wait(self._interval_s):
            frames = self._index.frames()  # one read of the header a round, again only after a checkpoint
            if frames is None or unbackfilled_bytes(frames) >= self._checkpoint_after_bytes:
                self._checkpoint()
                frames = self._index.frames()
            idle, seen = frames is not None and frames == seen, frames
            if frames is None or not idle or self._wal_bytes() <= self._truncate_above_bytes:
                continue
            if unbackfilled_bytes(frames) != 0:
                self._checkpoint()  # idle now: copy the rest first, so the truncation itself copies nothing
                seen = None  # looked at again next round, when this checkpoint's count is seen
            elif self._truncate_due():
                self._checkpoint("TRUNCATE")

    def _wal_bytes(self) -> int:
        try:
            return os.stat(self._wal_path).st_size
        except OSError:
            return 0

    def _truncate_due(self) -> bool:
        now_s = time.monotonic()
        if now_s - self._truncate_tried_s < self._truncate_every_s:
            return False
        self._truncate_tried_s = now_s
        return True

    def _checkpoint(self, mode: str = "PASSIVE") -> None:
        """PASSIVE never waits; TRUNCATE waits up to `WAL_TRUNCATE_BUSY_MS` for readers, then empties the file."""
        if not os.path.exists(self._engine.url.database or ""):
            self._stopped.set()  # the file is gone (a test's temporary directory): connecting would recreate it
            return
        try:
            with self._engine.connect() as connection:
                if mode == "PASSIVE":
                    connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
                else:
                    connection.exec_driver_sql(f"PRAGMA busy_timeout = {WAL_TRUNCATE_BUSY_MS}")
                    try:
                        busy = connection.exec_driver_sql(f"PRAGMA wal_checkpoint({mode})").one()[0]
                    finally:
                        connection.exec_driver_sql(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_S * 1000}")
                    self.truncations += busy == 0
            self.checkpoints += 1
        except sa.exc.SQLAlchemyError:  # busy or closing: the next round checkpoints what is left
            pass
        except file_identity.StoreFileLost:
            self._stopped.set()  # replaced under us: the controller reports it (server._watch_store)


class Store:
    """Typed access to the controller's tables."""

    def __init__(self, engine: sa.Engine) -> None:
        """Bind to engine and bring its schema to head with the Alembic migrations.

        An empty database gets every table, one at head is untouched, an older one is upgraded.
        """
        self.engine = engine
        migrate.upgrade(engine)
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._checkpointer = WalCheckpointer.for_engine(engine)

    @property
    def reads_beside_writer(self) -> bool:
        """Whether reads may run on connections of their own beside the writer's.

        Not on in-memory SQLite: each connection of that is a database of its own.
        """
        url = self.engine.url
        return url.get_backend_name() != "sqlite" or url.database not in (None, "", ":memory:")

    @classmethod
    def open(cls, url: str) -> Store:
        """Open the store at a SQLAlchemy URL."""
        return cls(create_engine(url))

    def close(self) -> None:
        """Stop the WAL checkpointer (SQLite) and dispose of the connection pool."""
        if self._checkpointer is not None:
            self._checkpointer.stop()
        self.engine.dispose()
        if self._checkpointer is not None:
            self._checkpointer.close()

    # -- nodes and GPUs -----------------------------------------------------------------------------
    def register_hello(self, hello: fleet.NodeHello, now_unix_ns: int, certified: bool = False) -> HelloOutcome:
        """Upsert a node and its GPUs from Hello; decide the acked spool position to welcome it with.

        If the agent's spool head is behind what we acked, its spool started over (state dir lost):
        begin a new epoch at 0 so its new events are stored rather than dropped as duplicates.
        GPUs its Hello no longer lists stop being its own (another node's Hello may then list them).

        Args:
            hello: the node's Hello.
            now_unix_ns: when it arrived.
            certified: it came on a stream whose certificate names its node. Only then is another
                node's GPU it lists refused: without a certificate a Hello may name any node (the
                victim itself included), so the rule would protect nothing there.

        Raises:
            GpuClaimRefused: a certified Hello lists a GPU another node's last Hello listed; nothing
                is written.
        """
        (outcome,) = self.register_hellos([(hello, now_unix_ns, certified)])
        if isinstance(outcome, GpuClaimRefused):
            raise outcome
        return outcome

    def register_hellos(self, hellos: Sequence[HelloArrival]) -> list[HelloOutcome | GpuClaimRefused]:
        """`register_hello` for many (Hello, arrival time[, certified]) tuples in one transaction, in order.

        A reconnect storm (a controller restart, a failover) brings thousands of Hellos at once: one
        read of their nodes, one of their GPUs and one upsert of each, instead of an ORM round for
        every node (~2 ms per known node, ~5 ms per new one). A node that appears twice is
        registered twice, in order, as one by one would. A certified Hello that claims another
        node's GPU gets a `GpuClaimRefused` in its place, and nothing of it is written; the others are.
        """
        if not hellos:
            return []
        with self._sessions.begin() as session:
            conn = session.connection()
            node_ids = list(dict.fromkeys(arrival[0].node_id for arrival in hellos))
            gpu_uuids = list(dict.fromkeys(gpu.uuid for arrival in hellos for gpu in arrival[0].gpus))
            plan = _HelloPlan(known=_known_nodes(conn, node_ids), owners=_gpu_owners(conn, gpu_uuids, node_ids))
            outcomes: list[HelloOutcome | GpuClaimRefused] = []
            for arrival in hellos:
                try:
                    outcomes.append(
                        plan.welcome(arrival[0], arrival[1], certified=len(arrival) > 2 and bool(arrival[2]))
                    )
                except GpuClaimRefused as refused:
                    outcomes.append(refused)
            plan.write(session, conn)
            return outcomes

    def forget_gpu_owner(self, gpu_uuid: str, node_id: str) -> bool:
        """An operator says node_id's GPU left it: the next node whose Hello lists it owns it.

        False when the GPU is not node_id's. The GPU keeps its row: its state, a quarantine
        included, goes with it to its next node.
        """
        gpus = schema.GpuRow.__table__
        with self._sessions.begin() as session:
            forgotten = session.execute(
                sa.update(gpus).where(gpus.c.uuid == gpu_uuid, gpus.c.node_id == node_id).values(listed=False)
            )
            return bool(forgotten.rowcount)

    def mark_disconnected(self, node_id: str, now_unix_ns: int) -> None:
        """Record that a node's stream ended."""
        with self._sessions.begin() as session:
            node = session.get(schema.NodeRow, node_id)
            if node is not None:
                node.connected = False
                node.last_seen_unix_ns = now_unix_ns

    def mark_all_disconnected(self) -> None:
        """At start-up no stream is open on this replica yet."""
        with self._sessions.begin() as session:
            session.execute(sa.update(schema.NodeRow).values(connected=False))

    @contextlib.contextmanager
    def _cache_writes(self) -> Iterator[sa.Connection]:
        """A transaction of rows that copy memory (latest telemetry, sightings), committed without waiting for the disk.

        The ingest writes 16,384 GPU rows every 5 s at 2,048 nodes, in chunks: each chunk's commit
        waited for the disk (SQLite's ``synchronous=FULL``, there for acks and commands) on the
        store thread that the next event batch waits for (bench/scale.py). Such rows are rewritten
        by the next flush, so a crash may lose this transaction and nothing else: a later synced
        commit (SQLite FULL, PostgreSQL's synchronous_commit) makes the log durable up to itself,
        this transaction's frames with it. SQLite: NORMAL for this transaction only, FULL again before
        the connection goes back to the pool (or the connection is discarded). PostgreSQL:
        ``SET LOCAL synchronous_commit = off``, which ends with the transaction.
        """
        with self.engine.connect() as connection:
            sqlite = connection.dialect.name == "sqlite"
            try:
                if sqlite:
                    # Outside any transaction (the driver begins one at the first write). Inside the
                    # try: whatever fails from here on, FULL is set again below.
                    connection.exec_driver_sql("PRAGMA synchronous=NORMAL")
                    connection.commit()
                elif connection.dialect.name == "postgresql":
                    connection.exec_driver_sql("SET LOCAL synchronous_commit = off")
                yield connection
                connection.commit()
            finally:
                if connection.in_transaction():
                    connection.rollback()
                if sqlite:
                    try:
                        connection.exec_driver_sql("PRAGMA synchronous=FULL")
                        connection.commit()
                    except BaseException:
                        connection.invalidate()  # never back in the pool with commits that do not sync
                        raise

    def touch_nodes(self, last_seen: Mapping[str, int]) -> None:
        """Bulk-update last_seen for nodes that sent anything (never backwards: `_TOUCH_NODE`)."""
        if not last_seen:
            return
        with self._cache_writes() as connection:
            prepared(_TOUCH_NODE, connection.dialect).executemany(
                connection, [{"b_node_id": node_id, "b_last_seen": ts} for node_id, ts in last_seen.items()]
            )

    def silent_nodes(
        self, *, seen_since_unix_ns: int, silent_before_unix_ns: int, also: Collection[str] = ()
    ) -> tuple[list[NodeSighting], int]:
        """The lost-node watch's read (every 10 s): the nodes silent since before silent_before, and how many spoke.

        Returns the nodes last heard from between the two times (and those named in also, wherever they
        are), and how many nodes were heard from since seen_since. The filtering and the count run in
        the database: a few rows come back, not the fleet's (12,500 rows read into Python cost the
        leader's interpreter 60-120 ms a check).
        """
        nodes = schema.NodeRow.__table__
        seen = nodes.c.last_seen_unix_ns >= seen_since_unix_ns
        wanted = sa.and_(seen, nodes.c.last_seen_unix_ns <= silent_before_unix_ns)
        if also:
            wanted = sa.or_(wanted, nodes.c.node_id.in_(list(also)))
        with self._sessions() as session:
            rows = session.execute(
                sa.select(nodes.c.node_id, nodes.c.last_seen_unix_ns, nodes.c.state).where(wanted)
            ).all()
            count = session.execute(sa.select(sa.func.count()).select_from(nodes).where(seen)).scalar_one()
        return [
            NodeSighting(node_id, int(ls or 0), fleet.ComponentState(state or 0)) for node_id, ls, state in rows
        ], int(count)

    def node_labels(self, node_ids: Iterable[str]) -> dict[str, dict[str, str]]:
        """The stored labels of these nodes (unknown ids are left out)."""
        ids = list(node_ids)
        if not ids:
            return {}
        nodes = schema.NodeRow.__table__
        with self._sessions() as session:
            rows = session.execute(sa.select(nodes.c.node_id, nodes.c.labels).where(nodes.c.node_id.in_(ids))).all()
        return {node_id: dict(labels or {}) for node_id, labels in rows}

    def save_latest(self, latest: Mapping[str, fleet.GpuLatest]) -> None:
        """Bulk-write the latest telemetry of GPUs (rows exist since their node's Hello; `_SAVE_LATEST`)."""
        if not latest:
            return
        with self._cache_writes() as connection:
            prepared(_SAVE_LATEST, connection.dialect).executemany(
                connection,
                [
                    {
                        "b_uuid": uuid,
                        "b_power_w": value.power_w,
                        "b_power_ts": value.power_sample_unix_ns,
                        "b_limit": value.enforced_power_limit_w,
                        "b_temp": value.temperature_c,
                        "b_util": value.utilization_gpu_pct,
                        "b_reasons": value.clock_event_reasons,
                        "b_counters_ts": value.counters_unix_ns,
                    }
                    for uuid, value in latest.items()
                ],
            )

    def node_component_states(self, node_ids: Iterable[str]) -> dict[str, fleet.ComponentState]:
        """The stored lifecycle state of each of these nodes (one query; unknown ids are left out)."""
        ids = list(node_ids)
        if not ids:
            return {}
        with self._sessions() as session:
            rows = session.execute(
                sa.select(schema.NodeRow.node_id, schema.NodeRow.state).where(schema.NodeRow.node_id.in_(ids))
            )
            return {node_id: fleet.ComponentState(int(state)) for node_id, state in rows}

    def list_nodes(
        self, node_ids: Iterable[str] | None = None, *, after: str = "", limit: int | None = None
    ) -> list[fleet.NodeStatus]:
        """Every node (or the named ones) with GPUs and stored latest telemetry, sorted by id.

        after, limit: a page of them, the first `limit` nodes whose id sorts after `after`.
        """
        with self._sessions() as session:
            node_query = sa.select(schema.NodeRow).order_by(schema.NodeRow.node_id)
            gpu_query = sa.select(schema.GpuRow).order_by(schema.GpuRow.node_id, schema.GpuRow.pci_bus_id)
            if node_ids is not None:
                wanted = list(node_ids)
                node_query = node_query.where(schema.NodeRow.node_id.in_(wanted))
                gpu_query = gpu_query.where(schema.GpuRow.node_id.in_(wanted))
            if after:
                node_query = node_query.where(schema.NodeRow.node_id > after)
            if limit is not None:
                node_query = node_query.limit(limit)
            nodes = session.scalars(node_query).all()
            if not nodes:
                return []
            if limit is not None:  # the page's nodes' GPUs only
                gpu_query = gpu_query.where(
                    schema.GpuRow.node_id >= nodes[0].node_id, schema.GpuRow.node_id <= nodes[-1].node_id
                )
            gpus_by_node: dict[str, list[schema.GpuRow]] = {}
            for row in session.scalars(gpu_query):
                gpus_by_node.setdefault(row.node_id, []).append(row)
            return [_node_status(node, gpus_by_node.get(node.node_id, [])) for node in nodes]

    # -- health events ------------------------------------------------------------------------------
    def append_events(self, node_id: str, events: Sequence[StoredEvent]) -> tuple[int, list[int]]:
        """Store a node's events once each; return (acked_seq, the seqs newly stored, ascending).

        A seq already stored (a resend after a lost ack, a duplicated message) is skipped. The acked
        position only moves over a gap-free run of stored seqs: an event that arrives ahead of a
        missing one is stored but not yet acked, so a reordered or lossy sender is never told to
        drop an event the controller does not have. All in one transaction with the rows, so an ack
        never covers an event that is not durable.

        Raises:
            KeyError: the node never said Hello; nothing is stored.
            SpoolEpochChanged: the events name a spool epoch the node has left; nothing is stored.
        """
        (outcome,) = self.append_events_many([(node_id, events)])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def append_events_many(
        self, batches: Sequence[tuple[str, Sequence[StoredEvent]]]
    ) -> list[tuple[int, list[int]] | KeyError | SpoolEpochChanged]:
        """`append_events` for many (node, events) batches in one transaction, in order.

        In a burst every agent's stream brings its own small batch; one transaction (and one sync)
        each kept the store thread busy ~1.5 ms a batch, under 700 batches a second. Here the group
        costs one locked read of its nodes, one read of what they stored ahead of their acked
        positions, one multi-row insert and one update of the positions that moved. A batch of a
        node that never said Hello gets a KeyError in its place; the others are stored. A node that
        appears twice is appended twice, in order, as one by one would. A batch whose events name
        another spool epoch than the node's gets a `SpoolEpochChanged`.
        """
        if not batches:
            return []
        with self._sessions.begin() as session:
            return append_events_in(session, batches)

    def warm_up_events(self) -> None:
        """Store an event for a made-up node, then roll it all back: nothing is written.

        The first `append_events` of a process otherwise compiles its statements: 12 ms in
        `make demo`, where it delayed the first fault's decision by as much (its latency counts
        from the event's arrival).
        """
        node_id = "rasd-warm-up"
        with rolled_back(self._sessions) as session:
            session.add(schema.NodeRow(node_id=node_id))
            session.flush()
            event = StoredEvent(node_id, 1, 0, 0, 0, 0, "", None, "", "", {})
            append_events_in(session, [(node_id, [event])])
            session.flush()

    def list_events(self, *, node_id: str = "", since_unix_ns: int = 0, limit: int = 100) -> list[StoredEvent]:
        """Stored events, newest first (up to limit, however large: for the controller's own reads and tests)."""
        return self.events_page(node_id=node_id, since_unix_ns=since_unix_ns, limit=limit, max_bytes=None).items

    def events_page(
        self,
        *,
        node_id: str = "",
        since_unix_ns: int = 0,
        after: paging.Position | None = None,
        limit: int = 100,
        max_bytes: int | None = None,
    ) -> paging.Page[StoredEvent]:
        """One page of stored events, newest first, after the position a previous page ended at (`paging`)."""
        events = schema.HealthEventRow
        with self._sessions() as session:
            query = sa.select(events).where(events.received_unix_ns >= since_unix_ns)
            if node_id:
                query = query.where(events.node_id == node_id)
            return paging.read_page(
                session, query, order=events.received_unix_ns, key=events.id, after=after, limit=limit,
                max_bytes=max_bytes, convert=_listed_event, size_of=event_bytes,
            )  # fmt: skip

    def count_events(self) -> int:
        """How many health events are stored in total."""
        with self._sessions() as session:
            return int(session.scalar(sa.select(sa.func.count()).select_from(schema.HealthEventRow)) or 0)


def _listed_event(r: schema.HealthEventRow) -> StoredEvent:
    return StoredEvent(
        node_id=r.node_id,
        seq=r.seq,
        observed_unix_ns=r.observed_unix_ns,
        received_unix_ns=r.received_unix_ns,
        kind=r.kind,
        severity=r.severity,
        gpu_uuid=r.gpu_uuid,
        xid=r.xid,
        message=r.message,
        source=r.source,
        attributes=dict(r.attributes or {}),
    )


def event_bytes(event: StoredEvent) -> int:
    """About what a stored event takes in a ListEvents answer: its text, and 64 bytes for the rest."""
    attributes = sum(paging.text_bytes(k, v) + 4 for k, v in event.attributes.items())
    return 64 + paging.text_bytes(event.node_id, event.gpu_uuid, event.message, event.source) + attributes


def _known_nodes(conn: sa.Connection, node_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The stored identity and spool position of the nodes named (those the store knows)."""
    nodes_t = _NODES
    query = sa.select(
        nodes_t.c.node_id,
        nodes_t.c.boot_id,
        nodes_t.c.state,
        nodes_t.c.first_seen_unix_ns,
        nodes_t.c.spool_epoch,
        nodes_t.c.acked_seq,
        nodes_t.c.spool_id,
    )
    rows = rows_for_ids(conn.execute, query, nodes_t.c.node_id, node_ids, IDS_PER_QUERY)
    return {row.node_id: dict(row._mapping) for row in rows}


def _gpu_owners(conn: sa.Connection, gpu_uuids: Sequence[str], node_ids: Sequence[str]) -> dict[str, tuple[str, bool]]:
    """GPU → (its node, whether that node's last Hello listed it): the GPUs named and those of the nodes named.

    Locked (PostgreSQL) in uuid order, so that two replicas' groups cannot both take one GPU.
    """
    gpus = schema.GpuRow.__table__
    query = sa.select(gpus.c.uuid, gpus.c.node_id, gpus.c.listed).order_by(gpus.c.uuid).with_for_update()
    owners: dict[str, tuple[str, bool]] = {}
    for column, values in ((gpus.c.uuid, gpu_uuids), (gpus.c.node_id, node_ids)):
        rows = rows_for_ids(conn.execute, query, column, values, IDS_PER_QUERY)
        owners.update({row.uuid: (row.node_id, bool(row.listed)) for row in rows})
    return owners


@dataclasses.dataclass
class _HelloPlan:
    """The rows a group of Hellos writes, worked out Hello by Hello in order (`Store.register_hellos`)."""

    known: dict[str, dict[str, Any]]
    """Node → its row as stored before the group."""
    owners: dict[str, tuple[str, bool]] = dataclasses.field(default_factory=dict)
    """GPU → (its node, listed) as stored before the group, then as the group's Hellos leave it."""
    unlisted: dict[str, str] = dataclasses.field(default_factory=dict)
    """GPU → the node whose Hello in this group left it out."""
    _by_node: dict[str, set[str]] | None = dataclasses.field(default=None, repr=False)
    """Node → the GPUs it owns (listed or not), built from `owners` at the first Hello."""
    node_rows: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    gpu_rows: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    spool_resets: set[str] = dataclasses.field(default_factory=set)
    caught_up: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """Node → (epoch, acked seq) moved up to what the agent had acked (and the store lost)."""

    def welcome(self, hello: fleet.NodeHello, now: int, *, certified: bool = False) -> HelloOutcome:
        """Plan one Hello's node and GPU rows (after the group's earlier Hellos); its outcome.

        Raises:
            GpuClaimRefused: it is certified and lists a GPU another node still lists; nothing of it
                is planned.
        """
        for index, record in enumerate(hello.gpus):
            owner, listed = self.owners.get(record.uuid, (hello.node_id, False))
            if certified and owner != hello.node_id and listed:
                raise GpuClaimRefused(f"hello.gpus[{index}].uuid", record.uuid, owner)
        self._take_gpus(hello)
        node = self.node_rows.get(hello.node_id) or self.known.get(hello.node_id)
        boot_id = _text(hello.boot_id)
        acked_seq = int(node["acked_seq"] or 0) if node else 0
        epoch = int(node["spool_epoch"] or 0) if node else 0
        rebooted = bool(node and node["boot_id"]) and node["boot_id"] != boot_id  # type: ignore[index]
        known_spool = str(node["spool_id"] or "") if node else ""
        # A spool that started over: its head is behind what was acked, or (when both ids are
        # known) it is another spool. By the head alone, a new spool whose head had already
        # passed the old acked position was welcomed with it, and the agent deleted its new
        # events up to there unsent.
        spool_reset = hello.spool_head_seq < acked_seq or bool(
            known_spool and hello.spool_id and hello.spool_id != known_spool
        )
        if spool_reset:
            epoch, acked_seq = epoch + 1, 0
            self.spool_resets.add(hello.node_id)
        lost = None
        if not spool_reset and hello.spool_acked_seq > acked_seq:
            # The agent dropped what this store had acked and then lost: it never resends
            # those, and the ack, which moves only over stored seqs, waited on the gap for ever.
            lost = (acked_seq + 1, hello.spool_acked_seq)
            acked_seq = hello.spool_acked_seq
            self.caught_up[hello.node_id] = (epoch, acked_seq)
        state = node["state"] if node else None
        if state in (None, int(fleet.ComponentState.OFFLINE), int(fleet.ComponentState.UNSPECIFIED)):
            state = int(fleet.ComponentState.HEALTHY)
        self.node_rows[hello.node_id] = {
            "node_id": hello.node_id,
            "hostname": _text(hello.hostname),
            "boot_id": boot_id,
            "agent_version": _text(hello.agent_version),
            "backend": _text(hello.backend),
            "labels": _text_map(hello.labels),
            "state": state,
            "connected": True,
            "first_seen_unix_ns": node["first_seen_unix_ns"] if node else now,
            "last_seen_unix_ns": now,
            "spool_epoch": epoch,
            "acked_seq": acked_seq,
            "spool_id": _text(hello.spool_id) or known_spool,
        }
        return HelloOutcome(
            acked_seq=acked_seq, spool_reset=spool_reset, rebooted=rebooted, lost_seqs=lost, spool_epoch=epoch
        )

    def _take_gpus(self, hello: fleet.NodeHello) -> None:
        """Plan the Hello's GPUs as its node's, listed; and its node's other GPUs as no longer listed."""
        if self._by_node is None:
            self._by_node = {}
            for uuid, (owner, _listed) in self.owners.items():
                self._by_node.setdefault(owner, set()).add(uuid)
        owned = self._by_node.setdefault(hello.node_id, set())
        listed = {record.uuid for record in hello.gpus}
        for uuid in owned - listed:
            self.owners[uuid] = (hello.node_id, False)
            self.unlisted[uuid] = hello.node_id
        for record in hello.gpus:
            previous, _listed = self.owners.get(record.uuid, (hello.node_id, False))
            self._by_node.get(previous, set()).discard(record.uuid)
            owned.add(record.uuid)
            self.owners[record.uuid] = (hello.node_id, True)
            self.unlisted.pop(record.uuid, None)
            self.gpu_rows[record.uuid] = _gpu_row(record)

    def write(self, session: Session, conn: sa.Connection) -> None:
        """Write the planned rows: nodes first (the GPU rows reference them), then GPUs, then caught-up positions.

        The spool position is written only where a reset moved it: another replica may be acking
        this node's old stream meanwhile.
        """
        reset = [row for node_id, row in self.node_rows.items() if node_id in self.spool_resets]
        kept = [row for node_id, row in self.node_rows.items() if node_id not in self.spool_resets]
        upsert_many(session, schema.NodeRow, "node_id", reset, insert_only=("first_seen_unix_ns",))
        upsert_many(
            session, schema.NodeRow, "node_id", kept, insert_only=("first_seen_unix_ns", "spool_epoch", "acked_seq")
        )
        upsert_many(
            session,
            schema.GpuRow,
            "uuid",
            list(self.gpu_rows.values()),
            insert_only=("state", "power_sample_unix_ns", "counters_unix_ns"),
        )
        gpus_t = schema.GpuRow.__table__
        for uuid, node_id in self.unlisted.items():
            conn.execute(
                sa.update(gpus_t).where(gpus_t.c.uuid == uuid, gpus_t.c.node_id == node_id).values(listed=False)
            )
        nodes_t = _NODES
        for node_id, (epoch, acked_seq) in self.caught_up.items():  # only ever up: another replica may ack too
            conn.execute(
                sa.update(nodes_t)
                .where(nodes_t.c.node_id == node_id, nodes_t.c.spool_epoch == epoch, nodes_t.c.acked_seq < acked_seq)
                .values(acked_seq=acked_seq)
            )


def _gpu_row(record: fleet.GpuRecord) -> dict[str, Any]:
    """A GPU's row from its node's Hello."""
    return {
        "uuid": record.uuid,
        "node_id": record.node_id,
        "model": _text(record.model),
        "pci_bus_id": _text(record.pci_bus_id),
        "serial": _text(record.serial),
        "vbios_version": _text(record.vbios_version),
        "memory_total_mib": record.memory_total_mib,
        "power_limit_min_w": record.power_limit_min_w,
        "power_limit_max_w": record.power_limit_max_w,
        "power_limit_default_w": record.power_limit_default_w,
        "power_smoothing_supported": record.power_smoothing_supported,
        "labels": _text_map(record.labels),
        "state": int(fleet.ComponentState.HEALTHY),  # a new GPU's; a known one keeps its own
        "listed": True,
        "power_sample_unix_ns": 0,
        "counters_unix_ns": 0,
    }


def append_events_in(
    session: Session, batches: Sequence[tuple[str, Sequence[StoredEvent]]]
) -> list[tuple[int, list[int]] | KeyError | SpoolEpochChanged]:
    """`Store.append_events_many` in session's transaction (not committed here)."""
    planned = _plan_appends(session.connection(), batches)
    write_appends(session.connection(), planned)
    return planned.outcomes


@dataclasses.dataclass(frozen=True)
class PlannedAppends:
    """What storing batches of events writes, read and decided first (`_plan_appends`), and its outcomes."""

    outcomes: list[tuple[int, list[int]] | KeyError | SpoolEpochChanged]
    rows: list[dict[str, Any]]
    """The `health_events` rows to insert."""
    moved: list[dict[str, Any]]
    """The nodes whose acked position moved (`_MOVE_POSITION`'s parameters)."""


def write_appends(conn: sa.Connection, planned: PlannedAppends) -> None:
    """Write what `_plan_appends` planned: writes only, so they can go in a pipeline (`pipelined`)."""
    insert_many(conn, schema.HealthEventRow.__table__, planned.rows)
    if planned.moved:
        prepared(_MOVE_POSITION, conn.dialect).executemany(conn, planned.moved)


def _plan_appends(conn: sa.Connection, batches: Sequence[tuple[str, Sequence[StoredEvent]]]) -> PlannedAppends:
    """Read the nodes' positions (locked until the commit) and decide what storing batches writes."""
    node_ids = sorted({node_id for node_id, _events in batches})
    # node → [spool epoch, acked seq, the acked seq as read]; the rows stay locked until the
    # commit (PostgreSQL), so no other replica acts on the same position meanwhile. Sorted: two
    # groups lock shared nodes in the same order and cannot deadlock.
    positions: dict[str, list[int]] = {}
    # Seqs stored ahead of the acked position (normally none: agents send in order).
    ahead: dict[str, set[int]] = {}
    for start in range(0, len(node_ids), 500):  # bounded IN lists
        chunk = node_ids[start : start + 500]
        for row in conn.execute(_LOCKED_POSITIONS, {"node_ids": chunk}):
            acked = int(row.acked_seq or 0)
            positions[row.node_id] = [int(row.spool_epoch or 0), acked, acked]
            ahead[row.node_id] = set()
        for row in conn.execute(_STORED_AHEAD, {"node_ids": chunk}):
            ahead[row.node_id].add(int(row.seq))
    outcomes: list[tuple[int, list[int]] | KeyError | SpoolEpochChanged] = []
    rows: list[dict[str, Any]] = []
    for node_id, events in batches:
        position = positions.get(node_id)
        if position is None:
            outcomes.append(KeyError(f"unknown node {node_id!r}"))
            continue
        epoch, acked, _read = position
        stale = sorted({e.spool_epoch for e in events if e.spool_epoch is not None and e.spool_epoch != epoch})
        if stale:
            outcomes.append(
                SpoolEpochChanged(
                    f"node {node_id!r}: events of spool epoch {stale[0]}, but the node's spool is in epoch {epoch}"
                )
            )
            continue
        seen = ahead[node_id]
        stored: list[int] = []
        for e in sorted(events, key=lambda e: e.seq):
            if e.seq <= acked or e.seq in seen:
                continue
            seen.add(e.seq)
            stored.append(e.seq)
            rows.append(
                {
                    "node_id": node_id,
                    "spool_epoch": epoch,
                    "seq": e.seq,
                    "observed_unix_ns": e.observed_unix_ns,
                    "received_unix_ns": e.received_unix_ns,
                    "kind": e.kind,
                    "severity": e.severity,
                    "gpu_uuid": _text(e.gpu_uuid),
                    "xid": e.xid,
                    "message": _text(e.message),
                    "source": _text(e.source),
                    "attributes": _text_map(e.attributes),
                }
            )
        while acked + 1 in seen:
            acked += 1
        position[1] = acked
        outcomes.append((acked, stored))
    moved = [
        {"moved_node_id": node_id, "moved_acked_seq": acked}
        for node_id, (_epoch, acked, read) in positions.items()
        if acked != read
    ]
    return PlannedAppends(outcomes, rows, moved)


# Built once: building them per call cost more than running them (in the decision's transaction,
# `plan_expected`, they run in every commit of a burst).
_NODES = schema.NodeRow.__table__
_EVENTS = schema.HealthEventRow.__table__
_LOCKED_POSITIONS = (
    sa.select(_NODES.c.node_id, _NODES.c.spool_epoch, _NODES.c.acked_seq)
    .where(_NODES.c.node_id.in_(sa.bindparam("node_ids", expanding=True)))
    .order_by(_NODES.c.node_id)
    .with_for_update()
)
"""The nodes' spool positions, locked until the commit (PostgreSQL)."""
_STORED_AHEAD = (
    sa.select(_EVENTS.c.node_id, _EVENTS.c.seq)
    .join(
        _NODES,
        sa.and_(
            _NODES.c.node_id == _EVENTS.c.node_id,
            _EVENTS.c.spool_epoch == sa.func.coalesce(_NODES.c.spool_epoch, 0),
            _EVENTS.c.seq > sa.func.coalesce(_NODES.c.acked_seq, 0),
        ),
    )
    .where(_NODES.c.node_id.in_(sa.bindparam("node_ids", expanding=True)))
)
"""The nodes' events stored ahead of their acked positions."""
_MOVE_POSITION = (
    sa.update(_NODES)
    .where(_NODES.c.node_id == sa.bindparam("moved_node_id"))
    .values(acked_seq=sa.bindparam("moved_acked_seq"))
)
_GPUS = schema.GpuRow.__table__
_SAVE_LATEST = (
    sa.update(_GPUS)
    .where(_GPUS.c.uuid == sa.bindparam("b_uuid"))
    .values(
        power_w=sa.bindparam("b_power_w"),
        power_sample_unix_ns=sa.bindparam("b_power_ts"),
        enforced_power_limit_w=sa.bindparam("b_limit"),
        temperature_c=sa.bindparam("b_temp"),
        utilization_gpu_pct=sa.bindparam("b_util"),
        clock_event_reasons=sa.bindparam("b_reasons"),
        counters_unix_ns=sa.bindparam("b_counters_ts"),
    )
)
"""A GPU's latest telemetry (`Store.save_latest`): the ingest's flush writes 16,384 a period at 2,048 nodes."""
_TOUCH_NODE = (
    sa.update(_NODES)
    .where(_NODES.c.node_id == sa.bindparam("b_node_id"))
    .values(
        # Never backwards: another replica may already have written a later sighting.
        last_seen_unix_ns=sa.case(
            (_NODES.c.last_seen_unix_ns < sa.bindparam("b_last_seen"), sa.bindparam("b_last_seen")),
            else_=_NODES.c.last_seen_unix_ns,
        )
    )
)
"""A node's last sighting (`Store.touch_nodes`)."""


def plan_expected(session: Session, appends: Sequence[ExpectedAppend]) -> PlannedAppends:
    """Plan storing arriving events in session's transaction, exactly as the callers expect (`ExpectedAppend`).

    Reads only (the nodes' positions, locked until the commit); `write_appends` writes the plan.

    Raises:
        EventsNotAsExpected: some batch would not be stored in full, or would leave its node elsewhere
            than expected; the caller rolls the transaction back (nothing of it may commit: it holds
            a decision taken on these events being new).
    """
    if not appends:
        return PlannedAppends([], [], [])
    planned = _plan_appends(session.connection(), [(a.node_id, a.events) for a in appends])
    for append, outcome in zip(appends, planned.outcomes, strict=True):
        seqs = sorted(e.seq for e in append.events)
        # Every one new is what the decision needs. The position may have moved further than
        # expected (the node's later events, stored meanwhile by another call, now follow on):
        # the ack then covers less than it could, never more than is stored.
        if isinstance(outcome, Exception) or outcome[1] != seqs or outcome[0] < append.acked_seq:
            found = f"{type(outcome).__name__}: {outcome}" if isinstance(outcome, Exception) else outcome
            raise EventsNotAsExpected(
                f"node {append.node_id!r}: expected seqs {seqs} stored, acked to {append.acked_seq} at least; "
                f"got (acked seq, stored seqs) {found}"
            )
    return planned


def _node_status(node: schema.NodeRow, gpus: Sequence[schema.GpuRow]) -> fleet.NodeStatus:
    return fleet.NodeStatus(
        node_id=node.node_id,
        state=fleet.ComponentState(node.state or 0),
        connected=bool(node.connected),
        last_seen_unix_ns=int(node.last_seen_unix_ns or 0),
        boot_id=node.boot_id or "",
        agent_version=node.agent_version or "",
        backend=node.backend or "",
        hostname=node.hostname or "",
        labels=dict(node.labels or {}),
        gpus=tuple(
            fleet.GpuStatus(
                record=fleet.GpuRecord(
                    uuid=g.uuid,
                    node_id=g.node_id,
                    model=g.model,
                    pci_bus_id=g.pci_bus_id,
                    power_limit_min_w=g.power_limit_min_w,
                    power_limit_max_w=g.power_limit_max_w,
                    power_limit_default_w=g.power_limit_default_w,
                    serial=g.serial,
                    vbios_version=g.vbios_version,
                    memory_total_mib=g.memory_total_mib,
                    power_smoothing_supported=g.power_smoothing_supported,
                    labels=dict(g.labels or {}),
                ),
                state=fleet.ComponentState(g.state or 0),
                latest=fleet.GpuLatest(
                    power_w=g.power_w,
                    power_sample_unix_ns=int(g.power_sample_unix_ns or 0),
                    enforced_power_limit_w=g.enforced_power_limit_w,
                    temperature_c=g.temperature_c,
                    utilization_gpu_pct=g.utilization_gpu_pct,
                    clock_event_reasons=g.clock_event_reasons,
                    counters_unix_ns=int(g.counters_unix_ns or 0),
                ),
            )
            for g in gpus
        ),
    )


def redact_url(url: str) -> str:
    """The URL with any password hidden, for logs."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except (sa.exc.ArgumentError, ValueError):
        return "<invalid url>"


_USERINFO_PASSWORD = re.compile(r"(://[^:/@]*:).*@")  # greedy: a password may hold an unescaped @


def _redact_unparsed(url: str) -> str:
    """A URL that SQLAlchemy cannot parse, with whatever sits where a password would be hidden."""
    return _USERINFO_PASSWORD.sub(r"\1***@", url)


def _text(value: str) -> str:
    """value storable in any backend's text column: PostgreSQL refuses NUL characters, so they become U+FFFD.

    Agent strings (kernel log lines above all) are valid UTF-8 but may contain NUL; refusing the row
    would refuse the whole batch, and the agent would resend it forever.
    """
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def _text_map(values: Mapping[str, str]) -> dict[str, str]:
    return {_text(key): _text(value) for key, value in values.items()}


def upsert_many(
    session: Session,
    table_cls: Any,
    key: str,
    rows: Sequence[Mapping[str, Any]],
    *,
    insert_only: Iterable[str] = (),
) -> None:
    """INSERT ... ON CONFLICT (key) DO UPDATE for rows of identical shape, in one executemany.

    Columns in insert_only are written when the row is new and left alone when it exists (a GPU's
    health state, which Hello never changes).
    """
    if not rows:
        return
    table = table_cls.__table__
    dialect = session.get_bind().dialect
    kept = frozenset(insert_only)
    columns = tuple(name for name in rows[0] if name != key and name not in kept)
    cache_key = (dialect.name, dialect.driver, table.name, key, tuple(rows[0]), columns)
    statement = _UPSERTS.get(cache_key)
    if statement is None:
        if dialect.name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        elif dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:  # any other SQLAlchemy backend: read, then write
            for row in rows:
                upsert_row(
                    session, table_cls, {key: row[key]}, insert_only=kept, **{k: v for k, v in row.items() if k != key}
                )
            return
        base = insert(table)
        statement = Prepared(
            base.on_conflict_do_update(index_elements=[key], set_={name: base.excluded[name] for name in columns}),
            dialect,
            tuple(rows[0]),
            conflict_key=key,
        )
        _UPSERTS[cache_key] = statement
    statement.executemany(session.connection(), rows)


def insert_many(connection: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """INSERT rows of identical shape into table, in one executemany (`Prepared`)."""
    if not rows:
        return
    dialect = connection.dialect
    cache_key = (dialect.name, dialect.driver, table.name, tuple(rows[0]))
    statement = _INSERTS.get(cache_key)
    if statement is None:
        statement = _INSERTS[cache_key] = Prepared(sa.insert(table), dialect, tuple(rows[0]))
    statement.executemany(connection, rows)


_INSERTS: dict[tuple[str, str, str, tuple[str, ...]], Prepared] = {}
"""Insert statements by (dialect, driver, table, row columns), compiled once."""
_UPSERTS: dict[tuple[str, str, str, str, tuple[str, ...], tuple[str, ...]], Prepared] = {}
"""Upsert statements by (dialect, driver, table, key, row columns, updated columns): building one
(its "excluded" columns) cost more than executing it, at several per commit."""


class Prepared:
    """A statement compiled once for one dialect and one row shape, run as the driver's own executemany.

    For the remediation commit's bulk writes (upserts, outbox and audit inserts): a burst commits
    a few hundred transactions a second, each of about ten statements, and SQLAlchemy's execution
    path (compiling, the cache key, parameters built per row) took a large share of the commit
    writer's CPU; `bench/commit_replay.py` replays a burst's commits both ways.

    The SQL text, the parameter order and the bind processors (JSON columns are written by
    `json_text`) are those SQLAlchemy compiled for the dialect, so the rows written are the same;
    the statement runs through the connection's `exec_driver_sql`, in the caller's transaction.

    A statement whose missing columns have Python-side defaults (computed per row by SQLAlchemy's
    execution) is not prepared: `direct` is False and `executemany` hands it to SQLAlchemy.

    On PostgreSQL (psycopg) an INSERT of many rows is one statement over one array per column
    (`_execute_as_rows`): psycopg's executemany costs tens of microseconds of Python a row.
    """

    def __init__(
        self,
        statement: Any,
        dialect: sa.Dialect,
        column_keys: Sequence[str] | None = None,
        *,
        conflict_key: str | None = None,
    ) -> None:
        """Compile statement for dialect with the rows' keys (column_keys; None: the statement's own binds).

        conflict_key: an upsert's ON CONFLICT column, so that no multi-row statement names a row twice.
        """
        self.statement = statement
        self.conflict_key = conflict_key
        compiled = statement.compile(
            dialect=dialect,
            column_keys=None if column_keys is None else list(column_keys),
            for_executemany=True,  # as SQLAlchemy compiles it for many rows: no RETURNING of generated keys
        )
        # Columns the rows leave out whose defaults are plain values or argument-free functions
        # (`default=""`, `default=dict`): filled in here, as SQLAlchemy would per row, so the
        # statement still runs as the driver's own (and can go in a pipeline, `pipelined`). An
        # upsert's SET names only the rows' own columns: a default never overwrites a stored value.
        self._defaults: dict[str, Callable[[], Any]] = {}
        if column_keys is not None and compiled.insert_prefetch and not compiled.update_prefetch:
            defaults = _plain_defaults(compiled.insert_prefetch)
            if defaults is not None:
                self._defaults = defaults
                compiled = statement.compile(
                    dialect=dialect, column_keys=[*column_keys, *defaults], for_executemany=True
                )
        self.sql = compiled.string
        self.direct = not (compiled.insert_prefetch or compiled.update_prefetch)
        self._positions: tuple[str, ...] | None = tuple(compiled.positiontup) if compiled.positiontup else None
        processors = {}
        fixed = {}  # parameters the statement carries its own value for (a WHERE's constants)
        types = {}
        for bind, name in compiled.bind_names.items():
            types[name] = bind.type
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                processors[name] = processor
            if not bind.required:
                fixed[name] = bind.effective_value
        self._processors = processors
        self._fixed = fixed
        self._rows_sql = (
            _rows_template(self.sql, types, dialect)
            if self.direct and (dialect.name, dialect.driver) == ("postgresql", "psycopg")  # %b: psycopg's binary bind
            else None
        )

    def executemany(self, connection: sa.Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run it once per row (every row with the statement's keys), in connection's transaction."""
        if not self.direct:
            if connection.info.get(_PIPELINED):
                # SQLAlchemy completes such rows itself and may read back generated keys: no
                # answer is read inside a pipeline. Give every column instead.
                raise RuntimeError(
                    f"{self.sql.split(' (')[0]}: rows without every column cannot be written in a pipeline "
                    "(give the columns that have Python-side defaults)"
                )
            connection.execute(self.statement, list(rows))
            return
        processors, fixed, positions, defaults = self._processors, self._fixed, self._positions, self._defaults
        if fixed:
            rows = [{**fixed, **row} for row in rows]
        if defaults:
            rows = [{**row, **{name: make() for name, make in defaults.items() if name not in row}} for row in rows]
        if self._rows_sql is not None and len(rows) > 1 and self._execute_as_rows(connection, rows):
            return
        params: list[Any]
        # One pass per row, a bind processor only where a column has one (the JSON columns): the
        # rows of a burst's commits are tens of thousands a second, and building each twice (a
        # processed dict, then the tuple) was a tenth of the writer's CPU.
        if positions is not None:
            plan = [(name, processors.get(name)) for name in positions]
            params = [
                tuple(row[name] if process is None else process(row[name]) for name, process in plan) for row in rows
            ]
        elif processors:
            params = [
                {name: (value if name not in processors else processors[name](value)) for name, value in row.items()}
                for row in rows
            ]
        else:
            params = list(rows)
        # The driver's SQL as it is: no compiling, no cache key, no parameters built per row; a
        # driver error still becomes SQLAlchemy's (IntegrityError, OperationalError; a lost
        # connection is invalidated), as the callers and the store-outage handling expect.
        connection.exec_driver_sql(self.sql, params)

    def _execute_as_rows(self, connection: sa.Connection, rows: Sequence[Mapping[str, Any]]) -> bool:
        """PostgreSQL: the rows as INSERT ... SELECT FROM unnest(one array per column), in order; False: not done.

        psycopg's executemany sends one statement per row through its pipeline, and its Python
        side per row is where the commit writer spent most of a burst on PostgreSQL.
        With arrays the statement's text is the same for any number of rows, so the server plans
        it once, and the arrays go in binary (no escaping). A statement never names one upsert key
        twice (PostgreSQL refuses to update a row twice in one statement): a repeated key starts
        the next statement, so the rows land as one by one would, and their order is kept
        (``WITH ORDINALITY``), so generated ids follow it.

        Nothing is written (False) when a column's values are not all of its one Python type (an
        array has one element type): the caller then uses executemany.
        """
        assert self._rows_sql is not None
        sql, plan, json_columns = self._rows_sql
        processors = self._processors
        columns: list[list[Any]] = []
        for name, python_type in plan:
            # A JSON column goes as its text: the driver's processor wraps it for psycopg's own JSON
            # dumper (the same `json_text`), and a list of wrappers is not an array of one type.
            process = json_columns[name] if name in json_columns else processors.get(name)
            values = [row[name] for row in rows] if process is None else [process(row[name]) for row in rows]
            if python_type is float:  # an int in a float column is the same number; psycopg wants one type
                values = [float(v) if type(v) is int else v for v in values]
            if not all(v is None or type(v) is python_type for v in values):
                return False
            columns.append(values)
        key_values = [row[self.conflict_key] for row in rows] if self.conflict_key is not None else None
        start = 0
        while start < len(rows):
            end = min(len(rows), start + ROWS_PER_STATEMENT)
            if key_values is not None:
                seen: set[Any] = set()
                for at in range(start, end):
                    if key_values[at] in seen:
                        end = at
                        break
                    seen.add(key_values[at])
            connection.exec_driver_sql(sql, tuple(values[start:end] for values in columns))
            start = end
        return True


def prepared(statement: Any, dialect: sa.Dialect) -> Prepared:
    """A module-level statement with its own binds, `Prepared` for dialect once (then from `_PREPARED`)."""
    key = (statement, dialect.name, dialect.driver)
    ready = _PREPARED.get(key)
    if ready is None:
        ready = _PREPARED[key] = Prepared(statement, dialect)
    return ready


_PREPARED: dict[tuple[Any, str, str], Prepared] = {}
"""`prepared`'s statements by (statement, dialect, driver)."""


def _plain_defaults(columns: Sequence[Any]) -> dict[str, Callable[[], Any]] | None:
    """Each column's Python-side default as a function of nothing, or None if one needs SQLAlchemy's context."""
    out: dict[str, Callable[[], Any]] = {}
    for column in columns:
        default = column.default
        if default is not None and default.is_scalar:
            out[column.key] = lambda value=default.arg: value
        elif default is not None and default.is_callable and hasattr(default.arg, "__wrapped__"):
            # SQLAlchemy wraps an argument-free function (`default=dict`) to take the context it ignores
            out[column.key] = default.arg.__wrapped__
        else:
            return None
    return out


ROWS_PER_STATEMENT = 1000
"""Rows per INSERT ... FROM unnest on PostgreSQL (`Prepared`)."""
_ROW_BIND = re.compile(r"%\(([^)]+)\)s(?:::([A-Z][A-Z0-9_ ]*))?")
_ARRAY_TYPES: tuple[tuple[type[Any], str, type[Any]], ...] = (
    # (SQLAlchemy type, PostgreSQL element type where the bind has no cast, the one Python type of its
    # values); first match wins
    (sa.Boolean, "BOOLEAN", bool),
    (sa.Float, "DOUBLE PRECISION", float),
    (sa.BigInteger, "BIGINT", int),
    (sa.SmallInteger, "SMALLINT", int),
    (sa.Integer, "INTEGER", int),
    (sa.JSON, "JSON", str),  # its bind processor has made it text (`json_text`)
    (sa.String, "TEXT", str),
)


_RowsSql = tuple[str, list[tuple[str, type[Any]]], dict[str, Any]]
"""`Prepared`'s unnest form: the SQL, each bind's name and Python type in order, the JSON columns' processors."""


def _rows_template(sql: str, types: Mapping[str, Any], dialect: sa.Dialect) -> _RowsSql | None:
    """An INSERT's SQL with its VALUES row made ``SELECT ... FROM unnest(%b::T[], ...)``, and each bind's Python type.

    Each array has the type of its bind's cast in the SQL SQLAlchemy compiled (VARCHAR, JSON,
    BIGINT, ...), or for a bind without one (a boolean, a float) that of `_ARRAY_TYPES`. None when
    the statement is not of that form (each bind a plain column value of a type in `_ARRAY_TYPES`,
    with an upper-case cast or none), or binds anything outside its row: it then runs through
    executemany.
    """
    at = sql.find(" VALUES (")
    if not sql.startswith("INSERT ") or at < 0:
        return None
    start = at + len(" VALUES ")
    depth = 0
    for end in range(start, len(sql)):
        if sql[end] == "(":
            depth += 1
        elif sql[end] == ")":
            depth -= 1
            if depth == 0:
                break
    else:
        return None
    head, row, tail = sql[:at], sql[start + 1 : end], sql[end + 1 :]
    if "%(" in head or "%(" in tail:
        return None
    plan: list[tuple[str, type[Any]]] = []
    arrays: list[str] = []
    for bind in row.split(", "):
        match = _ROW_BIND.fullmatch(bind.strip())
        if match is None or match.group(1) not in types:
            return None
        sql_type = types[match.group(1)]
        kind = next(((pg, py) for cls, pg, py in _ARRAY_TYPES if isinstance(sql_type, cls)), None)
        if kind is None:
            return None
        arrays.append(f"%b::{match.group(2) or kind[0]}[]")
        plan.append((match.group(1), kind[1]))
    names = ", ".join(f"c{i}" for i in range(len(plan)))
    select = f"SELECT {names} FROM unnest({', '.join(arrays)}) WITH ORDINALITY AS r({names}, n) ORDER BY n"
    # A JSON column's values as text, by SQLAlchemy's own JSON bind processor before the driver's
    # wrapping (the engine's serializer, the same null rules): the rows are those executemany writes.
    json_columns = {
        name: sa.JSON.bind_processor(types[name], dialect) for name, _ in plan if isinstance(types[name], sa.JSON)
    }
    return f"{head} {select}{tail}", plan, json_columns


@contextlib.contextmanager
def pipelined(connection: sa.Connection) -> Iterator[None]:
    """On PostgreSQL (psycopg), the statements run inside are sent without waiting for each answer.

    A remediation commit is about ten statements; one after another, each waited a round trip to
    the server and its turn there (0.5-1 ms each on a busy controller), most of the commit. In
    psycopg's pipeline mode they go out at once and their answers are read at the end, in the
    same transaction and order. Only writes belong inside: a statement whose rows are read there
    has none to read until the end (do the reads first). Elsewhere (SQLite, in process) this does
    nothing.

    An error comes out as SQLAlchemy's, as it would from the statement that caused it
    (`STORE_UNAVAILABLE` for a lost server: the connection is invalidated; IntegrityError for a
    refused row), and the transaction is rolled back by its owner as before.
    """
    dialect = connection.dialect
    if (dialect.name, dialect.driver) != ("postgresql", "psycopg") or not PIPELINE_WRITES:
        yield
        return
    import psycopg  # only with the psycopg driver, which has it

    if not psycopg.Pipeline.is_supported():  # a libpq older than 14 (psycopg without its binary wheel)
        yield
        return
    raw = connection.connection.dbapi_connection
    info = connection.info  # the pooled connection's, still there once an error has invalidated it
    info[_PIPELINED] = True
    try:
        with raw.pipeline():
            yield
    except psycopg.Error as exc:  # raised when the answers are read, outside SQLAlchemy's own execute
        lost = dialect.is_disconnect(exc, raw, None)
        if lost:
            connection.invalidate(exc)
        raise sa.exc.DBAPIError.instance(
            None, None, exc, psycopg.Error, connection_invalidated=lost, dialect=dialect
        ) from exc
    finally:
        info.pop(_PIPELINED, None)


PIPELINE_WRITES = True
"""Whether `pipelined` pipelines (bench/commit_replay.py turns it off to measure what it buys)."""
_PIPELINED = "rasd_pipelined"
"""`sa.Connection.info` key set while `pipelined` runs."""


@contextlib.contextmanager
def rolled_back(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """A session in a transaction that is always rolled back: a warm-up runs a write path and keeps nothing."""
    with sessions() as session:
        session.begin()
        try:
            yield session
        finally:
            session.rollback()


def upsert_row(
    session: Session, table: Any, key: Mapping[str, Any], /, *, insert_only: Iterable[str] = (), **values: Any
) -> None:
    """Read, then insert or update one ORM row (for backends without ON CONFLICT, and one-off rows).

    Columns in insert_only are written when the row is new and left alone when it exists (as in
    `upsert_many`).
    """
    row = session.get(table, next(iter(key.values())))
    if row is None:
        session.add(table(**key, **values))
    else:
        kept = frozenset(insert_only)
        for name, value in values.items():
            if name not in kept:
                setattr(row, name, value)
