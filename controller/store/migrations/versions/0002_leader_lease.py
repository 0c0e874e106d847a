"""Leader lease and result relay: the tables that let several controller replicas share one store.

leader_lease holds the elected leader, its lease expiry and the fencing token (rasd.controller.core
.lease); command_results holds command results a replica received until the leader applies them;
relayed_commands holds commands sent outside the ladder's outbox (e.g. power caps) until the replica
holding the node's stream has sent them.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 08:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "leader_lease",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=253), nullable=False),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("expires_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("acquired_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("renewed_unix_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leader_lease")),
    )
    op.create_table(
        "command_results",
        sa.Column("command_id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("result", sa.LargeBinary(), nullable=False),
        sa.Column("received_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("replica_id", sa.String(length=253), nullable=False),
        sa.PrimaryKeyConstraint("command_id", name=op.f("pk_command_results")),
    )
    op.create_index(op.f("ix_command_results_received_unix_ns"), "command_results", ["received_unix_ns"], unique=False)
    op.create_table(
        "relayed_commands",
        sa.Column("command_id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("command", sa.LargeBinary(), nullable=False),
        sa.Column("created_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("expires_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("replica_id", sa.String(length=253), nullable=False),
        sa.PrimaryKeyConstraint("command_id", name=op.f("pk_relayed_commands")),
    )
    op.create_index(op.f("ix_relayed_commands_node_id"), "relayed_commands", ["node_id"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index(op.f("ix_relayed_commands_node_id"), table_name="relayed_commands")
    op.drop_table("relayed_commands")
    op.drop_index(op.f("ix_command_results_received_unix_ns"), table_name="command_results")
    op.drop_table("command_results")
    op.drop_table("leader_lease")
