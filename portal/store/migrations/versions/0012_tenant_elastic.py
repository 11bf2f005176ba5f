"""Per-tenant elastic-job settings.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 12:00:00

A tenant's elastic policy (grow threshold and window, idle time and level) and the limits a
platform admin sets for the tenant's own admins. A tenant without a row has the defaults of
``policies.elastic``. Written out by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = 253
_NUMBERS = (
    "threshold",
    "window_s",
    "idle_s",
    "idle_below",
    "min_threshold",
    "min_window_s",
    "max_idle_s",
)


def upgrade() -> None:
    op.create_table(
        "tenant_elastic",
        sa.Column("tenant", sa.String(NAME), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=False) for name in _NUMBERS),
        sa.Column("updated_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant"],
            ["tenants.name"],
            name="fk_tenant_elastic_tenant_tenants",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant", name="pk_tenant_elastic"),
    )


def downgrade() -> None:
    op.drop_table("tenant_elastic")
