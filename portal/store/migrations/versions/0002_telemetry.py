"""Telemetry samples, roll-ups and alerts.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 15:00:00

Written out by hand and frozen, like 0001. Times are integer epoch milliseconds.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = 253
ID = 64
DEVICE = 128


def upgrade() -> None:
    op.create_table(
        "telemetry_samples",
        sa.Column("device", sa.String(DEVICE), nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("node", sa.String(NAME), nullable=False),
        sa.Column("gpu_uuid", sa.String(DEVICE), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("utilization_pct", sa.Float(), nullable=False),
        sa.Column("activity_pct", sa.Float(), nullable=True),
        sa.Column("memory_used_mib", sa.Float(), nullable=False),
        sa.Column("memory_total_mib", sa.Float(), nullable=False),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("temperature_c", sa.Float(), nullable=True),
        sa.Column("throttle_reasons", sa.BigInteger(), nullable=False),
        sa.Column("xid_count", sa.BigInteger(), nullable=False),
        sa.Column("last_xid", sa.BigInteger(), nullable=True),
        sa.Column("ecc_uncorrectable", sa.BigInteger(), nullable=False),
        sa.Column("ecc_correctable", sa.BigInteger(), nullable=False),
        sa.Column("pcie_tx_bytes_s", sa.Float(), nullable=True),
        sa.Column("pcie_rx_bytes_s", sa.Float(), nullable=True),
        sa.Column("nvlink_tx_bytes_s", sa.Float(), nullable=True),
        sa.Column("nvlink_rx_bytes_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("device", "at_ms", name="pk_telemetry_samples"),
    )
    op.create_index("ix_telemetry_samples_at_ms", "telemetry_samples", ["at_ms"])
    op.create_table(
        "telemetry_workload_samples",
        sa.Column("workload_id", sa.String(ID), nullable=False),
        sa.Column("device", sa.String(DEVICE), nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("tenant", sa.String(NAME), nullable=False),
        sa.Column("utilization_pct", sa.Float(), nullable=True),
        sa.Column("allocated_fraction", sa.Float(), nullable=False),
        sa.Column("memory_used_mib", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(
            "workload_id", "device", "at_ms", name="pk_telemetry_workload_samples"
        ),
    )
    op.create_index("ix_telemetry_workload_samples_at_ms", "telemetry_workload_samples", ["at_ms"])
    op.create_table(
        "telemetry_rollups",
        sa.Column("step_s", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(DEVICE), nullable=False),
        sa.Column("bucket_ms", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.Column("utilization_avg", sa.Float(), nullable=False),
        sa.Column("utilization_min", sa.Float(), nullable=False),
        sa.Column("utilization_max", sa.Float(), nullable=False),
        sa.Column("activity_avg", sa.Float(), nullable=True),
        sa.Column("memory_used_avg", sa.Float(), nullable=False),
        sa.Column("memory_used_max", sa.Float(), nullable=False),
        sa.Column("power_avg", sa.Float(), nullable=True),
        sa.Column("power_max", sa.Float(), nullable=True),
        sa.Column("temperature_max", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("step_s", "device", "bucket_ms", name="pk_telemetry_rollups"),
    )
    op.create_index(
        "ix_telemetry_rollups_step_s_bucket_ms", "telemetry_rollups", ["step_s", "bucket_ms"]
    )
    op.create_table(
        "telemetry_workload_rollups",
        sa.Column("step_s", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.String(ID), nullable=False),
        sa.Column("bucket_ms", sa.BigInteger(), nullable=False),
        sa.Column("tenant", sa.String(NAME), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.Column("utilization_avg", sa.Float(), nullable=True),
        sa.Column("utilization_min", sa.Float(), nullable=True),
        sa.Column("utilization_max", sa.Float(), nullable=True),
        sa.Column("memory_used_avg", sa.Float(), nullable=False),
        sa.Column("memory_used_max", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(
            "step_s", "workload_id", "bucket_ms", name="pk_telemetry_workload_rollups"
        ),
    )
    op.create_index(
        "ix_telemetry_workload_rollups_step_s_bucket_ms",
        "telemetry_workload_rollups",
        ["step_s", "bucket_ms"],
    )
    op.create_table(
        "telemetry_dirty",
        sa.Column("step_s", sa.Integer(), nullable=False),
        sa.Column("bucket_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("step_s", "bucket_ms", name="pk_telemetry_dirty"),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.String(ID), nullable=False),
        sa.Column("rule", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(NAME), nullable=False),
        sa.Column("subject", sa.String(NAME), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("tenant", sa.String(NAME), nullable=True),
        sa.Column("owner", sa.String(NAME), nullable=True),
        sa.Column("workloads", sa.JSON(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("active_since_ms", sa.BigInteger(), nullable=False),
        sa.Column("fired_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("resolved_at_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
    )
    op.create_index("ix_alerts_state", "alerts", ["state"])
    op.create_index("ix_alerts_tenant_state", "alerts", ["tenant", "state"])


def downgrade() -> None:
    for table in (
        "alerts",
        "telemetry_dirty",
        "telemetry_workload_rollups",
        "telemetry_rollups",
        "telemetry_workload_samples",
        "telemetry_samples",
    ):
        op.drop_table(table)
