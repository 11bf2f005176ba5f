"""Elastic training jobs.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07 04:30:00

Each attempt records the world size it ran with: an elastic job's members change with every
resize. Rows written before keep null (they ran with the job's fixed ``members``). Written out
by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.add_column(sa.Column("world_size", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("world_size")
