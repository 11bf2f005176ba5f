"""Services and their replicas in the store: records ↔ rows, and the reads the service
controller and the API make. Writes go through ``Store.commit`` (``ChangeSet.services`` and
``.replicas``), with the same writer guard and version checks as jobs."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from sqlalchemy import RowMapping, Table, select

from policies.services import ReplicaState, ServiceState
from portal.store.models import metadata
from portal.store.records import ReplicaRecord, ServiceRecord

if TYPE_CHECKING:
    from portal.store.writer import Store

SERVICES: Table = metadata.tables["services"]
REPLICAS: Table = metadata.tables["service_replicas"]

_SERVICE_FIELDS = (
    "id", "tenant", "owner", "name", "spec", "desired", "message", "failures", "next_replica",
    "created_at", "updated_at", "last_request_at", "deleted_at", "version",
)  # fmt: skip
_REPLICA_FIELDS = (
    "service_id", "number", "workload_id", "queued_at", "node", "port", "started_at",
    "ready_at", "ended_at", "reason", "warm", "woken_at",
)  # fmt: skip


def service_row(s: ServiceRecord) -> dict[str, Any]:
    return {**{f: getattr(s, f) for f in _SERVICE_FIELDS}, "state": s.state.value}


def service_record(r: RowMapping) -> ServiceRecord:
    return ServiceRecord(**{f: r[f] for f in _SERVICE_FIELDS}, state=ServiceState(r["state"]))


def replica_row(a: ReplicaRecord) -> dict[str, Any]:
    return {
        **{f: getattr(a, f) for f in _REPLICA_FIELDS},
        "state": a.state.value,
        "devices": list(a.devices),
    }


def replica_record(r: RowMapping) -> ReplicaRecord:
    return ReplicaRecord(
        **{f: r[f] for f in _REPLICA_FIELDS},
        state=ReplicaState(r["state"]),
        devices=tuple(r["devices"]),
    )


def service(store: Store, service_id: str) -> ServiceRecord | None:
    query = select(SERVICES).where(SERVICES.c.id == service_id)
    with store.engine.connect() as conn:
        row = conn.execute(query).mappings().one_or_none()
    return None if row is None else service_record(row)


def services(
    store: Store,
    *,
    tenants: Collection[str] | None = None,
    states: Collection[ServiceState] | None = None,
) -> list[ServiceRecord]:
    """Services in creation order, optionally of some tenants and in some states."""
    query = select(SERVICES).order_by(SERVICES.c.created_at, SERVICES.c.id)
    if tenants is not None:
        query = query.where(SERVICES.c.tenant.in_(sorted(tenants)))
    if states is not None:
        query = query.where(SERVICES.c.state.in_(sorted(s.value for s in states)))
    with store.engine.connect() as conn:
        return [service_record(r) for r in conn.execute(query).mappings()]


def unsettled_services(store: Store) -> list[ServiceRecord]:
    """Services the controller must look at: active ones, and ended ones with replicas that
    have not ended yet (still stopping after a delete)."""
    live = select(REPLICAS.c.service_id).where(REPLICAS.c.state != ReplicaState.ENDED.value)
    query = (
        select(SERVICES)
        .where((SERVICES.c.state == ServiceState.ACTIVE.value) | SERVICES.c.id.in_(live))
        .order_by(SERVICES.c.created_at, SERVICES.c.id)
    )
    with store.engine.connect() as conn:
        return [service_record(r) for r in conn.execute(query).mappings()]


def active_services(store: Store) -> list[ServiceRecord]:
    return services(store, states=[ServiceState.ACTIVE])


def replicas(store: Store, service_id: str, *, live: bool = False) -> list[ReplicaRecord]:
    """A service's replicas by number; ``live``: only those not ended."""
    query = select(REPLICAS).where(REPLICAS.c.service_id == service_id)
    if live:
        query = query.where(REPLICAS.c.state != ReplicaState.ENDED.value)
    with store.engine.connect() as conn:
        rows = conn.execute(query.order_by(REPLICAS.c.number)).mappings()
        return [replica_record(r) for r in rows]


def replica(store: Store, service_id: str, number: int) -> ReplicaRecord | None:
    query = select(REPLICAS).where(REPLICAS.c.service_id == service_id, REPLICAS.c.number == number)
    with store.engine.connect() as conn:
        row = conn.execute(query).mappings().one_or_none()
    return None if row is None else replica_record(row)


def replica_of_workload(store: Store, workload_id: str) -> ReplicaRecord | None:
    query = select(REPLICAS).where(REPLICAS.c.workload_id == workload_id)
    with store.engine.connect() as conn:
        row = conn.execute(query).mappings().first()
    return None if row is None else replica_record(row)
