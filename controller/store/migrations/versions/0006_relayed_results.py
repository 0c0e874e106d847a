"""Whether a kept command result is a relayed command's (command_results.relayed).

The ladder read its results as "every result whose command is not a relayed one" (NOT IN over
relayed_commands): with a power period's 12,500 caps in flight that anti-join, every poll, held the
leader's store thread for a third of its time. The replica that delivered a relayed command now
marks its result. Results kept from before read false: a relayed one among them reaches the ladder,
which calls a result nobody waits for stale (harmless), and its sender waits out its timeout.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06 20:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("command_results") as batch:
        batch.add_column(sa.Column("relayed", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("command_results") as batch:
        batch.drop_column("relayed")
