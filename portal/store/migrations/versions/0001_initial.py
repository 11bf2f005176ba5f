"""Initial schema: tenants, quotas, workloads, allocations, device claims, usage, events, meta.

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00

Written out by hand and frozen: it imports no model code, so later model changes never alter it.
Timestamps are naive UTC (see ``portal.store.models.UTCDateTime``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = 253
ID = 64
WORKLOAD_STATES = ("queued", "running", "preempting", "released", "cancelled", "failed")


def upgrade() -> None:
    op.create_table(
        "meta",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_meta"),
    )
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(NAME), nullable=False),
        sa.Column("cohort", sa.String(NAME), nullable=True),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("pools", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_tenants"),
    )
    op.create_table(
        "quotas",
        sa.Column("tenant", sa.String(NAME), nullable=False),
        sa.Column("flavor", sa.String(NAME), nullable=False),
        sa.Column("guaranteed", sa.BigInteger(), nullable=False),
        sa.Column("limit", sa.BigInteger(), nullable=False),
        sa.Column("budget_gpu_hours", sa.Float(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant"], ["tenants.name"], name="fk_quotas_tenant_tenants", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant", "flavor", name="pk_quotas"),
    )
    op.create_table(
        "workloads",
        sa.Column("id", sa.String(ID), nullable=False),
        sa.Column("tenant", sa.String(NAME), nullable=False),
        sa.Column("owner", sa.String(NAME), nullable=False),
        sa.Column("name", sa.String(NAME), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("gang_size", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                *WORKLOAD_STATES,
                name="workload_state",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.String(NAME), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("expected_duration_s", sa.Float(), nullable=True),
        sa.Column("preempt_deadline", sa.DateTime(timezone=False), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workloads"),
    )
    op.create_index("ix_workloads_tenant_state", "workloads", ["tenant", "state"])
    op.create_index("ix_workloads_state", "workloads", ["state"])
    op.create_index(
        "uq_workloads_tenant_owner_idempotency_key",
        "workloads",
        ["tenant", "owner", "idempotency_key"],
        unique=True,
        sqlite_where=sa.text("idempotency_key IS NOT NULL"),
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_table(
        "allocations",
        sa.Column("id", sa.String(ID), nullable=False),
        sa.Column("workload_id", sa.String(ID), nullable=False),
        sa.Column("member", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(NAME), nullable=False),
        sa.Column("flavor", sa.String(NAME), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("gpu_equivalent", sa.Float(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("gpu_uuids", sa.JSON(), nullable=False),
        sa.Column("milli", sa.Integer(), nullable=False),
        sa.Column("gpu_memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("mig_profile", sa.String(32), nullable=True),
        sa.Column("mig_start", sa.Integer(), nullable=True),
        sa.Column("cpu_milli", sa.BigInteger(), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("borrowed", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=False), nullable=True),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name="fk_allocations_workload_id_workloads"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_allocations"),
    )
    op.create_index("ix_allocations_workload_id", "allocations", ["workload_id"])
    op.create_index("ix_allocations_created_at", "allocations", ["created_at"])
    op.create_index(
        "ix_allocations_active_node",
        "allocations",
        ["node"],
        sqlite_where=sa.text("released_at IS NULL"),
        postgresql_where=sa.text("released_at IS NULL"),
    )
    op.create_table(
        "device_claims",
        sa.Column("node", sa.String(NAME), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("allocation_id", sa.String(ID), nullable=False),
        sa.ForeignKeyConstraint(
            ["allocation_id"],
            ["allocations.id"],
            name="fk_device_claims_allocation_id_allocations",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node", "gpu", "slot", name="pk_device_claims"),
    )
    op.create_index("ix_device_claims_allocation_id", "device_claims", ["allocation_id"])
    op.create_table(
        "usage_history",
        sa.Column("tenant", sa.String(NAME), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=False), nullable=False),
        sa.PrimaryKeyConstraint("tenant", name="pk_usage_history"),
    )
    op.create_table(
        "events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(NAME), nullable=True),
        sa.Column("workload_id", sa.String(ID), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
    )
    op.create_index("ix_events_at", "events", ["at"])
    op.create_index("ix_events_tenant_at", "events", ["tenant", "at"])
    op.bulk_insert(
        sa.table("meta", sa.column("key", sa.String), sa.column("value", sa.String)),
        [{"key": "schema_version", "value": "1"}],
    )


def downgrade() -> None:
    for table in (
        "events",
        "usage_history",
        "device_claims",
        "allocations",
        "workloads",
        "quotas",
        "tenants",
        "meta",
    ):
        op.drop_table(table)
