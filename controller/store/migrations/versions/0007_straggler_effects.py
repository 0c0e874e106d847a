"""The straggler watch's effects, kept for the leader (straggler_effects).

Every replica's watch judges the GPUs whose streams it holds, but only the leader's ladder and power
loop can act on a suspect; before this table a watch with several replicas only counted and listed
its suspects. Each replica now keeps its effects here and the leader carries them out in order.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07 00:42:59.372905
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "straggler_effects",
        sa.Column("effect_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("created_unix_ns", sa.BigInteger(), nullable=False),
        sa.Column("replica_id", sa.String(length=253), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("node_id", sa.String(length=253), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("to_w", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("effect_id", name=op.f("pk_straggler_effects")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("straggler_effects")
