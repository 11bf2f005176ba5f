"""Jobs and attempts in the store: records ↔ rows, and the reads the job controller and the
API make. Writes go through ``Store.commit`` (``ChangeSet.jobs`` and ``.attempts``), in the
same transaction discipline, writer guard and version checks as workloads."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import CompoundSelect, RowMapping, Table, select, union

from policies.jobs import JobState
from portal.store.models import metadata
from portal.store.records import AttemptRecord, JobRecord

if TYPE_CHECKING:
    from portal.store.writer import Store

JOBS: Table = metadata.tables["jobs"]
ATTEMPTS: Table = metadata.tables["job_attempts"]
WORKLOADS: Table = metadata.tables["workloads"]

ACTIVE_JOB_STATES = tuple(s.value for s in JobState if not s.terminal)

SLICE_KEY_PREFIX = "gpuportal-slice:"
"""Idempotency keys of an elastic job's slices start with this, then the job id and a slash."""


def slice_key_prefix(job_id: str) -> str:
    return f"{SLICE_KEY_PREFIX}{job_id}/"


def workload_ids_query(job: JobRecord) -> CompoundSelect[str]:
    """The job's workloads, one definition for what it held: every attempt's (an elastic
    job's resizes share one) and every slice it ever had, released ones included. A slice is
    the job's only within its tenant and owner: another user's key cannot charge the job."""
    return union(
        select(ATTEMPTS.c.workload_id).where(ATTEMPTS.c.job_id == job.id),
        select(WORKLOADS.c.id).where(
            WORKLOADS.c.tenant == job.tenant,
            WORKLOADS.c.owner == job.owner,
            WORKLOADS.c.idempotency_key.startswith(slice_key_prefix(job.id), autoescape=True),
        ),
    )


def workload_ids(store: Store, job: JobRecord) -> list[str]:
    """``workload_ids_query``'s answer, attempts' and slices' alike, sorted."""
    with store.engine.connect() as conn:
        return sorted(conn.execute(workload_ids_query(job)).scalars())


def job_row(j: JobRecord) -> dict[str, Any]:
    return {
        "id": j.id,
        "tenant": j.tenant,
        "owner": j.owner,
        "name": j.name,
        "spec": j.spec,
        "state": j.state.value,
        "reason": j.reason,
        "message": j.message,
        "restarts": j.restarts,
        "preemptions": j.preemptions,
        "attempt": j.attempt,
        "workload_id": j.workload_id,
        "topology_relaxed": j.topology_relaxed,
        "created_at": j.created_at,
        "updated_at": j.updated_at,
        "next_start_at": j.next_start_at,
        "ended_at": j.ended_at,
        "version": j.version,
    }


def job_record(r: RowMapping) -> JobRecord:
    return JobRecord(
        id=r["id"],
        tenant=r["tenant"],
        owner=r["owner"],
        name=r["name"],
        spec=r["spec"],
        state=JobState(r["state"]),
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        reason=r["reason"],
        message=r["message"],
        restarts=r["restarts"],
        preemptions=r["preemptions"],
        attempt=r["attempt"],
        workload_id=r["workload_id"],
        topology_relaxed=bool(r["topology_relaxed"]),
        next_start_at=r["next_start_at"],
        ended_at=r["ended_at"],
        version=r["version"],
    )


def attempt_row(a: AttemptRecord) -> dict[str, Any]:
    return {
        "job_id": a.job_id,
        "number": a.number,
        "workload_id": a.workload_id,
        "queued_at": a.queued_at,
        "started_at": a.started_at,
        "ended_at": a.ended_at,
        "nodes": list(a.nodes),
        "exit_reason": a.exit_reason,
        "exit_code": a.exit_code,
        "counted": a.counted,
        "resume_from": a.resume_from,
        "resume_step": a.resume_step,
        "topology": a.topology,
        "world_size": a.world_size,
    }


def attempt_record(r: RowMapping) -> AttemptRecord:
    return AttemptRecord(
        job_id=r["job_id"],
        number=r["number"],
        workload_id=r["workload_id"],
        queued_at=r["queued_at"],
        topology=r["topology"],
        started_at=r["started_at"],
        ended_at=r["ended_at"],
        nodes=tuple(r["nodes"]),
        exit_reason=r["exit_reason"],
        exit_code=r["exit_code"],
        counted=bool(r["counted"]),
        resume_from=r["resume_from"],
        resume_step=r["resume_step"],
        world_size=r["world_size"],
    )


def job(store: Store, job_id: str) -> JobRecord | None:
    with store.engine.connect() as conn:
        row = conn.execute(select(JOBS).where(JOBS.c.id == job_id)).mappings().one_or_none()
    return None if row is None else job_record(row)


def jobs(
    store: Store,
    *,
    tenants: Collection[str] | None = None,
    states: Collection[JobState] | None = None,
) -> list[JobRecord]:
    """Jobs in submission order, optionally of some tenants and in some states."""
    query = select(JOBS).order_by(JOBS.c.created_at, JOBS.c.id)
    if tenants is not None:
        query = query.where(JOBS.c.tenant.in_(sorted(tenants)))
    if states is not None:
        query = query.where(JOBS.c.state.in_(sorted(s.value for s in states)))
    with store.engine.connect() as conn:
        return [job_record(r) for r in conn.execute(query).mappings()]


def active_jobs(store: Store) -> list[JobRecord]:
    return jobs(store, states=[s for s in JobState if not s.terminal])


def gpu_hours(store: Store, job: JobRecord, now: datetime) -> float:
    """GPU-equivalent hours the job's workloads (``workload_ids_query``) held, running ones
    up to ``now``: the job's share of the tenant's usage, priced like any workload's."""
    allocations = metadata.tables["allocations"]
    query = select(
        allocations.c.gpu_equivalent, allocations.c.created_at, allocations.c.released_at
    ).where(allocations.c.workload_id.in_(workload_ids_query(job).scalar_subquery()))
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    seconds: float = sum(
        geq * max(0.0, ((end or now) - start).total_seconds()) for geq, start, end in rows
    )
    return seconds / 3600


def attempt_of_workload(store: Store, workload_id: str) -> AttemptRecord | None:
    """The attempt that ``workload_id`` was requested for, or None (not a job's)."""
    query = (
        select(ATTEMPTS)
        .where(ATTEMPTS.c.workload_id == workload_id)
        .order_by(ATTEMPTS.c.number.desc())  # an elastic job's resizes share the workload
    )
    with store.engine.connect() as conn:
        row = conn.execute(query).mappings().first()
    return None if row is None else attempt_record(row)


def attempts(store: Store, job_id: str) -> list[AttemptRecord]:
    query = select(ATTEMPTS).where(ATTEMPTS.c.job_id == job_id).order_by(ATTEMPTS.c.number)
    with store.engine.connect() as conn:
        return [attempt_record(r) for r in conn.execute(query).mappings()]
