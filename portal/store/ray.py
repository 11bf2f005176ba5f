"""Ray clusters and their slices in the store: records ↔ rows, and the reads the Ray
controller and the API make. Writes go through ``Store.commit`` (``ChangeSet.ray_clusters``
and ``.ray_slices``), with the same version checks as jobs."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from sqlalchemy import RowMapping, Table, select

from policies.ray import RayState, SliceState
from portal.store.models import metadata
from portal.store.records import RayClusterRecord, RaySliceRecord

if TYPE_CHECKING:
    from portal.store.writer import Store

CLUSTERS: Table = metadata.tables["ray_clusters"]
SLICES: Table = metadata.tables["ray_slices"]


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


def slice_of_workload(store: Store, workload_id: str) -> RaySliceRecord | None:
    query = select(SLICES).where(SLICES.c.workload_id == workload_id)
    with store.engine.connect() as conn:
        row = conn.execute(query).mappings().first()
    return None if row is None else slice_record(row)
