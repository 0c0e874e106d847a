"""Whether a GPU's node still lists it (gpus.listed), so that a GPU changes node only on evidence.

A node's Hello that named another node's GPUs moved them to itself, and the real owner was then
refused as the impostor. A GPU now changes node only once its node's own Hello left it out (or an
operator said it moved); `listed` records that. Every GPU row there is was listed by its node's
last Hello as far as this database can tell: true.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04 18:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("gpus") as batch:
        batch.add_column(sa.Column("listed", sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("gpus") as batch:
        batch.drop_column("listed")
