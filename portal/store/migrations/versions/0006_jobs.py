"""Training jobs and their attempts.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 01:50:00

A job keeps its spec as submitted (JSON) and where it stands; each run of it is an attempt
with its own allocator workload, start, end, nodes, exit reason and resume point. Written out
by hand and frozen, like 0001.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = 64
NAME = 253


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(ID), nullable=False),
        sa.Column("tenant", sa.String(NAME), nullable=False),
        sa.Column("owner", sa.String(NAME), nullable=False),
        sa.Column("name", sa.String(NAME), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("preemptions", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.String(ID), nullable=True),
        sa.Column("topology_relaxed", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("next_start_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_tenant_created_at", "jobs", ["tenant", "created_at"])
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_table(
        "job_attempts",
        sa.Column("job_id", sa.String(ID), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.String(ID), nullable=False),
        sa.Column("queued_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("exit_reason", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("counted", sa.Boolean(), nullable=False),
        sa.Column("resume_from", sa.Text(), nullable=True),
        sa.Column("resume_step", sa.BigInteger(), nullable=True),
        sa.Column("topology", sa.String(16), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_attempts_job_id_jobs"),
        sa.PrimaryKeyConstraint("job_id", "number", name="pk_job_attempts"),
    )


def downgrade() -> None:
    op.drop_table("job_attempts")
    op.drop_index("ix_jobs_state", table_name="jobs")
    op.drop_index("ix_jobs_tenant_created_at", table_name="jobs")
    op.drop_table("jobs")
