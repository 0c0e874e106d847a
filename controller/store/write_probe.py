"""Whether a PostgreSQL store can still be written: a periodic write probe and the gate it closes.

A PostgreSQL that accepts connections but refuses writes (a failover left the replica on a read-only
server, `default_transaction_read_only`; the disk is full; the role lost its privileges) failed every
ingest transaction with the server's error while health stayed SERVING and nothing said why. A probe
(`WriteProbe.run`, every few seconds from the controller's store watch) now commits one tiny UPDATE in
its own transaction on a fresh connection, bounded by a statement timeout. While the server refuses
it (or it does not finish in time), every transaction of the store's engine is refused at its start
with `StoreUnwritable`, a store outage
(`repo.STORE_UNAVAILABLE`): nothing more is acked, agents keep their events in their spools, and the
controller reports NOT_SERVING; when the probe commits again, the gate opens.

The errors such a server gives a write (`UNWRITABLE_SQLSTATES`) are also turned into `StoreUnwritable`
wherever they happen, so a write that meets one before the probe does is an outage too, not an error.
"""

from __future__ import annotations

import threading

import sqlalchemy as sa

UNWRITABLE_SQLSTATES = {
    "25006": "read-only transaction (a standby, or default_transaction_read_only)",
    "42501": "insufficient privilege",
    "53100": "disk full",
}
"""SQLSTATEs that say the server refuses this store's writes, with what each means to an operator."""

QUERY_CANCELED = "57014"
"""The SQLSTATE of a statement ended by its statement timeout (the probe's, waiting on a lock or the disk)."""

PROBE_STATEMENT = "UPDATE alembic_version SET version_num = version_num"
"""The probe's write. alembic_version has one row on every migrated store and nothing reads it while
running: rewriting its value with itself writes a row version and WAL, so it meets a read-only server,
a revoked privilege and a full disk as an event would, without a table of its own."""


class StoreUnwritable(Exception):
    """The store refuses writes (read-only, no privilege, disk full, a probe timed out): a store outage."""


def unwritable_problem(error: BaseException) -> str | None:
    """What a database error says about the store's writes, or None when it is not one of those."""
    sqlstate = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    meaning = UNWRITABLE_SQLSTATES.get(str(sqlstate)) if sqlstate else None
    if meaning is None:
        return None
    first_line = (str(error).splitlines() or [""])[0][:200]
    return f"store refuses writes: {meaning} (SQLSTATE {sqlstate}: {first_line})"


def raise_unwritable(context: sa.engine.ExceptionContext) -> None:
    """An engine's ``handle_error`` hook: a refused write raises `StoreUnwritable` instead."""
    problem = unwritable_problem(context.original_exception)
    if problem is not None:
        raise StoreUnwritable(problem) from context.original_exception


class WriteProbe:
    """The last write probe's outcome for one store, and the gate on its engine's transactions.

    The gate closes only for a server that answers and refuses the write (`StoreUnwritable`) or does
    not finish it within the timeout; an unreachable server fails every transaction by itself, and
    gating it too would only hold the store shut for up to a probe interval after it is back.
    """

    def __init__(self, probe_engine: sa.Engine, timeout_s: float = 5.0) -> None:
        """Probe with probe_engine (fresh connections: a NullPool), each statement within timeout_s."""
        self._engine = probe_engine
        self.timeout_s = timeout_s
        self._problem: str | None = None
        self._gate_shut = False
        self._lock = threading.Lock()

    @property
    def problem(self) -> str | None:
        """Why the last probe failed; None while writes commit (or before the first probe)."""
        with self._lock:
            return self._problem

    def run(self) -> str | None:
        """Commit the probe's write in its own transaction; record and return why it failed, or None.

        Blocking: run it beside the event loop and the store thread. A fresh connection each time,
        so that it sees what a reconnecting session sees (a role's or database's new
        `default_transaction_read_only` applies to new sessions only).
        """
        timeout_ms = max(1, int(self.timeout_s * 1000))
        problem, shut = None, False
        try:
            with self._engine.begin() as connection:
                connection.exec_driver_sql(f"SET LOCAL statement_timeout = {timeout_ms}")
                connection.exec_driver_sql(PROBE_STATEMENT)
        except StoreUnwritable as exc:
            problem, shut = str(exc), True
        except sa.exc.SQLAlchemyError as exc:
            cause = getattr(exc, "orig", None) or exc
            problem = "store write probe failed: " + (str(cause).splitlines() or [""])[0][:200]
            shut = getattr(cause, "sqlstate", None) == QUERY_CANCELED  # the write did not finish in time
        self.record(problem, shut=shut)
        return problem

    def record(self, problem: str | None, *, shut: bool = True) -> None:
        """Set the outcome (also from outside: a probe that did not finish in time); shut: close the gate."""
        with self._lock:
            self._problem = problem
            self._gate_shut = problem is not None and shut

    def check(self) -> None:
        """Raise `StoreUnwritable` while the gate is shut (an engine's ``begin`` hook)."""
        with self._lock:
            problem = self._problem if self._gate_shut else None
        if problem is not None:
            raise StoreUnwritable(problem)
