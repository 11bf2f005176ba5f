"""SQLAlchemy models of the portal's durable state.

Timestamps are stored as naive UTC (``timestamp without time zone`` on PostgreSQL, ISO text on
SQLite) through :class:`UTCDateTime`, which accepts only timezone-aware datetimes and hands back
aware UTC datetimes, so both engines behave the same.

The ``device_claims`` table is the database's own guard against handing a device out twice: an
exclusive allocation (a whole GPU or a MIG instance) inserts one row per MIG memory slice it
occupies, and the primary key ``(node, gpu, slot)`` makes two overlapping claims impossible. A
whole GPU occupies every memory slice, so it also collides with any MIG instance on that GPU.
Fractional shares claim nothing: several of them share a GPU by design.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from policies.errors import InvalidRequest
from portal.store.records import WorkloadState

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

NAME_LENGTH = 253  # a Kubernetes object name; tenants, nodes and owners fit in it
ID_LENGTH = 64


class UTCDateTime(TypeDecorator[datetime]):
    """An aware datetime in Python, naive UTC in the database."""

    impl = DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidRequest(
                "timestamp",
                f"{value.isoformat()} (naive)",
                "a timezone-aware datetime such as datetime.now(UTC)",
            )
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC)


# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit identity.
EventId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = metadata
    type_annotation_map: dict[Any, Any] = {
        datetime: UTCDateTime(),
        dict[str, object]: JSON(),
        list[Any]: JSON(),
    }


class Meta(Base):
    """Key/value facts about the database itself (``schema_version``, ``app_version``)."""

    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class Tenant(Base):
    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    cohort: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    weight: Mapped[float] = mapped_column(Float)
    pools: Mapped[list[Any]]
    version: Mapped[int] = mapped_column(Integer)

    quotas: Mapped[list[Quota]] = relationship(
        back_populates="tenant_row",
        lazy="raise",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )


class Quota(Base):
    __tablename__ = "quotas"

    tenant: Mapped[str] = mapped_column(
        String(NAME_LENGTH), ForeignKey("tenants.name", ondelete="CASCADE"), primary_key=True
    )
    flavor: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    guaranteed: Mapped[int] = mapped_column(BigInteger)
    limit: Mapped[int] = mapped_column(BigInteger)
    budget_gpu_hours: Mapped[float | None] = mapped_column(Float)
    version: Mapped[int] = mapped_column(Integer)
    # The platform admin's ceilings for the tenant's own admins (docs/quota.md).
    ceiling_guaranteed: Mapped[int] = mapped_column(BigInteger)
    ceiling_limit: Mapped[int] = mapped_column(BigInteger)

    tenant_row: Mapped[Tenant] = relationship(back_populates="quotas", lazy="raise")


class Workload(Base):
    """A workload. ``tenant`` is not a foreign key: history outlives a deleted tenant."""

    __tablename__ = "workloads"
    __table_args__ = (
        Index("ix_workloads_tenant_state", "tenant", "state"),
        Index("ix_workloads_state", "state"),
        Index(
            "uq_workloads_tenant_owner_idempotency_key",
            "tenant",
            "owner",
            "idempotency_key",
            unique=True,
            sqlite_where=text("idempotency_key IS NOT NULL"),
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH))
    owner: Mapped[str] = mapped_column(String(NAME_LENGTH))
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    kind: Mapped[str] = mapped_column(String(32))
    request: Mapped[dict[str, object]]
    gang_size: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer)
    state: Mapped[WorkloadState] = mapped_column(
        Enum(
            WorkloadState,
            name="workload_state",
            native_enum=False,
            create_constraint=True,
            length=16,
            values_callable=lambda states: [s.value for s in states],
        )
    )
    created_at: Mapped[datetime]
    reason: Mapped[str] = mapped_column(Text)
    message: Mapped[str] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    expected_duration_s: Mapped[float | None] = mapped_column(Float)
    preempt_deadline: Mapped[datetime | None]
    version: Mapped[int] = mapped_column(Integer)

    allocations: Mapped[list[Allocation]] = relationship(back_populates="workload", lazy="raise")


class Allocation(Base):
    """Devices one gang member holds on one node; ``released_at`` is NULL while active."""

    __tablename__ = "allocations"
    __table_args__ = (
        Index("ix_allocations_workload_id", "workload_id"),
        Index("ix_allocations_created_at", "created_at"),
        Index(
            "ix_allocations_active_node",
            "node",
            sqlite_where=text("released_at IS NULL"),
            postgresql_where=text("released_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    workload_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("workloads.id"))
    member: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(NAME_LENGTH))
    flavor: Mapped[str] = mapped_column(String(NAME_LENGTH))
    amount: Mapped[int] = mapped_column(BigInteger)
    gpu_equivalent: Mapped[float] = mapped_column(Float)
    gpus: Mapped[list[Any]]
    gpu_uuids: Mapped[list[Any]]
    milli: Mapped[int] = mapped_column(Integer)
    gpu_memory_mib: Mapped[int] = mapped_column(BigInteger)
    mig_profile: Mapped[str | None] = mapped_column(String(32))
    mig_start: Mapped[int | None] = mapped_column(Integer)
    cpu_milli: Mapped[int] = mapped_column(BigInteger)
    memory_mib: Mapped[int] = mapped_column(BigInteger)
    borrowed: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime]
    released_at: Mapped[datetime | None]

    workload: Mapped[Workload] = relationship(back_populates="allocations", lazy="raise")
    claims: Mapped[list[DeviceClaim]] = relationship(
        back_populates="allocation", lazy="raise", passive_deletes=True
    )


class DeviceClaim(Base):
    """One MIG memory slice (or, for a GPU without MIG, the whole GPU) held exclusively.

    Rows exist only while the allocation is active; releasing deletes them.
    """

    __tablename__ = "device_claims"
    __table_args__ = (Index("ix_device_claims_allocation_id", "allocation_id"),)

    node: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    gpu: Mapped[int] = mapped_column(Integer, primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    allocation_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("allocations.id", ondelete="CASCADE")
    )

    allocation: Mapped[Allocation] = relationship(back_populates="claims", lazy="raise")


class UsageHistory(Base):
    """A tenant's decayed usage for fair share, as of ``updated_at``."""

    __tablename__ = "usage_history"

    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    value: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime]


class Event(Base):
    """The append-only audit log; ``id`` orders events as they were committed."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_at", "at"),
        Index("ix_events_tenant_at", "tenant", "at"),
    )

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(64))
    tenant: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    workload_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, object]]


class Job(Base):
    """A training job (``portal.jobs``): its spec as submitted and where it stands. Each run
    is an attempt with a workload of kind ``job`` in the allocator; ``tenant`` is not a
    foreign key, like workloads', so history outlives a deleted tenant."""

    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_tenant_created_at", "tenant", "created_at"),
        Index("ix_jobs_state", "state"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH))
    owner: Mapped[str] = mapped_column(String(NAME_LENGTH))
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    spec: Mapped[dict[str, object]]
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    message: Mapped[str] = mapped_column(Text)
    restarts: Mapped[int] = mapped_column(Integer)
    preemptions: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    workload_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    topology_relaxed: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    next_start_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    version: Mapped[int] = mapped_column(Integer)


class JobAttempt(Base):
    """One run of a job: one allocator workload, from queued to its exit reason."""

    __tablename__ = "job_attempts"

    job_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("jobs.id"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    queued_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    nodes: Mapped[list[Any]]
    exit_reason: Mapped[str] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    counted: Mapped[bool] = mapped_column(Boolean)
    resume_from: Mapped[str | None] = mapped_column(Text)
    resume_step: Mapped[int | None] = mapped_column(BigInteger)
    topology: Mapped[str] = mapped_column(String(16))
    world_size: Mapped[int | None] = mapped_column(Integer)


class Service(Base):
    """An inference service (``portal.inference``): its spec as submitted and where it stands.
    Each replica is a workload of kind ``inference`` in the allocator."""

    __tablename__ = "services"
    __table_args__ = (
        Index("ix_services_tenant_created_at", "tenant", "created_at"),
        Index("ix_services_state", "state"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH))
    owner: Mapped[str] = mapped_column(String(NAME_LENGTH))
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    spec: Mapped[dict[str, object]]
    state: Mapped[str] = mapped_column(String(16))
    desired: Mapped[int] = mapped_column(Integer)
    message: Mapped[str] = mapped_column(Text)
    failures: Mapped[int] = mapped_column(Integer)
    next_replica: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    last_request_at: Mapped[datetime | None]
    deleted_at: Mapped[datetime | None]
    version: Mapped[int] = mapped_column(Integer)


class ServiceReplica(Base):
    """One replica of a service: one allocator workload, from queued to ended."""

    __tablename__ = "service_replicas"

    service_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("services.id"), primary_key=True
    )
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    state: Mapped[str] = mapped_column(String(16))
    queued_at: Mapped[datetime]
    node: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    devices: Mapped[list[Any]]
    port: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[datetime | None]
    ready_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    reason: Mapped[str] = mapped_column(Text)
    warm: Mapped[bool] = mapped_column(Boolean)
    woken_at: Mapped[datetime | None]


class RayCluster(Base):
    """A Ray cluster (``portal.ray``): its spec and where it stands. Its workers' devices are
    held by slices, each an allocator workload of kind ``ray``."""

    __tablename__ = "ray_clusters"
    __table_args__ = (
        Index("ix_ray_clusters_tenant_created_at", "tenant", "created_at"),
        Index("ix_ray_clusters_state", "state"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH))
    owner: Mapped[str] = mapped_column(String(NAME_LENGTH))
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    spec: Mapped[dict[str, object]]
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    address: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    head: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    version: Mapped[int] = mapped_column(Integer)


class RaySlice(Base):
    """Workers of a Ray cluster held by one allocator workload."""

    __tablename__ = "ray_slices"

    cluster_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("ray_clusters.id"), primary_key=True
    )
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    workers: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    requested_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    released_at: Mapped[datetime | None]
    reason: Mapped[str] = mapped_column(Text)


class RayJob(Base):
    """A Ray job (``portal.ray.jobs``): an entrypoint run against a Ray cluster, either a
    tenant's cluster or a one-off one that ends with it. Its attempts are a JSON list: few,
    read and written with the job."""

    __tablename__ = "ray_jobs"
    __table_args__ = (
        Index("ix_ray_jobs_tenant_created_at", "tenant", "created_at"),
        Index("ix_ray_jobs_state", "state"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(NAME_LENGTH))
    owner: Mapped[str] = mapped_column(String(NAME_LENGTH))
    cluster_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("ray_clusters.id"))
    one_off: Mapped[bool] = mapped_column(Boolean)
    spec: Mapped[dict[str, object]]
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer)
    attempts: Mapped[list[Any]]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    version: Mapped[int] = mapped_column(Integer)


class TenantElastic(Base):
    """A tenant's elastic-job policy (``policies.elastic.ElasticSettings``) and the limits
    a platform admin set for the tenant's own admins (``ElasticLimits``). No row: defaults."""

    __tablename__ = "tenant_elastic"

    tenant: Mapped[str] = mapped_column(
        String(NAME_LENGTH), ForeignKey("tenants.name", ondelete="CASCADE"), primary_key=True
    )
    threshold: Mapped[float] = mapped_column(Float)
    window_s: Mapped[float] = mapped_column(Float)
    idle_s: Mapped[float] = mapped_column(Float)
    idle_below: Mapped[float] = mapped_column(Float)
    min_threshold: Mapped[float] = mapped_column(Float)
    min_window_s: Mapped[float] = mapped_column(Float)
    max_idle_s: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime]
    version: Mapped[int] = mapped_column(Integer)
