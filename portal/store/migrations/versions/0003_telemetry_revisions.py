"""Telemetry revisions: a counter per roll-up step and hour, bumped when its roll-ups change.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 19:00:00

Written out by hand and frozen, like 0001. An existing database starts with no rows: every
hour reads revision 0 until its roll-ups are next written or pruned.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "telemetry_revisions",
        sa.Column("step_s", sa.Integer(), nullable=False),
        sa.Column("hour_ms", sa.BigInteger(), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("step_s", "hour_ms", name="pk_telemetry_revisions"),
    )


def downgrade() -> None:
    op.drop_table("telemetry_revisions")
