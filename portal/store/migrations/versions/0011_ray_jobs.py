"""Ray jobs.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 04:30:00

A Ray job keeps its spec (entrypoint, runtime environment, metadata: JSON), the cluster it
runs on, where it stands, and its attempts (a short JSON list). Written out by hand and
frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = 64
NAME = 253


def upgrade() -> None:
    op.create_table(
        "ray_jobs",
        sa.Column("id", sa.String(ID), nullable=False),
        sa.Column("tenant", sa.String(NAME), nullable=False),
        sa.Column("owner", sa.String(NAME), nullable=False),
        sa.Column("cluster_id", sa.String(ID), nullable=False),
        sa.Column("one_off", sa.Boolean(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"], ["ray_clusters.id"], name="fk_ray_jobs_cluster_id_ray_clusters"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_ray_jobs"),
    )
    op.create_index("ix_ray_jobs_tenant_created_at", "ray_jobs", ["tenant", "created_at"])
    op.create_index("ix_ray_jobs_state", "ray_jobs", ["state"])


def downgrade() -> None:
    op.drop_index("ix_ray_jobs_state", table_name="ray_jobs")
    op.drop_index("ix_ray_jobs_tenant_created_at", table_name="ray_jobs")
    op.drop_table("ray_jobs")
