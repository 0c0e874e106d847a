"""The aggregates' path to the leader through the store: one row per replica, fetched when it changed.

Each replica upserts its latest encoded aggregate (`rasd.controller.core.aggregates.encode`) in
`replica_aggregates`, and in the same transaction reads what the leader asks it to ship (the
`AGGREGATE_READS_DOC` document: windows, tracked GPUs, how often). The leader reads the other
replicas' stamps and fetches the payloads it has not decoded yet (`changed_aggregates`), and writes
the document when what it asks changes.
The store keeps the aggregates as bytes: decoding and judging their age is the reader's.
"""

from __future__ import annotations

from collections.abc import Mapping
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

    def changed_aggregates(
        self, *, exclude: str, built_since_unix_ns: int, known: Mapping[str, int]
    ) -> tuple[dict[str, int], list[tuple[str, int, int, bytes]]]:
        """(every other replica's built ns; the rows built since then that `known` does not hold).

        known: replica -> the built ns of the aggregate the reader has decoded. A reader that keeps
        what it decoded fetches only the payloads that changed (a replica's is megabytes at 2,000
        nodes), and learns which replicas have a row at all.
        """
        table = schema.ReplicaAggregateRow
        with self._sessions() as session:
            stamps = {
                replica_id: int(built_ns)
                for replica_id, built_ns in session.execute(
                    sa.select(table.replica_id, table.built_unix_ns).where(table.replica_id != exclude)
                )
            }
            wanted = [
                r for r, built_ns in stamps.items() if built_ns >= built_since_unix_ns and known.get(r) != built_ns
            ]
            if not wanted:
                return stamps, []
            rows = session.execute(
                sa.select(table.replica_id, table.built_unix_ns, table.format_version, table.payload)
                .where(table.replica_id.in_(wanted))
                .order_by(table.replica_id)
            ).all()
        return stamps, [(r.replica_id, int(r.built_unix_ns), int(r.format_version), bytes(r.payload)) for r in rows]

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
