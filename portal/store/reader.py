"""The read side of the store: snapshot reads for the allocator's start, the API and dashboards.

Reads may run on any thread beside the single writer (``portal.store.writer.Store``, which
inherits them); on PostgreSQL every statement of one read sees one snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import Connection, Engine, Table, or_, select

from portal.store import convert
from portal.store.models import metadata
from portal.store.records import (
    AllocationRecord,
    EventRecord,
    StoredState,
    WorkloadRecord,
    WorkloadState,
)

TENANTS: Table = metadata.tables["tenants"]
QUOTAS: Table = metadata.tables["quotas"]
WORKLOADS: Table = metadata.tables["workloads"]
ALLOCATIONS: Table = metadata.tables["allocations"]
CLAIMS: Table = metadata.tables["device_claims"]
USAGE: Table = metadata.tables["usage_history"]
EVENTS: Table = metadata.tables["events"]
META: Table = metadata.tables["meta"]

ACTIVE_STATES = tuple(s for s in WorkloadState if not s.terminal)


class StoreReader:
    """The read methods of ``Store``; each is safe to call from several threads."""

    engine: Engine

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            if self.engine.dialect.name == "postgresql":
                # One snapshot for every statement of the read.
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn

    def load(self) -> StoredState:
        """Everything the allocator needs on start, read from one snapshot."""
        with self._read() as conn:
            tenants = [
                convert.tenant_record(r)
                for r in conn.execute(select(TENANTS).order_by(TENANTS.c.name)).mappings()
            ]
            quotas = [
                convert.quota_record(r)
                for r in conn.execute(
                    select(QUOTAS).order_by(QUOTAS.c.tenant, QUOTAS.c.flavor)
                ).mappings()
            ]
            workloads = [
                convert.workload_record(r)
                for r in conn.execute(
                    select(WORKLOADS)
                    .where(WORKLOADS.c.state.in_(ACTIVE_STATES))
                    .order_by(WORKLOADS.c.created_at, WORKLOADS.c.id)
                ).mappings()
            ]
            allocations = [
                convert.allocation_record(r)
                for r in conn.execute(
                    select(ALLOCATIONS)
                    .where(ALLOCATIONS.c.released_at.is_(None))
                    .order_by(ALLOCATIONS.c.created_at, ALLOCATIONS.c.id)
                ).mappings()
            ]
            usage = {r.tenant: (r.value, r.updated_at) for r in conn.execute(select(USAGE))}
        return StoredState(
            tenants=tenants,
            quotas=quotas,
            workloads=workloads,
            allocations=allocations,
            usage_history=usage,
        )

    def workload(self, workload_id: str) -> WorkloadRecord | None:
        """The workload with this id, in any state, or None."""
        with self._read() as conn:
            row = (
                conn.execute(select(WORKLOADS).where(WORKLOADS.c.id == workload_id))
                .mappings()
                .one_or_none()
            )
        return None if row is None else convert.workload_record(row)

    def workload_by_idempotency_key(
        self, tenant: str, owner: str, key: str
    ) -> WorkloadRecord | None:
        """The workload ``owner`` created in ``tenant`` with this idempotency key, or None."""
        with self._read() as conn:
            row = (
                conn.execute(
                    select(WORKLOADS).where(
                        WORKLOADS.c.tenant == tenant,
                        WORKLOADS.c.owner == owner,
                        WORKLOADS.c.idempotency_key == key,
                    )
                )
                .mappings()
                .one_or_none()
            )
        return None if row is None else convert.workload_record(row)

    def events(
        self, since: datetime | None = None, limit: int = 1000, *, tenant: str | None = None
    ) -> list[EventRecord]:
        """Events at or after ``since`` (all when None), oldest first, at most ``limit``."""
        query = select(EVENTS).order_by(EVENTS.c.id).limit(limit)
        if since is not None:
            query = query.where(EVENTS.c.at >= since)
        if tenant is not None:
            query = query.where(EVENTS.c.tenant == tenant)
        with self._read() as conn:
            return [convert.event_record(r) for r in conn.execute(query).mappings()]

    def allocations_between(self, start: datetime, end: datetime) -> list[AllocationRecord]:
        """Allocations active at some time in ``[start, end)``, released ones included."""
        query = (
            select(ALLOCATIONS)
            .where(
                ALLOCATIONS.c.created_at < end,
                or_(ALLOCATIONS.c.released_at.is_(None), ALLOCATIONS.c.released_at > start),
            )
            .order_by(ALLOCATIONS.c.created_at, ALLOCATIONS.c.id)
        )
        with self._read() as conn:
            return [convert.allocation_record(r) for r in conn.execute(query).mappings()]

    def workloads_ended_since(self, since: datetime, limit: int) -> list[WorkloadRecord]:
        """Workloads that started and ended at or after ``since``, newest end first, at most
        ``limit`` (the run-length history ETAs start from)."""
        query = (
            select(WORKLOADS)
            .where(WORKLOADS.c.ended_at >= since, WORKLOADS.c.started_at.is_not(None))
            .order_by(WORKLOADS.c.ended_at.desc(), WORKLOADS.c.id)
            .limit(limit)
        )
        with self._read() as conn:
            return [convert.workload_record(r) for r in conn.execute(query).mappings()]

    def meta(self) -> dict[str, str]:
        """Facts about the database: ``schema_version``, ``app_version`` of the last opener."""
        with self._read() as conn:
            return {r.key: r.value for r in conn.execute(select(META))}
