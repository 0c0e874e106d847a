"""SQLAlchemy 2 models of what the controller keeps durably.

SQL holds inventory, states, the latest telemetry per GPU and health events. High-rate power series
stay in memory and in Prometheus (DESIGN.md §8). Timestamps are Unix nanoseconds in BIGINT columns:
one representation on SQLite and PostgreSQL, and no time-zone surprises.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy import false as sa_false
from sqlalchemy import true as sa_true
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Every constraint and index gets a deterministic name, the same on SQLite and PostgreSQL, so a
# migration can name what it alters or drops (SQLite batch mode needs the names too). Explicit names
# (uq_health_event_node_seq) win over these templates. Changing a template renames constraints: that
# needs a migration, and the migration test fails until there is one.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of every rasd table.

    Tables are created and changed only by the Alembic migrations in rasd.controller.store.migrations,
    never by `metadata.create_all`: a change here needs a migration (see migrations/README.md).
    """

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class NodeRow(Base):
    """A node that has connected at least once."""

    __tablename__ = "nodes"

    node_id: Mapped[str] = mapped_column(String(253), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(253), default="")
    boot_id: Mapped[str] = mapped_column(String(64), default="")
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    backend: Mapped[str] = mapped_column(String(32), default="")
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # rasd.controller.core.fleet.ComponentState value.
    state: Mapped[int] = mapped_column(Integer, default=1)
    connected: Mapped[bool] = mapped_column(Boolean, default=False)
    first_seen_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    last_seen_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    # Which generation of the agent's spool the seqs below belong to; bumped when an agent's spool
    # starts over (state dir wiped), so its new seq 1 is not mistaken for an old duplicate.
    spool_epoch: Mapped[int] = mapped_column(Integer, default=0)
    # Every event of this epoch with seq <= acked_seq is stored.
    acked_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    # The identity of the spool this epoch's seqs come from (Hello.spool_id; "" before one was sent).
    spool_id: Mapped[str] = mapped_column(String(64), default="", server_default="")


class GpuRow(Base):
    """A GPU as inventoried by its node, with its latest telemetry."""

    __tablename__ = "gpus"

    uuid: Mapped[str] = mapped_column(String(96), primary_key=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.node_id"), index=True)
    model: Mapped[str] = mapped_column(String(96), default="")
    pci_bus_id: Mapped[str] = mapped_column(String(32), default="")
    serial: Mapped[str] = mapped_column(String(64), default="")
    vbios_version: Mapped[str] = mapped_column(String(64), default="")
    memory_total_mib: Mapped[int] = mapped_column(BigInteger, default=0)
    power_limit_min_w: Mapped[int] = mapped_column(Integer, default=0)
    power_limit_max_w: Mapped[int] = mapped_column(Integer, default=0)
    power_limit_default_w: Mapped[int] = mapped_column(Integer, default=0)
    power_smoothing_supported: Mapped[bool] = mapped_column(Boolean, default=False)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[int] = mapped_column(Integer, default=1)
    # Whether node_id's last Hello listed it. Its owner changes only once this is false (the node's
    # own Hello left it out, or an operator said it moved): another node's Hello alone never takes it.
    listed: Mapped[bool] = mapped_column(Boolean, default=True, server_default=sa_true())
    # Latest telemetry, flushed from memory every few seconds.
    power_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_sample_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    enforced_power_limit_w: Mapped[int | None] = mapped_column(Integer, nullable=True)
    temperature_c: Mapped[int | None] = mapped_column(Integer, nullable=True)
    utilization_gpu_pct: Mapped[int | None] = mapped_column(Integer, nullable=True)
    clock_event_reasons: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    counters_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)


class HealthEventRow(Base):
    """A health event exactly as the agent reported it, stored once per (node, epoch, seq)."""

    __tablename__ = "health_events"
    __table_args__ = (UniqueConstraint("node_id", "spool_epoch", "seq", name="uq_health_event_node_seq"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.node_id"), index=True)
    spool_epoch: Mapped[int] = mapped_column(Integer, default=0)
    seq: Mapped[int] = mapped_column(BigInteger)
    observed_unix_ns: Mapped[int] = mapped_column(BigInteger)
    received_unix_ns: Mapped[int] = mapped_column(BigInteger, index=True)
    # rasd.api.v1.EventKind / Severity values.
    kind: Mapped[int] = mapped_column(Integer)
    severity: Mapped[int] = mapped_column(Integer, default=0)
    gpu_uuid: Mapped[str] = mapped_column(String(96), default="")
    xid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(32), default="")
    attributes: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


# -- remediation (the repair ladder's durable state, its outbox and what operators see) ------------------


class RemediationStateRow(Base):
    """One node's repair-ladder state (rasd.controller.core.remediation.escalation.RemediationState.to_dict())."""

    __tablename__ = "remediation_states"

    node_id: Mapped[str] = mapped_column(String(253), primary_key=True)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)


class ControllerStateRow(Base):
    """Fleet-wide pure-core state as named documents: "budget", "correlation/...", "watermark/..."."""

    __tablename__ = "controller_states"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)


class CommandRow(Base):
    """The outbox: every action a decision produced, keyed by its idempotency id.

    status: pending (decided, not admitted) → dispatched → succeeded | failed | timed_out |
    refused | not_supported | dry_run; or cancelled (superseded). A dispatched command the ladder
    stops waiting for without a result is finished too, so that it is never sent again: timed_out
    when its wait ran out, cancelled when a later decision superseded it; its result says so.
    """

    __tablename__ = "commands"

    command_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(253), index=True)
    gpu_uuid: Mapped[str] = mapped_column(String(96), default="")
    ticket_id: Mapped[str] = mapped_column(String(512), default="", index=True)
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True, default="pending")
    reason: Mapped[str] = mapped_column(Text, default="")
    created_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    dispatched_unix_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    finished_unix_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class IncidentRow(Base):
    """A correlated fault: one root cause, with its folded duplicates and secondaries."""

    __tablename__ = "incidents"

    incident_id: Mapped[str] = mapped_column(String(512), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(253), index=True)
    gpu_uuid: Mapped[str] = mapped_column(String(96), default="")
    cause: Mapped[str] = mapped_column(String(128))
    component: Mapped[str] = mapped_column(String(32), default="")
    severity: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default="open", index=True)
    opened_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    closed_unix_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class RepairTicketRow(Base):
    """A repair ticket as operators see it (projection of the node's remediation state)."""

    __tablename__ = "repair_tickets"

    ticket_id: Mapped[str] = mapped_column(String(512), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(253), index=True)
    gpu_uuid: Mapped[str] = mapped_column(String(96), default="")
    incident_id: Mapped[str] = mapped_column(String(512), default="")
    state: Mapped[str] = mapped_column(String(32), index=True)
    rung: Mapped[str] = mapped_column(String(32), default="")
    purpose: Mapped[str] = mapped_column(String(32), default="")
    reason: Mapped[str] = mapped_column(Text, default="")
    opened_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    closed: Mapped[bool] = mapped_column(Boolean, default=False, index=True)
    steps: Mapped[list[Any]] = mapped_column(JSON, default=list)


class QuarantineRow(Base):
    """A node, GPU or port taken out of scheduling, and its release."""

    __tablename__ = "quarantines"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(253), index=True)
    gpu_uuid: Mapped[str] = mapped_column(String(96), default="")
    port: Mapped[str] = mapped_column(String(64), default="")
    reason: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(32), default="automation")
    since_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    released_unix_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)
    release_reason: Mapped[str] = mapped_column(Text, default="")
    forced: Mapped[bool] = mapped_column(Boolean, default=False)


class ValidationRow(Base):
    """One validation run and its verdict."""

    __tablename__ = "validations"

    validation_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(253), index=True)
    gpu_uuid: Mapped[str] = mapped_column(String(96), default="")
    suite: Mapped[str] = mapped_column(String(32))
    command_id: Mapped[str] = mapped_column(String(64), default="")
    verdict: Mapped[str] = mapped_column(String(32), default="")
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    started_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    finished_unix_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class RmaTicketRow(Base):
    """A return-merchandise request with its evidence bundle, pending operator approval."""

    __tablename__ = "rma_tickets"

    rma_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(253), index=True)
    gpu_uuid: Mapped[str] = mapped_column(String(96), default="")
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    opened_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    approved_by: Mapped[str] = mapped_column(String(128), default="")
    approved_unix_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class AuditRow(Base):
    """Append-only record of every state-changing admin call and every automated destructive action."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    at_unix_ns: Mapped[int] = mapped_column(BigInteger, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    node_id: Mapped[str] = mapped_column(String(253), default="")
    gpu_uuid: Mapped[str] = mapped_column(String(96), default="")
    reason: Mapped[str] = mapped_column(Text, default="")
    outcome: Mapped[str] = mapped_column(String(64), default="")
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


# -- replicas: leader election and the relay of results between replicas (DESIGN.md §8) ------------------


class LeaderLeaseRow(Base):
    """The leader's lease (rasd.controller.core.lease.Lease): one row per elected role ("controller")."""

    __tablename__ = "leader_lease"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(253), default="")
    # Grows by one per term; writes of the fleet-wide loops carry it and are refused once it moved on.
    fencing_token: Mapped[int] = mapped_column(BigInteger, default=0)
    # Database clock: after this, any replica may take the lease.
    expires_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    acquired_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    renewed_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)


class CommandResultRow(Base):
    """A command result an agent sent to some replica, kept until the leader has applied it."""

    __tablename__ = "command_results"

    command_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(253))
    # The rasd.api.v1.ActionResult as sent (serialized protobuf): verdicts and read-backs survive as-is.
    result: Mapped[bytes] = mapped_column(LargeBinary)
    received_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0, index=True)
    replica_id: Mapped[str] = mapped_column(String(253), default="")
    # A relayed command's (its sender collects it, `RelayStore.results_for`), not the ladder's.
    relayed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())


class RelayedCommandRow(Base):
    """A command some replica sends to a node whose stream another replica holds (outside the ladder's outbox)."""

    __tablename__ = "relayed_commands"

    command_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(253), index=True)
    # The rasd.api.v1.Command as the sender built it (serialized protobuf).
    command: Mapped[bytes] = mapped_column(LargeBinary)
    created_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    # After this the sender has given up: no replica sends it any more.
    expires_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    replica_id: Mapped[str] = mapped_column(String(253), default="")


class StragglerEffectRow(Base):
    """A straggler watch's effect on some replica, kept until the leader has carried it out (in id order).

    Each replica's watch judges the GPUs whose streams it holds; only the leader's ladder and power
    loop can act, so every replica's effects come here (`relay.Relay.take_straggler_effects`).
    """

    __tablename__ = "straggler_effects"

    effect_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    replica_id: Mapped[str] = mapped_column(String(253), default="")
    # rasd.controller.core.straggler_actions.Effect's fields.
    kind: Mapped[str] = mapped_column(String(32))
    node_id: Mapped[str] = mapped_column(String(253))
    gpu_uuid: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text, default="")
    to_w: Mapped[float | None] = mapped_column(Float, nullable=True)


class ReplicaAggregateRow(Base):
    """The latest aggregate a replica shipped the leader (`rasd.controller.core.aggregates`), one row per replica.

    Written with one upsert per ship, read by the leader in one query each control period. High-rate
    series do not come here: only each GPU's latest values and peaks, and the replica's share of the
    fleet's aggregate power over the detector's window.
    """

    __tablename__ = "replica_aggregates"

    replica_id: Mapped[str] = mapped_column(String(253), primary_key=True)
    # The shipping replica's clock; the leader ignores an aggregate much older than its own clock.
    built_unix_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    format_version: Mapped[int] = mapped_column(Integer, default=1)
    # `core.aggregates.encode`: compressed JSON in columns.
    payload: Mapped[bytes] = mapped_column(LargeBinary)
