"""The agent spool's identity on the node row (nodes.spool_id, from Hello.spool_id).

A spool that started over (state dir wiped, node reimaged) is a new epoch also when its head has
already passed the old acked position: before, it was welcomed with that position and the agent
deleted its new, unsent events up to it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 09:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("spool_id", sa.String(length=64), nullable=False, server_default=""))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("spool_id")
