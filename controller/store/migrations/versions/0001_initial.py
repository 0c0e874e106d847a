"""Initial schema: every table of schema.py at the start of migrations.

Inventory (nodes, gpus), health_events, and the remediation tables: remediation_states,
controller_states, commands (the outbox), incidents, repair_tickets, quarantines, validations,
rma_tickets, audit_log. Constraint and index names follow schema.NAMING_CONVENTION, so they are the
same on SQLite and PostgreSQL.

Revision ID: 0001
Revises:
Create Date: 2026-11-30 06:19:47.317304
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(length=64), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(op.f("ix_audit_log_at_unix_ns"), "audit_log", ["at_unix_ns"], unique=False)
    op.create_table(
        "commands",
        sa.Column("command_id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("ticket_id", sa.String(length=512), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("dispatched_unix_ns", sa.BigInteger(), nullable=True),
        sa.Column("finished_unix_ns", sa.BigInteger(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("command_id", name=op.f("pk_commands")),
    )
    op.create_index(op.f("ix_commands_node_id"), "commands", ["node_id"], unique=False)
    op.create_index(op.f("ix_commands_status"), "commands", ["status"], unique=False)
    op.create_index(op.f("ix_commands_ticket_id"), "commands", ["ticket_id"], unique=False)
    op.create_table(
        "controller_states",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("updated_unix_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_controller_states")),
    )
    op.create_table(
        "incidents",
        sa.Column("incident_id", sa.String(length=512), nullable=False),
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("cause", sa.String(length=128), nullable=False),
        sa.Column("component", sa.String(length=32), nullable=False),
        sa.Column("severity", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("opened_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("closed_unix_ns", sa.BigInteger(), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("incident_id", name=op.f("pk_incidents")),
    )
    op.create_index(op.f("ix_incidents_node_id"), "incidents", ["node_id"], unique=False)
    op.create_index(op.f("ix_incidents_state"), "incidents", ["state"], unique=False)
    op.create_table(
        "nodes",
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("hostname", sa.String(length=253), nullable=False),
        sa.Column("boot_id", sa.String(length=64), nullable=False),
        sa.Column("agent_version", sa.String(length=64), nullable=False),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("state", sa.Integer(), nullable=False),
        sa.Column("connected", sa.Boolean(), nullable=False),
        sa.Column("first_seen_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("spool_epoch", sa.Integer(), nullable=False),
        sa.Column("acked_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_nodes")),
    )
    op.create_table(
        "quarantines",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("port", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("since_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("released_unix_ns", sa.BigInteger(), nullable=True),
        sa.Column("release_reason", sa.Text(), nullable=False),
        sa.Column("forced", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quarantines")),
    )
    op.create_index(op.f("ix_quarantines_node_id"), "quarantines", ["node_id"], unique=False)
    op.create_index(op.f("ix_quarantines_released_unix_ns"), "quarantines", ["released_unix_ns"], unique=False)
    op.create_table(
        "remediation_states",
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("updated_unix_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_remediation_states")),
    )
    op.create_table(
        "repair_tickets",
        sa.Column("ticket_id", sa.String(length=512), nullable=False),
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("incident_id", sa.String(length=512), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("rung", sa.String(length=32), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("opened_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("updated_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("closed", sa.Boolean(), nullable=False),
        sa.Column("steps", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("ticket_id", name=op.f("pk_repair_tickets")),
    )
    op.create_index(op.f("ix_repair_tickets_closed"), "repair_tickets", ["closed"], unique=False)
    op.create_index(op.f("ix_repair_tickets_node_id"), "repair_tickets", ["node_id"], unique=False)
    op.create_index(op.f("ix_repair_tickets_state"), "repair_tickets", ["state"], unique=False)
    op.create_table(
        "rma_tickets",
        sa.Column("rma_id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("opened_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("approved_by", sa.String(length=128), nullable=False),
        sa.Column("approved_unix_ns", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("rma_id", name=op.f("pk_rma_tickets")),
    )
    op.create_index(op.f("ix_rma_tickets_node_id"), "rma_tickets", ["node_id"], unique=False)
    op.create_index(op.f("ix_rma_tickets_state"), "rma_tickets", ["state"], unique=False)
    op.create_table(
        "validations",
        sa.Column("validation_id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("suite", sa.String(length=32), nullable=False),
        sa.Column("command_id", sa.String(length=64), nullable=False),
        sa.Column("verdict", sa.String(length=32), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("started_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("finished_unix_ns", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("validation_id", name=op.f("pk_validations")),
    )
    op.create_index(op.f("ix_validations_node_id"), "validations", ["node_id"], unique=False)
    op.create_table(
        "gpus",
        sa.Column("uuid", sa.String(length=96), nullable=False),
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("model", sa.String(length=96), nullable=False),
        sa.Column("pci_bus_id", sa.String(length=32), nullable=False),
        sa.Column("serial", sa.String(length=64), nullable=False),
        sa.Column("vbios_version", sa.String(length=64), nullable=False),
        sa.Column("memory_total_mib", sa.BigInteger(), nullable=False),
        sa.Column("power_limit_min_w", sa.Integer(), nullable=False),
        sa.Column("power_limit_max_w", sa.Integer(), nullable=False),
        sa.Column("power_limit_default_w", sa.Integer(), nullable=False),
        sa.Column("power_smoothing_supported", sa.Boolean(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("state", sa.Integer(), nullable=False),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("power_sample_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("enforced_power_limit_w", sa.Integer(), nullable=True),
        sa.Column("temperature_c", sa.Integer(), nullable=True),
        sa.Column("utilization_gpu_pct", sa.Integer(), nullable=True),
        sa.Column("clock_event_reasons", sa.BigInteger(), nullable=True),
        sa.Column("counters_unix_ns", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.node_id"], name=op.f("fk_gpus_node_id_nodes")),
        sa.PrimaryKeyConstraint("uuid", name=op.f("pk_gpus")),
    )
    op.create_index(op.f("ix_gpus_node_id"), "gpus", ["node_id"], unique=False)
    op.create_table(
        "health_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("spool_epoch", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("observed_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("received_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.Integer(), nullable=False),
        sa.Column("severity", sa.Integer(), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=False),
        sa.Column("xid", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("attributes", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.node_id"], name=op.f("fk_health_events_node_id_nodes")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_health_events")),
        sa.UniqueConstraint("node_id", "spool_epoch", "seq", name="uq_health_event_node_seq"),
    )
    op.create_index(op.f("ix_health_events_node_id"), "health_events", ["node_id"], unique=False)
    op.create_index(op.f("ix_health_events_received_unix_ns"), "health_events", ["received_unix_ns"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index(op.f("ix_health_events_received_unix_ns"), table_name="health_events")
    op.drop_index(op.f("ix_health_events_node_id"), table_name="health_events")
    op.drop_table("health_events")
    op.drop_index(op.f("ix_gpus_node_id"), table_name="gpus")
    op.drop_table("gpus")
    op.drop_index(op.f("ix_validations_node_id"), table_name="validations")
    op.drop_table("validations")
    op.drop_index(op.f("ix_rma_tickets_state"), table_name="rma_tickets")
    op.drop_index(op.f("ix_rma_tickets_node_id"), table_name="rma_tickets")
    op.drop_table("rma_tickets")
    op.drop_index(op.f("ix_repair_tickets_state"), table_name="repair_tickets")
    op.drop_index(op.f("ix_repair_tickets_node_id"), table_name="repair_tickets")
    op.drop_index(op.f("ix_repair_tickets_closed"), table_name="repair_tickets")
    op.drop_table("repair_tickets")
    op.drop_table("remediation_states")
    op.drop_index(op.f("ix_quarantines_released_unix_ns"), table_name="quarantines")
    op.drop_index(op.f("ix_quarantines_node_id"), table_name="quarantines")
    op.drop_table("quarantines")
    op.drop_table("nodes")
    op.drop_index(op.f("ix_incidents_state"), table_name="incidents")
    op.drop_index(op.f("ix_incidents_node_id"), table_name="incidents")
    op.drop_table("incidents")
    op.drop_table("controller_states")
    op.drop_index(op.f("ix_commands_ticket_id"), table_name="commands")
    op.drop_index(op.f("ix_commands_status"), table_name="commands")
    op.drop_index(op.f("ix_commands_node_id"), table_name="commands")
    op.drop_table("commands")
    op.drop_index(op.f("ix_audit_log_at_unix_ns"), table_name="audit_log")
    op.drop_table("audit_log")
