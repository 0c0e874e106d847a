"""The aggregates' path to the leader through the store: one row per replica, one query to read them all.

Each replica upserts its latest encoded aggregate (`rasd.controller.core.aggregates.encode`) in
`replica_aggregates`, and in the same transaction reads what the leader asks it to ship (the
`AGGREGATE_READS_DOC` document: windows, tracked GPUs, how often). The leader reads every other
replica's row in one query each control period and writes the document when what it asks changes.
The store keeps the aggregates as bytes: decoding and judging their age is the reader's.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from rasd.controller.store import repo, schema

AGGREGATE_READS_DOC = "aggregate/reads"
"""The controller_states document the leader's power loop writes (`core.aggregates.AggregateReads`)."""


class AggregateStore:
    """Writes and reads of `replica_aggregates` (same engine as the Store)."""

    def __init__(self, engine: sa.Engine) -> None:
        """Bind to an engine whose schema is at head."""
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def publish(
        self, replica_id: str, *, built_unix_ns: int, format_version: int, payload: bytes
    ) -> dict[str, Any] | None:
        """Replace this replica's aggregate (one upsert); returns what the leader asks for now (None: nothing yet)."""
        row = {
            "replica_id": replica_id,
            "built_unix_ns": built_unix_ns,
            "format_version": format_version,
            "payload": payload,
        }
        with self._sessions.begin() as session:
            repo.upsert_many(session, schema.ReplicaAggregateRow, "replica_id", [row])
            reads = session.get(schema.ControllerStateRow, AGGREGATE_READS_DOC)
            return dict(reads.state) if reads is not None else None

    def aggregates(self, *, exclude: str = "", built_since_unix_ns: int = 0) -> list[tuple[str, int, int, bytes]]:
        """Every replica's aggregate built since then, except exclude's: (replica, built ns, format, payload)."""
        table = schema.ReplicaAggregateRow
        with self._sessions() as session:
            rows = session.execute(
                sa.select(table.replica_id, table.built_unix_ns, table.format_version, table.payload)
                .where(table.replica_id != exclude, table.built_unix_ns >= built_since_unix_ns)
                .order_by(table.replica_id)
            ).all()
        return [(r.replica_id, int(r.built_unix_ns), int(r.format_version), bytes(r.payload)) for r in rows]

    def forget(self, replica_id: str) -> None:
        """Drop a replica's aggregate (it stops: its nodes are not its any more)."""
        with self._sessions.begin() as session:
            table = schema.ReplicaAggregateRow
            session.execute(sa.delete(table).where(table.replica_id == replica_id))

    def ask(self, reads: dict[str, Any], *, now_unix_ns: int) -> None:
        """Tell every replica what to ship (the leader's power loop, when it changes)."""
        with self._sessions.begin() as session:
            repo.upsert_row(session, schema.ControllerStateRow, {"name": AGGREGATE_READS_DOC}, state=reads,
                            updated_unix_ns=now_unix_ns)  # fmt: skip

    def asked(self) -> dict[str, Any] | None:
        """What the leader asks for now (None: nothing yet)."""
        with self._sessions() as session:
            reads = session.get(schema.ControllerStateRow, AGGREGATE_READS_DOC)
            return dict(reads.state) if reads is not None else None
