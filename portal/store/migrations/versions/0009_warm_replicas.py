"""Warm replicas of services.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07 00:45:00

A replica started for a service's warm pool is marked ``warm``; ``woken_at`` is when it left
the pool to serve (the split between warm and serving GPU time). Rows written before keep
``warm`` false: they were serving replicas. Written out by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("service_replicas") as batch:
        batch.add_column(sa.Column("warm", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("woken_at", sa.DateTime(timezone=False), nullable=True))
    # The default only fills the rows already there; the model has none.
    with op.batch_alter_table("service_replicas") as batch:
        batch.alter_column("warm", existing_type=sa.Boolean(), server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("service_replicas") as batch:
        batch.drop_column("woken_at")
        batch.drop_column("warm")
