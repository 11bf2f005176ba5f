"""Quota ceilings: the most a tenant's own admins may guarantee and allow, per flavor.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 23:20:00

Guarantees are the platform's to give: the platform admin sets, per tenant and flavor, the
ceilings within which the tenant's admins edit ``guaranteed`` and ``limit``. Existing quotas
were set before ceilings existed; each gets its current values as its ceilings, so nothing a
tenant has is taken away and nothing more is given.

Written out by hand and frozen, like 0001. The columns are added with a default that fills the
existing rows, then the default is dropped (SQLite copies the table in Alembic's batch mode).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CEILINGS = {"ceiling_guaranteed": "guaranteed", "ceiling_limit": "limit"}


def upgrade() -> None:
    with op.batch_alter_table("quotas") as batch:
        for column in _CEILINGS:
            batch.add_column(sa.Column(column, sa.BigInteger(), nullable=False, server_default="0"))
    quotas = sa.table("quotas", *(sa.column(c) for c in (*_CEILINGS, *_CEILINGS.values())))
    op.execute(quotas.update().values({c: quotas.c[v] for c, v in _CEILINGS.items()}))
    with op.batch_alter_table("quotas") as batch:
        for column in _CEILINGS:
            batch.alter_column(column, existing_type=sa.BigInteger(), server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("quotas") as batch:
        for column in _CEILINGS:
            batch.drop_column(column)
