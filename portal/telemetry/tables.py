"""Telemetry and alert tables, on the store's metadata (created by migrations 0002 and 0003;
utilization optional since 0004).

Times are integer epoch milliseconds (``*_ms``): samples arrive by the thousand per second, and
integers make bucketing (``at_ms - at_ms % step``) and duplicate detection exact and cheap on
both engines.

- ``telemetry_samples``: raw samples, one row per device and time (the primary key makes a
  re-sent sample a duplicate, never a second row).
- ``telemetry_workload_samples``: the same samples attributed to workloads, one row per
  workload, device and time: a whole GPU or MIG instance carries its device's utilization, a
  share of a GPU the SM time of its own processes (% of the whole GPU) and its
  ``allocated_fraction`` (milli / 1000; 1 otherwise).
- Workload roll-ups (and raw workload series) give utilization in % of the allocation:
  ``min(100, utilization_pct / allocated_fraction)``.
- ``telemetry_rollups`` / ``telemetry_workload_rollups``: aggregates per ``step_s`` (60, 3600)
  and bucket, recomputed from the level below, so recomputing is idempotent.
- Utilization is NULL where it was not measured (a MIG instance on a GPU without GPU
  Performance Monitoring, A100 and A30): averages, minima and maxima cover the measured
  samples only, and a bucket without any is NULL, never 0 %; memory and the rest are kept.
- ``telemetry_dirty``: buckets whose source rows changed since they were last rolled up.
- ``telemetry_revisions``: per ``step_s`` and hour, a counter bumped in the same transaction as
  every write or delete of that hour's workload roll-ups (roll-up rounds, retention pruning), so
  readers tell cheaply whether an hour's measurements changed (cost accounting's closed days).
- ``alerts``: every alert the service raised, with its state (pending, firing, resolved).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)

from portal.store.models import ID_LENGTH, NAME_LENGTH, metadata

DEVICE_LENGTH = 128  # "<GPU uuid>/gi<id>"

SAMPLES = Table(
    "telemetry_samples",
    metadata,
    Column("device", String(DEVICE_LENGTH), nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    Column("node", String(NAME_LENGTH), nullable=False),
    Column("gpu_uuid", String(DEVICE_LENGTH), nullable=False),
    Column("source", String(16), nullable=False),
    Column("utilization_pct", Float, nullable=True),
    Column("activity_pct", Float, nullable=True),
    Column("memory_used_mib", Float, nullable=False),
    Column("memory_total_mib", Float, nullable=False),
    Column("power_w", Float, nullable=True),
    Column("temperature_c", Float, nullable=True),
    Column("throttle_reasons", BigInteger, nullable=False),
    Column("xid_count", BigInteger, nullable=False),
    Column("last_xid", BigInteger, nullable=True),
    Column("ecc_uncorrectable", BigInteger, nullable=False),
    Column("ecc_correctable", BigInteger, nullable=False),
    Column("pcie_tx_bytes_s", Float, nullable=True),
    Column("pcie_rx_bytes_s", Float, nullable=True),
    Column("nvlink_tx_bytes_s", Float, nullable=True),
    Column("nvlink_rx_bytes_s", Float, nullable=True),
    PrimaryKeyConstraint("device", "at_ms", name="pk_telemetry_samples"),
    Index("ix_telemetry_samples_at_ms", "at_ms"),
)

WORKLOAD_SAMPLES = Table(
    "telemetry_workload_samples",
    metadata,
    Column("workload_id", String(ID_LENGTH), nullable=False),
    Column("device", String(DEVICE_LENGTH), nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    Column("tenant", String(NAME_LENGTH), nullable=False),
    Column("utilization_pct", Float, nullable=True),
    Column("allocated_fraction", Float, nullable=False),
    Column("memory_used_mib", Float, nullable=False),
    PrimaryKeyConstraint("workload_id", "device", "at_ms", name="pk_telemetry_workload_samples"),
    Index("ix_telemetry_workload_samples_at_ms", "at_ms"),
)

ROLLUPS = Table(
    "telemetry_rollups",
    metadata,
    Column("step_s", Integer, nullable=False),
    Column("device", String(DEVICE_LENGTH), nullable=False),
    Column("bucket_ms", BigInteger, nullable=False),
    Column("samples", BigInteger, nullable=False),
    Column("utilization_avg", Float, nullable=True),
    Column("utilization_min", Float, nullable=True),
    Column("utilization_max", Float, nullable=True),
    Column("activity_avg", Float, nullable=True),
    Column("memory_used_avg", Float, nullable=False),
    Column("memory_used_max", Float, nullable=False),
    Column("power_avg", Float, nullable=True),
    Column("power_max", Float, nullable=True),
    Column("temperature_max", Float, nullable=True),
    PrimaryKeyConstraint("step_s", "device", "bucket_ms", name="pk_telemetry_rollups"),
    Index("ix_telemetry_rollups_step_s_bucket_ms", "step_s", "bucket_ms"),
)

WORKLOAD_ROLLUPS = Table(
    "telemetry_workload_rollups",
    metadata,
    Column("step_s", Integer, nullable=False),
    Column("workload_id", String(ID_LENGTH), nullable=False),
    Column("bucket_ms", BigInteger, nullable=False),
    Column("tenant", String(NAME_LENGTH), nullable=False),
    Column("samples", BigInteger, nullable=False),
    Column("utilization_avg", Float, nullable=True),
    Column("utilization_min", Float, nullable=True),
    Column("utilization_max", Float, nullable=True),
    Column("memory_used_avg", Float, nullable=False),
    Column("memory_used_max", Float, nullable=False),
    PrimaryKeyConstraint(
        "step_s", "workload_id", "bucket_ms", name="pk_telemetry_workload_rollups"
    ),
    Index("ix_telemetry_workload_rollups_step_s_bucket_ms", "step_s", "bucket_ms"),
)

DIRTY = Table(
    "telemetry_dirty",
    metadata,
    Column("step_s", Integer, nullable=False),
    Column("bucket_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("step_s", "bucket_ms", name="pk_telemetry_dirty"),
)

REVISIONS = Table(
    "telemetry_revisions",
    metadata,
    Column("step_s", Integer, nullable=False),
    Column("hour_ms", BigInteger, nullable=False),
    Column("revision", BigInteger, nullable=False),
    PrimaryKeyConstraint("step_s", "hour_ms", name="pk_telemetry_revisions"),
)

ALERTS = Table(
    "alerts",
    metadata,
    Column("id", String(ID_LENGTH), nullable=False),
    Column("rule", String(64), nullable=False),
    Column("scope", String(NAME_LENGTH), nullable=False),
    Column("subject", String(NAME_LENGTH), nullable=False),
    Column("state", String(16), nullable=False),
    Column("tenant", String(NAME_LENGTH), nullable=True),
    Column("owner", String(NAME_LENGTH), nullable=True),
    Column("workloads", JSON, nullable=False),
    Column("summary", Text, nullable=False),
    Column("value", Float, nullable=False),
    Column("active_since_ms", BigInteger, nullable=False),
    Column("fired_at_ms", BigInteger, nullable=True),
    Column("resolved_at_ms", BigInteger, nullable=True),
    PrimaryKeyConstraint("id", name="pk_alerts"),
    Index("ix_alerts_state", "state"),
    Index("ix_alerts_tenant_state", "tenant", "state"),
)
