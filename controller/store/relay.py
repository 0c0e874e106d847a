"""What replicas hand each other through the store: new events, command results and straggler effects for the leader.

With several replicas, an agent's stream ends at any of them, but only the leader runs the ladder.
The replica that holds a stream stores what arrives on it (events through `Store.append_events`,
results here); the leader reads both from here. Commands go the other way through the outbox
(`commands` rows the leader marked dispatched), which every replica reads for its own streams.

New events are found without scanning them: a node has unread events when its acked position (the
gap-free run of stored seqs) is past the ladder's watermark for it, or its spool epoch moved on.
Only the gap-free run is handed over, so the ladder sees each node's events once and in order.

Straggler effects (`straggler_actions.Effect`: each replica's watch judges its own streams' GPUs) are
kept in arrival order until the leader has carried them out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from rasd.controller.core import straggler_actions
from rasd.controller.store import remediation as rstore
from rasd.controller.store import repo, schema

RELAYED_NODES_PER_QUERY = 1_000
"""Node ids in one ``IN`` list (SQLite takes 32,766 bound values, PostgreSQL 65,535: well within both)."""


class RelayStore:
    """Reads and writes of the relay between replicas (same engine as the Store)."""

    def __init__(self, engine: sa.Engine) -> None:
        """Bind to an engine whose schema is at head."""
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    # -- results: any replica → the leader -----------------------------------------------------------
    def save_result(
        self, *, command_id: str, node_id: str, result: bytes, replica_id: str, now_unix_ns: int, relayed: bool = False
    ) -> bool:
        """Keep a result until the leader applies it (relayed: until its sender collects it); True if new.

        A repeat of a kept one is ignored.
        """
        with self._sessions.begin() as session:
            if session.get(schema.CommandResultRow, command_id) is not None:
                return False
            session.add(
                schema.CommandResultRow(
                    command_id=command_id,
                    node_id=node_id,
                    result=result,
                    received_unix_ns=now_unix_ns,
                    replica_id=replica_id,
                    relayed=relayed,
                )
            )
            return True

    def save_results(self, rows: Sequence[tuple[str, str, bytes, str, int, bool]]) -> list[bool]:
        """`save_result` of several in one transaction: (command_id, node_id, result, replica_id, now, relayed) each.

        A power period's caps come back from every node of a replica at once (`Relay.result` groups
        them): at 2,000 nodes a transaction each kept a follower's store thread busy for seconds,
        and caps expired before the leader read their results. True per row that was new.
        """
        ids = [row[0] for row in rows]
        with self._sessions.begin() as session:
            kept = set(
                session.scalars(
                    sa.select(schema.CommandResultRow.command_id).where(schema.CommandResultRow.command_id.in_(ids))
                )
            )
            outcomes = []
            for command_id, node_id, result, replica_id, now_unix_ns, relayed in rows:
                outcomes.append(command_id not in kept)
                if command_id in kept:
                    continue
                kept.add(command_id)  # a repeat within the group too
                session.add(
                    schema.CommandResultRow(command_id=command_id, node_id=node_id, result=result,
                                            received_unix_ns=now_unix_ns, replica_id=replica_id, relayed=relayed)
                )  # fmt: skip
        return outcomes

    def results(self, limit: int = 1000) -> list[tuple[str, str, bytes]]:
        """Kept results for the ladder, oldest first: (command_id, node_id, serialized ActionResult).

        Results of relayed commands are left out: their sender collects them (`results_for`). They
        are marked when stored, not found by an anti-join with `relayed_commands`: with a power
        period's caps in flight that join, every poll, took a third of the leader's store thread.
        """
        with self._sessions() as session:
            rows = session.scalars(
                sa.select(schema.CommandResultRow)
                .where(schema.CommandResultRow.relayed.is_(False))
                .order_by(schema.CommandResultRow.received_unix_ns)
                .limit(limit)
            )
            return [(r.command_id, r.node_id, r.result) for r in rows]

    def results_of(self, command_ids: Collection[str]) -> dict[str, bytes]:
        """Kept results of these commands (serialized ActionResult by command id)."""
        if not command_ids:
            return {}
        with self._sessions() as session:
            rows = session.scalars(
                sa.select(schema.CommandResultRow).where(schema.CommandResultRow.command_id.in_(list(command_ids)))
            )
            return {r.command_id: r.result for r in rows}

    def results_for(self, sender_replica_id: str) -> dict[str, bytes]:
        """Kept results of the commands this replica relayed (serialized ActionResult by command id).

        Found through the sender's relayed rows, not by naming the ids: a power period waits on a
        command per node, and an IN list of 12,500 ids each poll cost the leader a fifth of its core.
        """
        relayed, results = schema.RelayedCommandRow, schema.CommandResultRow
        query = (
            sa.select(results.command_id, results.result)
            .join(relayed, relayed.command_id == results.command_id)
            .where(relayed.replica_id == sender_replica_id)
        )
        with self._sessions() as session:
            return {command_id: payload for command_id, payload in session.execute(query)}

    # -- relayed commands: any replica → the replica holding the node's stream --------------------------
    def relay_command(
        self, *, command_id: str, node_id: str, command: bytes, replica_id: str, now_unix_ns: int, expires_unix_ns: int
    ) -> None:
        """Leave a command for whichever replica holds the node's stream."""
        self.relay_commands([(command_id, node_id, command, replica_id, now_unix_ns, expires_unix_ns)])

    def relay_commands(self, rows: Sequence[tuple[str, str, bytes, str, int, int]]) -> list[None]:
        """Leave several commands in one transaction: (command_id, node_id, command, replica_id, now, expires) each.

        One per waiting sender (`Courier.send_command` groups them): a power period sends one
        SetPowerCap per node, and a transaction each kept the leader's store thread busy.
        """
        if not rows:
            return []
        values = [
            {"command_id": command_id, "node_id": node_id, "command": command, "replica_id": replica_id,
             "created_unix_ns": now_unix_ns, "expires_unix_ns": expires_unix_ns}
            for command_id, node_id, command, replica_id, now_unix_ns, expires_unix_ns in rows
        ]  # fmt: skip
        # One multi-row INSERT, not the ORM's unit of work: 12,500 objects a period cost the leader seconds.
        with self.engine.begin() as connection:
            connection.execute(sa.insert(schema.RelayedCommandRow.__table__), values)
        return [None] * len(rows)

    def forget_relayed_groups(self, groups: Sequence[tuple[Collection[str]]]) -> list[None]:
        """`forget_relayed` for several senders' command ids at once (one transaction)."""
        self.forget_relayed([command_id for (command_ids,) in groups for command_id in command_ids])
        return [None] * len(groups)

    def relayed_commands(
        self, now_unix_ns: int, node_ids: Collection[str] | None = None
    ) -> list[tuple[str, str, bytes]]:
        """Relayed commands not yet expired, oldest first: (command_id, node_id, serialized Command).

        node_ids: only those to these nodes (a replica's own streams: in a cap wave of 12,500 nodes on
        six replicas, each reads its sixth, not every row), `RELAYED_NODES_PER_QUERY` to a query.
        """
        table = schema.RelayedCommandRow.__table__
        query = sa.select(table.c.command_id, table.c.node_id, table.c.command, table.c.created_unix_ns).where(
            table.c.expires_unix_ns > now_unix_ns
        )
        with self.engine.connect() as connection:
            if node_ids is None:
                rows = list(connection.execute(query))
            else:
                rows = repo.rows_for_ids(
                    connection.execute, query, table.c.node_id, list(node_ids), RELAYED_NODES_PER_QUERY
                )
        rows.sort(key=lambda row: row.created_unix_ns)
        return [(row.command_id, row.node_id, row.command) for row in rows]

    def forget_relayed(self, command_ids: Collection[str]) -> None:
        """Drop relayed commands and their results (answered, or given up by the sender)."""
        if not command_ids:
            return
        ids = list(command_ids)
        with self._sessions.begin() as session:
            session.execute(sa.delete(schema.RelayedCommandRow).where(schema.RelayedCommandRow.command_id.in_(ids)))
            session.execute(sa.delete(schema.CommandResultRow).where(schema.CommandResultRow.command_id.in_(ids)))

    def forget_expired(self, before_unix_ns: int) -> int:
        """Drop relayed commands that expired before then, with their results; how many commands.

        Their senders gave up on them, or died waiting (a leader SIGKILLed mid-period): nobody
        withdraws them otherwise, and a result kept for a relayed command never reaches the ladder.
        """
        table = schema.RelayedCommandRow
        with self._sessions.begin() as session:
            ids = list(session.scalars(sa.select(table.command_id).where(table.expires_unix_ns < before_unix_ns)))
            if ids:
                session.execute(sa.delete(table).where(table.command_id.in_(ids)))
                session.execute(sa.delete(schema.CommandResultRow).where(schema.CommandResultRow.command_id.in_(ids)))
        return len(ids)

    def forget_results(self, command_ids: Collection[str]) -> None:
        """Drop results the leader has applied."""
        if not command_ids:
            return
        with self._sessions.begin() as session:
            session.execute(
                sa.delete(schema.CommandResultRow).where(schema.CommandResultRow.command_id.in_(list(command_ids)))
            )

    # -- straggler effects: any replica → the leader, in order ----------------------------------------
    def keep_straggler_effects(
        self, effects: Sequence[straggler_actions.Effect], *, replica_id: str, now_unix_ns: int
    ) -> None:
        """Keep a watch's effects, in order, until the leader carries them out (one transaction)."""
        if not effects:
            return
        with self._sessions.begin() as session:
            session.add_all(
                schema.StragglerEffectRow(
                    created_unix_ns=now_unix_ns, replica_id=replica_id, kind=effect.kind, node_id=effect.node_id,
                    gpu_uuid=effect.gpu_uuid, reason=effect.reason, to_w=effect.to_w,
                )
                for effect in effects
            )  # fmt: skip

    def straggler_effects(self, limit: int = 1000) -> list[tuple[int, straggler_actions.Effect]]:
        """The oldest kept effects, in the order they were kept, with their ids."""
        table = schema.StragglerEffectRow
        with self._sessions() as session:
            rows = session.scalars(sa.select(table).order_by(table.effect_id).limit(limit)).all()
        return [
            (row.effect_id, straggler_actions.Effect(row.kind, row.gpu_uuid, row.node_id, row.reason, row.to_w))
            for row in rows
        ]

    def forget_straggler_effects(self, effect_ids: Collection[int]) -> None:
        """Drop effects the leader has carried out."""
        if not effect_ids:
            return
        table = schema.StragglerEffectRow
        with self._sessions.begin() as session:
            session.execute(sa.delete(table).where(table.effect_id.in_(list(effect_ids))))

    # -- events: found by acked position vs. watermark ------------------------------------------------
    def nodes_with_new_events(self) -> list[str]:
        """Nodes whose gap-free stored events go past what the ladder has consumed."""
        with self._sessions() as session:
            marks = {
                row.name.removeprefix(rstore.WATERMARK_PREFIX): row.state
                for row in session.scalars(
                    sa.select(schema.ControllerStateRow).where(
                        schema.ControllerStateRow.name.startswith(rstore.WATERMARK_PREFIX)
                    )
                )
            }
            nodes = session.execute(
                sa.select(schema.NodeRow.node_id, schema.NodeRow.spool_epoch, schema.NodeRow.acked_seq).where(
                    schema.NodeRow.acked_seq > 0
                )
            ).all()
        dirty = []
        for node_id, epoch, acked in nodes:
            mark = marks.get(node_id)
            if mark is None or int(mark["epoch"]) != int(epoch or 0) or int(acked) > int(mark["seq"]):
                dirty.append(node_id)
        return sorted(dirty)

    def new_events(self, node_ids: Sequence[str]) -> dict[str, tuple[dict[str, str], list[repo.StoredEvent]]]:
        """Per node: its labels and its stored, acked events past the ladder's watermark, in seq order."""
        out: dict[str, tuple[dict[str, str], list[repo.StoredEvent]]] = {}
        if not node_ids:
            return out
        with self._sessions() as session:
            names = [rstore.WATERMARK_PREFIX + n for n in node_ids]
            marks = {
                row.name.removeprefix(rstore.WATERMARK_PREFIX): row.state
                for row in session.scalars(
                    sa.select(schema.ControllerStateRow).where(schema.ControllerStateRow.name.in_(names))
                )
            }
            for node in session.scalars(sa.select(schema.NodeRow).where(schema.NodeRow.node_id.in_(list(node_ids)))):
                mark = marks.get(node.node_id) or {"epoch": -1, "seq": 0}
                epoch = int(node.spool_epoch or 0)
                after = int(mark["seq"]) if int(mark["epoch"]) == epoch else 0
                rows = session.scalars(
                    sa.select(schema.HealthEventRow)
                    .where(
                        schema.HealthEventRow.node_id == node.node_id,
                        schema.HealthEventRow.spool_epoch == epoch,
                        schema.HealthEventRow.seq > after,
                        schema.HealthEventRow.seq <= int(node.acked_seq or 0),
                    )
                    .order_by(schema.HealthEventRow.seq)
                ).all()
                if rows:
                    out[node.node_id] = (dict(node.labels or {}), [rstore.stored_event(r) for r in rows])
        return out

    def node_connected(self, node_id: str) -> bool:
        """Whether some replica holds a stream of the node now (its row's connected flag)."""
        with self._sessions() as session:
            return bool(
                session.execute(
                    sa.select(schema.NodeRow.connected).where(schema.NodeRow.node_id == node_id)
                ).scalar_one_or_none()
            )

    def connected_inventory(self) -> dict[str, tuple[dict[str, str], tuple[str, ...]]]:
        """Every node some replica holds a stream of: its topology labels and GPU UUIDs (last Hello)."""
        with self._sessions() as session:
            nodes = session.execute(
                sa.select(schema.NodeRow.node_id, schema.NodeRow.labels).where(schema.NodeRow.connected.is_(True))
            ).all()
            gpus: dict[str, list[str]] = {}
            for node_id, uuid in session.execute(
                sa.select(schema.GpuRow.node_id, schema.GpuRow.uuid)
                .join(schema.NodeRow, schema.NodeRow.node_id == schema.GpuRow.node_id)
                .where(schema.NodeRow.connected.is_(True))
                .order_by(schema.GpuRow.node_id, schema.GpuRow.uuid)
            ):
                gpus.setdefault(node_id, []).append(uuid)
        return {node_id: (dict(labels or {}), tuple(gpus.get(node_id, ()))) for node_id, labels in nodes}
