"""The remediation half of the store: durable ladder state, the command outbox, and the operator views.

Every decision is committed in one transaction with its commands (DESIGN.md invariant 2): the new
per-node ladder state, the correlation documents (per scope, its incidents' ids; each incident's
data is its row in the incidents table) and the budget document when it changed, the outbox rows
(insert-or-ignore by command id, so replaying a decision never duplicates a command), the incident
and ticket projections operators query, quarantines, RMA tickets and audit records. Only what a
decision changed is written. A controller killed at any
point restarts from these rows: decided-but-undispatched commands are still `pending`, dispatched
ones are still awaited, and finished ones are never sent again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from rasd.controller.core import fleet
from rasd.controller.store import paging, records, repo, schema

# Command statuses: pending → dispatched → a final one; or cancelled before dispatch.
FINAL_STATUSES = frozenset({"succeeded", "failed", "timed_out", "refused", "not_supported", "dry_run", "cancelled"})
_FINAL_ORDER = tuple(sorted(FINAL_STATUSES))  # one SQL text per shape, so the statement cache hits


@dataclasses.dataclass(frozen=True)
class CommandRecord:
    """An outbox row as plain data."""

    command_id: str
    node_id: str
    gpu_uuid: str
    ticket_id: str
    kind: str
    payload: Mapping[str, Any]
    status: str
    reason: str
    created_unix_ns: int
    dispatched_unix_ns: int | None
    finished_unix_ns: int | None
    result: Mapping[str, Any] | None


@dataclasses.dataclass
class Commit:
    """Everything one decision changes, written in one transaction."""

    now_unix_ns: int
    processed_seq: dict[str, int] = dataclasses.field(default_factory=dict)
    """Node → highest event seq this decision has consumed (the replay watermark, same transaction)."""
    processed_epoch: dict[str, int] = dataclasses.field(default_factory=dict)
    """Node → the spool epoch of its seq in processed_seq, where the events said (`StoredEvent.spool_epoch`);
    else the node's epoch as this transaction reads it."""
    node_states: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    docs: dict[str, dict[str, Any] | None] = dataclasses.field(default_factory=dict)
    """controller_states documents to write; None deletes one."""
    new_commands: list[CommandRecord] = dataclasses.field(default_factory=list)
    command_updates: list[records.CommandUpdate] = dataclasses.field(default_factory=list)
    incidents: list[records.IncidentRecord] = dataclasses.field(default_factory=list)
    tickets: list[records.TicketRecord] = dataclasses.field(default_factory=list)
    quarantines: list[records.QuarantineRecord] = dataclasses.field(default_factory=list)
    releases: list[records.ReleaseRecord] = dataclasses.field(default_factory=list)
    rmas: list[records.RmaRecord] = dataclasses.field(default_factory=list)
    validations: list[records.ValidationRecord] = dataclasses.field(default_factory=list)
    audit: list[records.AuditRecord | Mapping[str, Any]] = dataclasses.field(default_factory=list)
    """Audit rows in order (`records.audit_row`: the power loop's are still mappings)."""
    event_appends: list[repo.ExpectedAppend] = dataclasses.field(default_factory=list)
    """Events that arrived with this decision, stored in its transaction (`repo.plan_expected`): the
    decision on them and the events themselves become durable in one sync of the disk. Stored other
    than expected, the whole transaction is refused (`repo.EventsNotAsExpected`)."""


class RemediationStore:
    """Typed access to the remediation tables (same engine as `rasd.controller.store.repo.Store`)."""

    def __init__(self, engine: sa.Engine, *, fence: Callable[[Session], None] | None = None) -> None:
        """Bind to an engine whose tables already exist (the Store creates or migrates them).

        fence: called first in every `commit` transaction; raises to refuse it (the leader's fencing
        token check; None: every commit is taken).
        """
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self.fence: Callable[[Session], None] | None = fence
        """Called first in every `commit` transaction; raises to refuse it (the leader's fencing token check)."""
        self.writer: Any = None
        """A `rasd.controller.store.writer.CommitProcess` that runs `commit` in its own process (it
        checks its own fence there); None: commit here."""

    # -- loading at start-up ---------------------------------------------------------------------------
    def load_node_states(self) -> dict[str, dict[str, Any]]:
        """Every node's ladder state document."""
        with self._sessions() as session:
            return {row.node_id: row.state for row in session.scalars(sa.select(schema.RemediationStateRow))}

    def load_docs(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every controller_states document whose name starts with prefix."""
        with self._sessions() as session:
            rows = session.scalars(
                sa.select(schema.ControllerStateRow).where(schema.ControllerStateRow.name.startswith(prefix))
            )
            return {row.name: row.state for row in rows}

    def load_doc(self, name: str) -> dict[str, Any] | None:
        """A fleet-wide state document (e.g. "budget"), or None before the first save."""
        with self._sessions() as session:
            row = session.get(schema.ControllerStateRow, name)
            return None if row is None else row.state

    def incident_data(self, incident_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Incident id → the ``data`` document of its row, for those of the ids that exist."""
        table = schema.IncidentRow.__table__
        query = sa.select(table.c.incident_id, table.c.data)
        with self._sessions() as session:
            rows = repo.rows_for_ids(session.execute, query, table.c.incident_id, incident_ids, repo.IDS_PER_QUERY)
        return {incident_id: data for incident_id, data in rows}

    def latest_incident_opened(self) -> dict[str, int]:
        """Node id → when its most recent incident opened (unix ns), for the nodes that ever had one."""
        table = schema.IncidentRow.__table__
        query = sa.select(table.c.node_id, sa.func.max(table.c.opened_unix_ns)).group_by(table.c.node_id)
        with self._sessions() as session:
            return {node_id: int(opened) for node_id, opened in session.execute(query)}

    def commands(
        self,
        *,
        statuses: Iterable[str] | None = None,
        node_id: str = "",
        node_ids: Collection[str] | None = None,
        limit: int | None = 10_000,
    ) -> list[CommandRecord]:
        """Outbox rows, oldest first, optionally filtered; limit None: all of them.

        node_ids: only those of these nodes (a replica's own streams), `OUTBOX_NODES_PER_QUERY` to a
        query: its courier reads what it may deliver, not the whole fleet's commands, and all of them.
        """
        table = schema.CommandRow
        query = sa.select(table)
        if statuses is not None:
            query = query.where(table.status.in_(list(statuses)))
        if node_id:
            query = query.where(table.node_id == node_id)
        with self._sessions() as session:
            if node_ids is None:
                query = query.order_by(table.created_unix_ns, table.command_id)
                rows = list(session.scalars(query if limit is None else query.limit(limit)))
            else:
                rows = repo.rows_for_ids(session.scalars, query, table.node_id, list(node_ids), OUTBOX_NODES_PER_QUERY)
                rows.sort(key=lambda row: (row.created_unix_ns, row.command_id))
                rows = rows if limit is None else rows[:limit]
            return [_command(row) for row in rows]

    # -- the one write path ------------------------------------------------------------------------------
    def commit(self, change: Commit) -> list[str]:
        """Write a decision's changes atomically; returns the command ids that were new (or promoted).

        Upserts are single INSERT ... ON CONFLICT DO UPDATE statements (executemany), never a read
        followed by a write: a group of hundreds of events commits in a handful of statements.
        """
        if self.writer is not None:
            return self.writer.commit(change)
        with self._sessions.begin() as session:
            if self.fence is not None:
                self.fence(session)
            return self._write(session, change)

    def warm_up(self, fence: Callable[[Session], None] | None = None) -> None:
        """Run the write path once on made-up rows, then roll it back: nothing is written.

        A process's first commit otherwise configures the ORM mappers and compiles each statement,
        which delays the first decision's command by tens of milliseconds (a writer process starts
        with none of them compiled). With fence, its
        check runs too, after the writes (a made-up fence may refuse: that raises, as it would).
        """
        with repo.rolled_back(self._sessions) as session:
            session.add(schema.NodeRow(node_id=_WARM_UP_ID))  # for its event (`Commit.event_appends`)
            session.flush()
            self._write(session, _warm_up_change())
            if fence is not None:
                fence(session)

    def _write(self, session: Session, change: Commit) -> list[str]:
        now = change.now_unix_ns
        command_updates = list(change.command_updates)
        # Core statements go to the connection: the ORM session's execute adds ~0.3 ms per statement.
        conn = session.connection()
        # First: if they would not be stored as expected, nothing else is worth writing (the
        # decision took them for new), and the nodes' rows it locks are the ones a second replica
        # storing the same node's events waits on (PostgreSQL). Written with the other writes.
        appends = repo.plan_expected(session, change.event_appends)
        # Every read the bulk writes depend on comes first, so that the writes can then be sent
        # without waiting for each one's answer (`repo.pipelined`). None of them reads a table
        # that a write before it in this transaction touches.
        _stage_watermarks(conn, change)
        fresh, command_rows = _new_command_rows(conn, change.new_commands, command_updates)
        new_quarantines = _new_quarantines(conn, change.quarantines, now)
        with repo.pipelined(conn):
            repo.write_appends(conn, appends)
            _write_documents(session, conn, change)
            if command_rows:  # one executemany INSERT, no ORM objects: a burst decides hundreds at once
                repo.insert_many(conn, schema.CommandRow.__table__, command_rows)
            _update_commands(session, command_updates)
            repo.upsert_many(session, schema.IncidentRow, "incident_id", _last_per_key(change.incidents, "incident_id"))
            repo.upsert_many(session, schema.RepairTicketRow, "ticket_id", _last_per_key(change.tickets, "ticket_id"))
            _quarantine_many(conn, change.quarantines, new_quarantines)
            audit = [records.audit_row(r) for r in change.audit]
            for rows in _runs_of_one_shape(audit):  # in order: audit ids follow the decision's order
                repo.insert_many(conn, schema.AuditRow.__table__, rows)
        _write_rare(session, change)
        return fresh

    def unprocessed_events(self) -> dict[str, tuple[dict[str, str], list[repo.StoredEvent]]]:
        """Per node: its labels and the stored events remediation has not consumed yet, in seq order.

        Events are stored and acked before remediation runs (or in the transaction of the decision
        on them: then never without it); a controller that dies in between replays them from here
        at start-up, so no stored event is ever skipped by the ladder.
        """
        out: dict[str, tuple[dict[str, str], list[repo.StoredEvent]]] = {}
        with self._sessions() as session:
            marks = {
                row.name.removeprefix(WATERMARK_PREFIX): row.state
                for row in session.scalars(
                    sa.select(schema.ControllerStateRow).where(
                        schema.ControllerStateRow.name.startswith(WATERMARK_PREFIX)
                    )
                )
            }
            nodes = session.execute(
                sa.select(schema.NodeRow.node_id, schema.NodeRow.spool_epoch, schema.NodeRow.labels)
            ).all()
            wanted: list[tuple[str, int, int]] = []  # (node, its spool epoch, the last seq consumed in it)
            labels: dict[str, dict[str, str]] = {}
            for node_id, spool_epoch, node_labels in nodes:
                mark = marks.get(node_id) or {"epoch": -1, "seq": 0}
                epoch = int(spool_epoch or 0)
                wanted.append((node_id, epoch, int(mark["seq"]) if int(mark["epoch"]) == epoch else 0))
                labels[node_id] = dict(node_labels or {})
            events = schema.HealthEventRow
            by_node: dict[str, list[repo.StoredEvent]] = {}
            # Many nodes per query, each its own (node, epoch, seq >) term on the unique index: a
            # query per node made start-up take seconds at fleet scale.
            for start in range(0, len(wanted), UNPROCESSED_NODES_PER_QUERY):
                terms = [
                    sa.and_(events.node_id == node_id, events.spool_epoch == epoch, events.seq > after)
                    for node_id, epoch, after in wanted[start : start + UNPROCESSED_NODES_PER_QUERY]
                ]
                for row in session.scalars(sa.select(events).where(sa.or_(*terms)).order_by(events.seq)):
                    by_node.setdefault(row.node_id, []).append(_stored_event(row))
            for node_id, _epoch, _after in wanted:
                if node_id in by_node:
                    out[node_id] = (labels[node_id], by_node[node_id])
        return out

    # -- operator views ----------------------------------------------------------------------------------
    def incidents(self, *, node_id: str = "", open_only: bool = False, limit: int = 100) -> list[dict[str, Any]]:
        """Incidents, newest first."""
        return self.incidents_page(node_id=node_id, open_only=open_only, limit=limit).items

    def incidents_page(
        self, *, node_id: str = "", open_only: bool = False, after: paging.Position | None = None,
        limit: int = 100, max_bytes: int | None = None,
    ) -> paging.Page[dict[str, Any]]:  # fmt: skip
        """One page of incidents, newest first (`paging`)."""
        table = schema.IncidentRow
        return self._page(table, table.opened_unix_ns, table.incident_id, node_id,
                          (table.state == "open") if open_only else None, after, limit, max_bytes)  # fmt: skip

    def tickets(self, *, node_id: str = "", open_only: bool = False, limit: int = 100) -> list[dict[str, Any]]:
        """Repair tickets, most recently updated first."""
        return self.tickets_page(node_id=node_id, open_only=open_only, limit=limit).items

    def tickets_page(
        self, *, node_id: str = "", open_only: bool = False, after: paging.Position | None = None,
        limit: int = 100, max_bytes: int | None = None,
    ) -> paging.Page[dict[str, Any]]:  # fmt: skip
        """One page of repair tickets, most recently updated first (`paging`: a ticket updated meanwhile moves)."""
        table = schema.RepairTicketRow
        return self._page(table, table.updated_unix_ns, table.ticket_id, node_id,
                          table.closed.is_(False) if open_only else None, after, limit, max_bytes)  # fmt: skip

    def quarantines(self, *, active_only: bool = True, node_id: str = "") -> list[dict[str, Any]]:
        """Quarantines, newest first."""
        return self._rows(schema.QuarantineRow, schema.QuarantineRow.since_unix_ns, node_id, 10_000,
                          schema.QuarantineRow.released_unix_ns.is_(None) if active_only else None)  # fmt: skip

    def quarantine_counts(self) -> dict[str, int]:
        """Active quarantines per scope ("node", "gpu", "port"), counted in SQL (for the gauge)."""
        table = schema.QuarantineRow.__table__
        scope = sa.case((table.c.port != "", "port"), (table.c.gpu_uuid != "", "gpu"), else_="node")
        counts = {"node": 0, "gpu": 0, "port": 0}
        with self._sessions() as session:
            query = sa.select(scope, sa.func.count()).where(table.c.released_unix_ns.is_(None)).group_by(scope)
            for name, count in session.execute(query):
                counts[name] = int(count)
        return counts

    def rmas(self, *, pending_only: bool = False) -> list[dict[str, Any]]:
        """RMA tickets, newest first."""
        return self._rows(schema.RmaTicketRow, schema.RmaTicketRow.opened_unix_ns, "", 10_000,
                          (schema.RmaTicketRow.state == "pending") if pending_only else None)  # fmt: skip

    def validations(self, *, node_id: str = "", limit: int = 100) -> list[dict[str, Any]]:
        """Validation runs, newest first."""
        return self.validations_page(node_id=node_id, limit=limit).items

    def validations_page(
        self, *, node_id: str = "", after: paging.Position | None = None, limit: int = 100,
        max_bytes: int | None = None,
    ) -> paging.Page[dict[str, Any]]:  # fmt: skip
        """One page of validation runs, newest first (`paging`)."""
        table = schema.ValidationRow
        return self._page(table, table.started_unix_ns, table.validation_id, node_id, None, after, limit, max_bytes)

    def audit(self, *, since_unix_ns: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        """Audit records, newest first."""
        return self.audit_page(since_unix_ns=since_unix_ns, limit=limit).items

    def audit_page(
        self, *, since_unix_ns: int = 0, after: paging.Position | None = None, limit: int = 100,
        max_bytes: int | None = None,
    ) -> paging.Page[dict[str, Any]]:  # fmt: skip
        """One page of audit records, newest first (`paging`)."""
        table = schema.AuditRow
        return self._page(table, table.at_unix_ns, table.id, "", table.at_unix_ns >= since_unix_ns, after, limit,
                          max_bytes)  # fmt: skip

    def approve_rma(self, rma_id: str, *, actor: str, now_unix_ns: int) -> dict[str, Any] | None:
        """Mark a pending RMA approved; None when unknown. Raises ValueError when not pending."""
        with self._sessions.begin() as session:
            row = session.get(schema.RmaTicketRow, rma_id)
            if row is None:
                return None
            if row.state != "pending":
                raise ValueError(f"RMA {rma_id} is {row.state}, not pending")
            row.state = "approved"
            row.approved_by = actor
            row.approved_unix_ns = now_unix_ns
            return _as_dict(row)

    def _page(
        self, table: Any, order: Any, key: Any, node_id: str, condition: Any, after: paging.Position | None,
        limit: int, max_bytes: int | None,
    ) -> paging.Page[dict[str, Any]]:  # fmt: skip
        with self._sessions() as session:
            query = sa.select(table)
            if node_id:
                query = query.where(table.node_id == node_id)
            if condition is not None:
                query = query.where(condition)
            return paging.read_page(session, query, order=order, key=key, after=after, limit=limit,
                                    max_bytes=max_bytes, convert=_as_dict, size_of=paging.mapping_bytes)  # fmt: skip

    def _rows(self, table: Any, order: Any, node_id: str, limit: int, condition: Any) -> list[dict[str, Any]]:
        with self._sessions() as session:
            query = sa.select(table)
            if node_id:
                query = query.where(table.node_id == node_id)
            if condition is not None:
                query = query.where(condition)
            return [_as_dict(row) for row in session.scalars(query.order_by(order.desc()).limit(limit))]


WATERMARK_PREFIX = "watermark/"
"""controller_states name prefix of each node's replay watermark: the last event seq the ladder consumed."""


def stored_event(row: schema.HealthEventRow) -> repo.StoredEvent:
    """A stored event row as the ladder's StoredEvent (the replica relay reads events too)."""
    return _stored_event(row)


def _stored_event(row: schema.HealthEventRow) -> repo.StoredEvent:
    return repo.StoredEvent(
        node_id=row.node_id,
        seq=row.seq,
        observed_unix_ns=row.observed_unix_ns,
        received_unix_ns=row.received_unix_ns,
        kind=row.kind,
        severity=row.severity,
        gpu_uuid=row.gpu_uuid,
        xid=row.xid,
        message=row.message,
        source=row.source,
        attributes=dict(row.attributes or {}),
        spool_epoch=int(row.spool_epoch or 0),
    )


_COMMAND_FIELDS = dataclasses.fields(CommandRecord)


def _as_dict(row: Any) -> dict[str, Any]:
    return {column.key: getattr(row, column.key) for column in sa.inspect(row).mapper.column_attrs}


_WARM_UP_ID = "rasd-warm-up"
"""Every key `warm_up` writes (and rolls back); no node, command or incident is called that."""


def _warm_up_change() -> Commit:
    """A made-up decision with the rows a burst's commits write, for `RemediationStore.warm_up`.

    An event that arrived with it, a watermark, a node's state, documents (one deleted), a new
    command and a status update, an incident and a ticket. Quarantines and audit rows are left out:
    their ids come from a sequence, which a rollback would leave with a gap.
    """
    key = _WARM_UP_ID
    event = repo.StoredEvent(key, 1, 0, 0, 0, 0, "", None, "", "", {}, spool_epoch=0)
    return Commit(
        now_unix_ns=0,
        event_appends=[repo.ExpectedAppend(key, (event,), 1)],
        processed_seq={key: 1},
        node_states={key: {"node_id": key, "tickets": []}},
        docs={key: {}, f"{key}/gone": None},
        new_commands=[
            CommandRecord(
                command_id=key, node_id=key, gpu_uuid="", ticket_id=key, kind="restart_process", payload={},
                status="pending", reason=key, created_unix_ns=0, dispatched_unix_ns=None, finished_unix_ns=None,
                result=None,
            )
        ],
        command_updates=[records.CommandUpdate(key, "dispatched", dispatched_unix_ns=0)],
        incidents=[
            records.IncidentRecord(incident_id=key, node_id=key, gpu_uuid="", cause=key, component="node", severity=0,
                                   state="open", opened_unix_ns=0, closed_unix_ns=None, data={})
        ],
        tickets=[
            records.TicketRecord(ticket_id=key, node_id=key, gpu_uuid="", incident_id=key, state="acting",
                                 rung="restart_process", purpose="repair", reason=key, opened_unix_ns=0,
                                 updated_unix_ns=0, closed=False, steps=[])
        ],
    )  # fmt: skip


def _stage_watermarks(conn: sa.Connection, change: Commit) -> None:
    """Put each node's replay watermark (`Commit.processed_seq`) into change's documents, with its spool epoch."""
    if not change.processed_seq:
        return
    unknown = [node_id for node_id in change.processed_seq if node_id not in change.processed_epoch]
    epochs = dict(conn.execute(_SPOOL_EPOCHS, {"node_ids": unknown}).all()) if unknown else {}
    for node_id, seq in change.processed_seq.items():
        # The events' own epoch: read here, a pass on an old spool's events that commits just
        # after the node came back with a new spool would mark the new spool's seqs up to
        # the old one's as decided, and a replay after a crash would skip them.
        epoch = change.processed_epoch.get(node_id)
        if epoch is None:
            epoch = int(epochs.get(node_id) or 0)
        change.docs[WATERMARK_PREFIX + node_id] = {"epoch": epoch, "seq": seq}


def _new_command_rows(
    conn: sa.Connection, new_commands: Sequence[CommandRecord], command_updates: list[records.CommandUpdate]
) -> tuple[list[str], list[dict[str, Any]]]:
    """The outbox rows to insert, and the ids that are new (or promoted); promotions go into command_updates.

    A command that exists already (a replayed decision) keeps its status, except that one still
    pending is dispatched by a decision that admitted it (and counts as new).
    """
    fresh: list[str] = []
    command_rows: list[dict[str, Any]] = []
    if not new_commands:
        return fresh, command_rows
    ids = [r.command_id for r in new_commands]
    existing = dict(conn.execute(_COMMAND_STATUSES, {"command_ids": ids}).all())
    for record in new_commands:
        if record.command_id in existing:
            if existing[record.command_id] == "pending" and record.status == "dispatched":
                existing[record.command_id] = "dispatched"
                command_updates.append(
                    records.CommandUpdate(record.command_id, "dispatched", dispatched_unix_ns=record.dispatched_unix_ns)
                )
                fresh.append(record.command_id)
            continue
        existing[record.command_id] = record.status
        command_rows.append({f.name: getattr(record, f.name) for f in _COMMAND_FIELDS})
        fresh.append(record.command_id)
    return fresh, command_rows


def _write_documents(session: Session, conn: sa.Connection, change: Commit) -> None:
    """The nodes' ladder states and the controller documents (None: deleted)."""
    now = change.now_unix_ns
    repo.upsert_many(
        session,
        schema.RemediationStateRow,
        "node_id",
        [{"node_id": n, "state": s, "updated_unix_ns": now} for n, s in change.node_states.items()],
    )
    repo.upsert_many(
        session,
        schema.ControllerStateRow,
        "name",
        [{"name": n, "state": d, "updated_unix_ns": now} for n, d in change.docs.items() if d is not None],
    )
    gone = [n for n, d in change.docs.items() if d is None]
    if gone:
        conn.execute(_DELETE_DOCS, {"names": gone})


def _write_rare(session: Session, change: Commit) -> None:
    """Releases, RMA tickets and validation runs: rare, and each reads before it writes.

    After the pipelined writes, none of which they read.
    """
    for release in change.releases:
        _release(session, release, change.now_unix_ns)
    for rma in change.rmas:
        if session.get(schema.RmaTicketRow, rma.rma_id) is None:
            session.add(schema.RmaTicketRow(**rma.row()))
    for validation in change.validations:
        repo.upsert_row(
            session, schema.ValidationRow, {"validation_id": validation.validation_id}, **validation.values()
        )


def _last_per_key(rows: Sequence[records.IncidentRecord | records.TicketRecord], key: str) -> list[dict[str, Any]]:
    """The rows' column values, one per key (the last wins), so an executemany upsert never hits one key twice."""
    return list({getattr(row, key): row.row() for row in rows}.values())


def _update_commands(session: Session, updates: Sequence[records.CommandUpdate]) -> None:
    """Apply outbox updates in order, as one executemany UPDATE per set of columns.

    An update never touches a command that is already final. Several updates of one command in
    one commit (dispatched, then the controller-side result) are folded first with that same
    rule, so the outcome equals applying them one by one, at a statement per shape, not per row.
    """
    folded: dict[str, dict[str, Any]] = {}
    for update in updates:
        merged = folded.setdefault(update.command_id, {})
        if merged.get("status") not in FINAL_STATUSES:
            merged.update(update.values())
    by_shape: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for command_id, values in folded.items():
        by_shape.setdefault(tuple(sorted(values)), []).append(
            {"b_command_id": command_id, **{f"b_{k}": v for k, v in values.items()}}
        )
    table = schema.CommandRow.__table__
    connection = session.connection()
    for shape, rows in by_shape.items():
        cache_key = (connection.dialect.name, connection.dialect.driver, shape)
        statement = _COMMAND_UPDATES.get(cache_key)
        if statement is None:
            statement = _COMMAND_UPDATES[cache_key] = repo.Prepared(
                sa.update(table)
                # != per status, not NOT IN: an expanding IN parameter cannot be used with executemany
                .where(table.c.command_id == sa.bindparam("b_command_id"), *(table.c.status != f for f in _FINAL_ORDER))
                .values({name: sa.bindparam(f"b_{name}") for name in shape}),
                connection.dialect,
            )
        statement.executemany(connection, rows)


UNPROCESSED_NODES_PER_QUERY = 200
"""Nodes whose unconsumed events one start-up query reads: 3 parameters each, within SQLite's
999-variable limit of old builds, and an OR of this many terms stays within its expression depth."""
OUTBOX_NODES_PER_QUERY = 1_000
"""Node ids in one ``IN`` list of an outbox read (`RemediationStore.commands`)."""
_SPOOL_EPOCHS = sa.select(schema.NodeRow.node_id, schema.NodeRow.spool_epoch).where(
    schema.NodeRow.node_id.in_(sa.bindparam("node_ids", expanding=True))
)
"""The nodes' spool epochs, for the replay watermarks a commit writes (built once: building it per
commit cost more than running it)."""
_ACTIVE_QUARANTINES = sa.select(
    schema.QuarantineRow.node_id, schema.QuarantineRow.gpu_uuid, schema.QuarantineRow.port
).where(
    schema.QuarantineRow.node_id.in_(sa.bindparam("node_ids", expanding=True)),
    schema.QuarantineRow.released_unix_ns.is_(None),
)
"""The nodes' quarantines still in force (`_quarantine_many` keeps one per target)."""
_COMMAND_STATUSES = sa.select(schema.CommandRow.command_id, schema.CommandRow.status).where(
    schema.CommandRow.command_id.in_(sa.bindparam("command_ids", expanding=True))
)
"""The outbox status of the commands named (a decision made again finds its commands there)."""
_MARK_GPUS = (
    sa.update(schema.GpuRow.__table__)
    .where(schema.GpuRow.uuid.in_(sa.bindparam("uuids", expanding=True)))
    .values(state=sa.bindparam("state"))
)
"""Set the state of the GPUs named (a quarantine marks its GPUs)."""
_MARK_NODES = (
    sa.update(schema.NodeRow.__table__)
    .where(schema.NodeRow.node_id.in_(sa.bindparam("node_ids", expanding=True)))
    .values(state=sa.bindparam("state"))
)
"""Set the state of the nodes named (a node quarantine marks its node)."""
_DELETE_DOCS = sa.delete(schema.ControllerStateRow.__table__).where(
    schema.ControllerStateRow.name.in_(sa.bindparam("names", expanding=True))
)
"""Drop the controller documents named (a Core statement: the ORM's bulk delete may read back rows)."""
_COMMAND_UPDATES: dict[tuple[str, str, tuple[str, ...]], repo.Prepared] = {}
"""Outbox UPDATE statements by dialect, driver and the columns they set (a handful of shapes), compiled once."""


def _runs_of_one_shape(rows: Sequence[Mapping[str, Any]]) -> Iterator[list[Mapping[str, Any]]]:
    """Consecutive rows with the same keys, in order (an executemany needs one shape)."""
    run: list[Mapping[str, Any]] = []
    for row in rows:
        if run and row.keys() != run[0].keys():
            yield run
            run = []
        run.append(row)
    if run:
        yield run


def _command(row: schema.CommandRow) -> CommandRecord:
    return CommandRecord(**{f.name: getattr(row, f.name) for f in dataclasses.fields(CommandRecord)})


def _set_state(session: Session, node_id: str, gpu_uuid: str, state: fleet.ComponentState) -> None:
    if gpu_uuid:
        gpu = session.get(schema.GpuRow, gpu_uuid)
        if gpu is not None:
            gpu.state = int(state)
    else:
        node = session.get(schema.NodeRow, node_id)
        if node is not None:
            node.state = int(state)


def _new_quarantines(
    conn: sa.Connection, quarantines: Sequence[records.QuarantineRecord], now_unix_ns: int
) -> list[dict[str, Any]]:
    """The quarantines to record: those whose target has no active one yet (one read for all nodes)."""
    if not quarantines:
        return []
    nodes = sorted({q.node_id for q in quarantines})
    active = {(row.node_id, row.gpu_uuid, row.port) for row in conn.execute(_ACTIVE_QUARANTINES, {"node_ids": nodes})}
    rows = []
    for q in quarantines:
        if q.target not in active:
            active.add(q.target)
            rows.append(q.row(now_unix_ns))
    return rows


def _quarantine_many(
    conn: sa.Connection, quarantines: Sequence[records.QuarantineRecord], new_rows: Sequence[Mapping[str, Any]]
) -> None:
    """Record new quarantines (`_new_quarantines`) and mark the targets of all of them.

    A constant number of statements for any number of quarantines: one INSERT, one UPDATE per
    table whose state changes.
    """
    if not quarantines:
        return
    table = schema.QuarantineRow.__table__
    for run in _runs_of_one_shape(new_rows):  # in order; an executemany needs rows of one shape
        repo.insert_many(conn, table, run)
    gpus = sorted({q.gpu_uuid for q in quarantines if q.gpu_uuid and not q.port})
    whole = sorted({q.node_id for q in quarantines if not q.gpu_uuid and not q.port})
    state = int(fleet.ComponentState.QUARANTINED)
    # Statements built once (module level): most commits of a burst quarantine something, and
    # building these per commit cost more than running them.
    if gpus:
        conn.execute(_MARK_GPUS, {"uuids": gpus, "state": state})
    if whole:
        conn.execute(_MARK_NODES, {"node_ids": whole, "state": state})


def _release(session: Session, r: records.ReleaseRecord, now_unix_ns: int) -> None:
    query = sa.select(schema.QuarantineRow).where(
        schema.QuarantineRow.node_id == r.node_id, schema.QuarantineRow.released_unix_ns.is_(None)
    )
    if r.gpu_uuid:
        query = query.where(schema.QuarantineRow.gpu_uuid == r.gpu_uuid)
    elif r.port:
        query = query.where(schema.QuarantineRow.port == r.port)
    else:
        query = query.where(schema.QuarantineRow.gpu_uuid == "", schema.QuarantineRow.port == "")
    for row in session.scalars(query):
        row.released_unix_ns = now_unix_ns
        row.release_reason = r.reason
        row.forced = r.forced
    if not r.port:
        _set_state(session, r.node_id, r.gpu_uuid, fleet.ComponentState.HEALTHY)


class StoredJournal(MutableMapping[str, str]):
    """A small string map kept in controller_states, one document per key (the BMC power-cycle journal).

    Every write commits at once: the journal records "about to power-cycle" *before* the BMC is
    asked, so that a controller restart never cycles the same node twice for one ticket. Every
    lookup reads the store, not a copy: a standby replica that takes the lead sees what the leader
    before it journaled (with a copy from its own start it cycled a node again). One document per
    key (named by a digest: ticket ids can be longer than a document name), so that two replicas
    (a deposed one whose adapter thread still runs) never overwrite each other's entries; and the
    writes go through `RemediationStore.commit`, whose fence refuses a deposed replica's, before
    its BMC is asked. The map of older versions (one document called name) is still read, and an
    entry of it deleted there.
    """

    def __init__(self, store: RemediationStore, name: str) -> None:
        """Back the map by the documents name/<digest of the key> (and the legacy document name)."""
        self._store = store
        self._name = name

    def _doc(self, key: str) -> str:
        return f"{self._name}/{hashlib.sha256(key.encode()).hexdigest()[:40]}"

    def __getitem__(self, key: str) -> str:
        doc = self._store.load_doc(self._doc(key))
        if doc is not None:
            return str(doc["value"])
        legacy = self._store.load_doc(self._name) or {}
        if key in legacy:
            return str(legacy[key])
        raise KeyError(key)

    def __setitem__(self, key: str, value: str) -> None:
        self._commit({self._doc(key): {"key": key, "value": value}})

    def __delitem__(self, key: str) -> None:
        docs: dict[str, dict[str, Any] | None] = {}
        if self._store.load_doc(self._doc(key)) is not None:
            docs[self._doc(key)] = None
        legacy = self._store.load_doc(self._name) or {}
        if key in legacy:
            docs[self._name] = {k: v for k, v in legacy.items() if k != key}
        if not docs:
            raise KeyError(key)
        self._commit(docs)

    def __iter__(self) -> Iterator[str]:
        keys = [str(doc["key"]) for doc in self._store.load_docs(self._name + "/").values()]
        legacy = self._store.load_doc(self._name) or {}
        return iter(dict.fromkeys([*keys, *legacy]))

    def __len__(self) -> int:
        return sum(1 for _key in self)

    def _commit(self, docs: dict[str, dict[str, Any] | None]) -> None:
        self._store.commit(Commit(now_unix_ns=time.time_ns(), docs=docs))
