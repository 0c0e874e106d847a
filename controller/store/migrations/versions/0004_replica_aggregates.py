"""What each replica ships the leader for the fleet-wide loops (replica_aggregates).

One row per replica: its latest `core.aggregates.ReplicaAggregate`, upserted at least once per
control period and read by the leader's power loop and SDC sweeps (issue #36).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 17:45:49.003175
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "replica_aggregates",
        sa.Column("replica_id", sa.String(length=253), nullable=False),
        sa.Column("built_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("format_version", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("replica_id", name=op.f("pk_replica_aggregates")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("replica_aggregates")
