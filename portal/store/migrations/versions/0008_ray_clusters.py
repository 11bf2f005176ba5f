"""Ray clusters and their slices.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 05:20:00

A Ray cluster keeps its spec (JSON) and where it stands; each slice of its workers is one
allocator workload of kind ``ray``. Written out by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = 64
NAME = 253


def upgrade() -> None:
    op.create_table(
        "ray_clusters",
        sa.Column("id", sa.String(ID), nullable=False),
        sa.Column("tenant", sa.String(NAME), nullable=False),
        sa.Column("owner", sa.String(NAME), nullable=False),
        sa.Column("name", sa.String(NAME), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("address", sa.String(NAME), nullable=True),
        sa.Column("head", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_ray_clusters"),
    )
    op.create_index("ix_ray_clusters_tenant_created_at", "ray_clusters", ["tenant", "created_at"])
    op.create_index("ix_ray_clusters_state", "ray_clusters", ["state"])
    op.create_table(
        "ray_slices",
        sa.Column("cluster_id", sa.String(ID), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.String(ID), nullable=False),
        sa.Column("workers", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("released_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"], ["ray_clusters.id"], name="fk_ray_slices_cluster_id_ray_clusters"
        ),
        sa.PrimaryKeyConstraint("cluster_id", "number", name="pk_ray_slices"),
    )


def downgrade() -> None:
    op.drop_table("ray_slices")
    op.drop_index("ix_ray_clusters_state", table_name="ray_clusters")
    op.drop_index("ix_ray_clusters_tenant_created_at", table_name="ray_clusters")
    op.drop_table("ray_clusters")
