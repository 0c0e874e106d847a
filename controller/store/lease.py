"""The leader lease and the fence, in SQL: one row per elected role, read and written under a row lock.

`LeaseStore.look` runs one election step in one transaction: lock the row (creating it on first use),
read the database's clock, let the pure `rasd.controller.core.lease.decide` judge, write what it says.
Replicas looking at the same moment queue on the row lock, so each sees the other's write.

`check_fence` is what makes a deposed leader harmless: a transaction of the fleet-wide loops calls it
first, with its term's token. It takes a shared lock on the lease row, so a takeover (which updates
the row) waits for that transaction to finish, and any transaction after the takeover sees the new
token and is refused. Every write is thus ordered before the takeover or refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from rasd.controller.core import lease as lease_core
from rasd.controller.store import schema

ROLE = "controller"
"""The lease of the controller's fleet-wide loops."""

ADDRESS_PREFIX = "replica/address/"
"""Documents (controller_states) in which each replica advertises where rasctl reaches it."""


def _address_doc(replica_id: str) -> str:
    """The document name of a replica's address; a replica id too long for the column is hashed."""
    name = ADDRESS_PREFIX + replica_id
    if len(name) <= 64:
        return name
    return ADDRESS_PREFIX + hashlib.sha256(replica_id.encode()).hexdigest()[:40]


class NotLeaderError(RuntimeError):
    """A write of the fleet-wide loops from a replica whose term is over (or that never led)."""


def db_now_unix_ns(session: Session) -> int:
    """The database's clock (PostgreSQL's clock_timestamp(); the local clock on SQLite)."""
    if session.get_bind().dialect.name == "postgresql":
        micros = session.execute(sa.text("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")).scalar()
        return int(micros) * 1000
    return time.time_ns()


def _lease(row: schema.LeaderLeaseRow) -> lease_core.Lease:
    return lease_core.Lease(
        holder=row.holder,
        fencing_token=int(row.fencing_token),
        expires_unix_ns=int(row.expires_unix_ns),
        acquired_unix_ns=int(row.acquired_unix_ns),
    )


def _locked_row(session: Session, role: str, *, shared: bool = False) -> schema.LeaderLeaseRow | None:
    query = sa.select(schema.LeaderLeaseRow).where(schema.LeaderLeaseRow.name == role)
    return session.scalars(query.with_for_update(read=shared)).one_or_none()


@dataclasses.dataclass(frozen=True)
class Fence:
    """A term's fencing token as a value: `check_fence` for it on a session.

    Picklable, so a writer process (`rasd.controller.store.writer`) can check it in its own transaction.
    """

    token: int | None
    role: str = ROLE

    def __call__(self, session: Session) -> None:
        """`check_fence(session, token, role=role)`."""
        check_fence(session, self.token, role=self.role)


def check_fence(session: Session, token: int | None, *, role: str = ROLE) -> None:
    """Refuse the surrounding transaction unless token is the lease's current fencing token.

    Call it first in the transaction; the shared row lock it takes holds off a takeover until the
    transaction ends (on SQLite, where writers are serialised anyway, it is a plain read).

    Raises:
        NotLeaderError: token is None (this replica does not lead) or an older term's.
    """
    if token is None:
        raise NotLeaderError("this replica is not the leader: only the leader runs the fleet-wide loops")
    row = _locked_row(session, role, shared=True)
    current = 0 if row is None else int(row.fencing_token)
    if current != token:
        holder = "" if row is None else row.holder
        raise NotLeaderError(
            f"fencing token {token} is stale: the lease is at term {current}"
            + (f" held by {holder}" if holder else "")
            + "; this replica's term is over and its write was refused"
        )


class LeaseStore:
    """Election steps on the lease row of one role."""

    def __init__(self, engine: sa.Engine, role: str = ROLE) -> None:
        """Bind to an engine whose schema is at head."""
        self.engine = engine
        self.role = role
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def _row(self, session: Session) -> schema.LeaderLeaseRow:
        row = _locked_row(session, self.role)
        if row is not None:
            return row
        # First use: create the empty row, tolerating a replica that created it at the same moment.
        dialect = session.get_bind().dialect.name
        values = {"name": self.role, "holder": "", "fencing_token": 0, "expires_unix_ns": 0,
                  "acquired_unix_ns": 0, "renewed_unix_ns": 0}  # fmt: skip
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        session.execute(insert(schema.LeaderLeaseRow).values(**values).on_conflict_do_nothing())
        row = _locked_row(session, self.role)
        assert row is not None
        return row

    def look(self, replica_id: str, *, lease_s: float) -> tuple[lease_core.Decision, lease_core.Lease, int]:
        """One election step: renew, take or follow. Returns (decision, the lease after it, db now)."""
        with self._sessions.begin() as session:
            row = self._row(session)
            now = db_now_unix_ns(session)
            current = _lease(row) if row.fencing_token else None
            decision = lease_core.decide(current, replica_id=replica_id, now_unix_ns=now, lease_s=lease_s)
            if decision.lease is not None:
                row.holder = decision.lease.holder
                row.fencing_token = decision.lease.fencing_token
                row.expires_unix_ns = decision.lease.expires_unix_ns
                row.acquired_unix_ns = decision.lease.acquired_unix_ns
                row.renewed_unix_ns = now
            return decision, _lease(row), now

    def take(self, replica_id: str) -> lease_core.Lease:
        """Start a new term unconditionally, with no expiry: the single-replica (SQLite) case."""
        with self._sessions.begin() as session:
            row = self._row(session)
            now = db_now_unix_ns(session)
            row.holder = replica_id
            row.fencing_token = int(row.fencing_token) + 1
            row.expires_unix_ns = 2**62
            row.acquired_unix_ns = now
            row.renewed_unix_ns = now
            return _lease(row)

    def release(self, replica_id: str) -> bool:
        """Give the lease up at once if this replica holds it (a clean shutdown); True if it did."""
        with self._sessions.begin() as session:
            row = self._row(session)
            now = db_now_unix_ns(session)
            released = lease_core.release(_lease(row), replica_id=replica_id, now_unix_ns=now)
            if released is None:
                return False
            row.holder = released.holder
            row.expires_unix_ns = released.expires_unix_ns
            return True

    def advertise(self, replica_id: str, address: str) -> None:
        """Record where this replica serves rasctl, so that followers can name the leader's address."""
        with self._sessions.begin() as session:
            name = _address_doc(replica_id)
            state = {"replica_id": replica_id, "address": address}
            row = session.get(schema.ControllerStateRow, name)
            if row is None:
                session.add(schema.ControllerStateRow(name=name, state=state, updated_unix_ns=time.time_ns()))
            else:
                row.state, row.updated_unix_ns = state, time.time_ns()

    def address_of(self, replica_id: str) -> str:
        """The address replica_id advertised ("" when it advertised none)."""
        with self._sessions() as session:
            row = session.get(schema.ControllerStateRow, _address_doc(replica_id))
            if row is None or row.state.get("replica_id") != replica_id:
                return ""
            return str(row.state.get("address", ""))

    def current(self) -> lease_core.Lease | None:
        """The lease as it stands (None before the first election)."""
        with self._sessions() as session:
            row = session.get(schema.LeaderLeaseRow, self.role)
            return None if row is None or not row.fencing_token else _lease(row)
