"""Utilization becomes optional: raw samples and device roll-ups may hold "not measured".

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 03:40:00

A MIG instance on a GPU without GPU Performance Monitoring (A100, A30) has no utilization
counter, yet its memory, and its GPU's temperature, power, throttling and errors, are
measured: the sample is stored with ``utilization_pct`` NULL, and a minute or hour without
any measured sample rolls up to NULL utilization rather than 0 %. Workload tables were
nullable from 0002 on. Existing rows keep their values.

Written out by hand and frozen, like 0001. SQLite cannot alter a column's nullability, so
there each table is copied into a new one (Alembic's batch mode), keys and indexes included.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = {
    "telemetry_samples": ("utilization_pct",),
    "telemetry_rollups": ("utilization_avg", "utilization_min", "utilization_max"),
}


def _set_nullable(nullable: bool) -> None:
    for table, columns in _COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            for column in columns:
                batch.alter_column(column, existing_type=sa.Float(), nullable=nullable)


def upgrade() -> None:
    _set_nullable(True)


def downgrade() -> None:
    # NOT NULL again: rows without a measurement cannot stay, and 0 % would be a lie.
    for table, columns in _COLUMNS.items():
        t = sa.table(table, *(sa.column(c) for c in columns))
        op.execute(t.delete().where(sa.or_(*(t.c[c].is_(None) for c in columns))))
    _set_nullable(False)
