"""Ray clusters and their slices in the store: records ↔ rows, and the reads the Ray
controller and the API make. Writes go through ``Store.commit`` (``ChangeSet.ray_clusters``
``.ray_slices`` and
``.ray_jobs``), with the same version checks as jobs."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import RowMapping, Table, select

from policies.jobs import JobState
from policies.ray import RayState, SliceState
from portal.store.models import metadata
from portal.store.records import RayClusterRecord, RayJobAttempt, RayJobRecord, RaySliceRecord

if TYPE_CHECKING:
    from portal.store.writer import Store

CLUSTERS: Table = metadata.tables["ray_clusters"]
SLICES: Table = metadata.tables["ray_slices"]
JOBS: Table = metadata.tables["ray_jobs"]


def cluster_row(c: RayClusterRecord) -> dict[str, Any]:
    return {
        "id": c.id,
        "tenant": c.tenant,
        "owner": c.owner,
        "name": c.name,
        "spec": c.spec,
        "state": c.state.value,
        "message": c.message,
        "address": c.address,
        "head": c.head,
        "created_at": c.created_at,
        "updated_at": c.updated_at,
        "ended_at": c.ended_at,
        "version": c.version,
    }


def cluster_record(r: RowMapping) -> RayClusterRecord:
    return RayClusterRecord(
        id=r["id"],
        tenant=r["tenant"],
        owner=r["owner"],
        name=r["name"],
        spec=r["spec"],
        state=RayState(r["state"]),
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        message=r["message"],
        address=r["address"],
        head=r["head"],
        ended_at=r["ended_at"],
        version=r["version"],
    )


def slice_row(s: RaySliceRecord) -> dict[str, Any]:
    return {
        "cluster_id": s.cluster_id,
        "number": s.number,
        "workload_id": s.workload_id,
        "workers": s.workers,
        "state": s.state.value,
        "requested_at": s.requested_at,
        "started_at": s.started_at,
        "released_at": s.released_at,
        "reason": s.reason,
    }


def slice_record(r: RowMapping) -> RaySliceRecord:
    return RaySliceRecord(
        cluster_id=r["cluster_id"],
        number=r["number"],
        workload_id=r["workload_id"],
        workers=r["workers"],
        state=SliceState(r["state"]),
        requested_at=r["requested_at"],
        started_at=r["started_at"],
        released_at=r["released_at"],
        reason=r["reason"],
    )


def cluster(store: Store, cluster_id: str) -> RayClusterRecord | None:
    query = select(CLUSTERS).where(CLUSTERS.c.id == cluster_id)
    with store.engine.connect() as conn:
        row = conn.execute(query).mappings().one_or_none()
    return None if row is None else cluster_record(row)


def clusters(
    store: Store,
    *,
    tenants: Collection[str] | None = None,
    active: bool = False,
) -> list[RayClusterRecord]:
    """Clusters in creation order, optionally of some tenants, optionally not stopped."""
    query = select(CLUSTERS).order_by(CLUSTERS.c.created_at, CLUSTERS.c.id)
    if tenants is not None:
        query = query.where(CLUSTERS.c.tenant.in_(sorted(tenants)))
    if active:
        query = query.where(CLUSTERS.c.state != RayState.STOPPED.value)
    with store.engine.connect() as conn:
        return [cluster_record(r) for r in conn.execute(query).mappings()]


def slices(store: Store, cluster_id: str) -> list[RaySliceRecord]:
    query = select(SLICES).where(SLICES.c.cluster_id == cluster_id).order_by(SLICES.c.number)
    with store.engine.connect() as conn:
        return [slice_record(r) for r in conn.execute(query).mappings()]


def slices_of(store: Store, cluster_ids: Collection[str]) -> dict[str, list[RaySliceRecord]]:
    """The slices of several clusters in one read: cluster id -> its slices, oldest first
    (a cluster without any is absent)."""
    out: dict[str, list[RaySliceRecord]] = {}
    if not cluster_ids:
        return out
    query = (
        select(SLICES)
        .where(SLICES.c.cluster_id.in_(sorted(cluster_ids)))
        .order_by(SLICES.c.cluster_id, SLICES.c.number)
    )
    with store.engine.connect() as conn:
        for r in conn.execute(query).mappings():
            record = slice_record(r)
            out.setdefault(record.cluster_id, []).append(record)
    return out


def slice_of_workload(store: Store, workload_id: str) -> RaySliceRecord | None:
    query = select(SLICES).where(SLICES.c.workload_id == workload_id)
    with store.engine.connect() as conn:
        row = conn.execute(query).mappings().first()
    return None if row is None else slice_record(row)


def _at(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def attempt_dict(a: RayJobAttempt) -> dict[str, Any]:
    return {
        "number": a.number,
        "started_at": a.started_at.isoformat(),
        "head": a.head,
        "ended_at": a.ended_at.isoformat() if a.ended_at else None,
        "exit_code": a.exit_code,
        "reason": a.reason,
    }


def attempt_of(d: dict[str, Any]) -> RayJobAttempt:
    started = _at(d["started_at"])
    assert started is not None
    return RayJobAttempt(
        number=d["number"],
        started_at=started,
        head=d["head"],
        ended_at=_at(d["ended_at"]),
        exit_code=d["exit_code"],
        reason=d["reason"],
    )


def job_row(j: RayJobRecord) -> dict[str, Any]:
    return {
        "id": j.id,
        "tenant": j.tenant,
        "owner": j.owner,
        "cluster_id": j.cluster_id,
        "one_off": j.one_off,
        "spec": j.spec,
        "state": j.state.value,
        "message": j.message,
        "attempt": j.attempt,
        "attempts": [attempt_dict(a) for a in j.attempts],
        "created_at": j.created_at,
        "updated_at": j.updated_at,
        "ended_at": j.ended_at,
        "version": j.version,
    }


def job_record(r: RowMapping) -> RayJobRecord:
    return RayJobRecord(
        id=r["id"],
        tenant=r["tenant"],
        owner=r["owner"],
        cluster_id=r["cluster_id"],
        one_off=bool(r["one_off"]),
        spec=r["spec"],
        state=JobState(r["state"]),
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        message=r["message"],
        attempt=r["attempt"],
        attempts=tuple(attempt_of(a) for a in r["attempts"]),
        ended_at=r["ended_at"],
        version=r["version"],
    )


def job(store: Store, job_id: str) -> RayJobRecord | None:
    query = select(JOBS).where(JOBS.c.id == job_id)
    with store.engine.connect() as conn:
        row = conn.execute(query).mappings().one_or_none()
    return None if row is None else job_record(row)


_ENDED = [s.value for s in JobState if s.terminal]


def jobs(
    store: Store,
    *,
    tenants: Collection[str] | None = None,
    cluster_id: str | None = None,
    active: bool = False,
) -> list[RayJobRecord]:
    """Ray jobs in submission order, optionally of some tenants or one cluster, optionally
    only those that have not ended."""
    query = select(JOBS).order_by(JOBS.c.created_at, JOBS.c.id)
    if tenants is not None:
        query = query.where(JOBS.c.tenant.in_(sorted(tenants)))
    if cluster_id is not None:
        query = query.where(JOBS.c.cluster_id == cluster_id)
    if active:
        query = query.where(JOBS.c.state.not_in(_ENDED))
    with store.engine.connect() as conn:
        return [job_record(r) for r in conn.execute(query).mappings()]
