"""Inference services and their replicas.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 05:00:00

A service keeps its spec as submitted (JSON) and how many replicas it wants; each replica has
its own allocator workload (kind inference), its node, devices and port once placed, and why
it ended. Written out by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = 64
NAME = 253


def upgrade() -> None:
    op.create_table(
        "services",
        sa.Column("id", sa.String(ID), nullable=False),
        sa.Column("tenant", sa.String(NAME), nullable=False),
        sa.Column("owner", sa.String(NAME), nullable=False),
        sa.Column("name", sa.String(NAME), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("desired", sa.Integer(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("next_replica", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("last_request_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("deleted_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_services"),
    )
    op.create_index("ix_services_tenant_created_at", "services", ["tenant", "created_at"])
    op.create_index("ix_services_state", "services", ["state"])
    op.create_table(
        "service_replicas",
        sa.Column("service_id", sa.String(ID), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.String(ID), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("queued_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("node", sa.String(NAME), nullable=True),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("ready_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["service_id"], ["services.id"], name="fk_service_replicas_service_id_services"
        ),
        sa.PrimaryKeyConstraint("service_id", "number", name="pk_service_replicas"),
    )


def downgrade() -> None:
    op.drop_table("service_replicas")
    op.drop_index("ix_services_state", table_name="services")
    op.drop_index("ix_services_tenant_created_at", table_name="services")
    op.drop_table("services")
