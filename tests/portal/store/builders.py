"""Small builders for store records with sensible defaults; override what a test is about."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from portal.store.records import (
    AllocationRecord,
    EventRecord,
    QuotaRecord,
    TenantRecord,
    WorkloadRecord,
    WorkloadState,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def tenant(name: str = "acme", **kw: Any) -> TenantRecord:
    return TenantRecord(name=name, **kw)


def quota(tenant: str = "acme", flavor: str = "H100-80GB", **kw: Any) -> QuotaRecord:
    values: dict[str, Any] = {"guaranteed": 4, "limit": 8} | kw
    return QuotaRecord(tenant=tenant, flavor=flavor, **values)


def workload(workload_id: str = "w1", **kw: Any) -> WorkloadRecord:
    values: dict[str, Any] = {
        "tenant": "acme",
        "owner": "ada",
        "name": f"nb-{workload_id}",
        "kind": "notebook",
        "request": {"members": [{"kind": "gpu", "count": 1}]},
        "gang_size": 1,
        "priority": 0,
        "state": WorkloadState.RUNNING,
        "created_at": T0,
    } | kw
    return WorkloadRecord(id=workload_id, **values)


def allocation(
    alloc_id: str = "a1", workload_id: str = "w1", gpus: tuple[int, ...] = (0,), **kw: Any
) -> AllocationRecord:
    values: dict[str, Any] = {
        "member": 0,
        "node": "node-7",
        "flavor": "H100-80GB",
        "amount": len(gpus),
        "gpu_equivalent": float(len(gpus)),
        "milli": 1000,
        "created_at": T0,
    } | kw
    return AllocationRecord(id=alloc_id, workload_id=workload_id, gpus=gpus, **values)


def mig(alloc_id: str, workload_id: str, gpu: int, profile: str, start: int) -> AllocationRecord:
    return allocation(
        alloc_id,
        workload_id,
        (gpu,),
        flavor=f"H100-80GB/{profile}",
        mig_profile=profile,
        mig_start=start,
        amount=1,
        gpu_equivalent=0.5,
    )


def share(alloc_id: str, workload_id: str, gpu: int, milli: int) -> AllocationRecord:
    return allocation(
        alloc_id, workload_id, (gpu,), flavor="H100-80GB/share", milli=milli, amount=milli
    )


def event(kind: str = "allocated", minutes: float = 0, **kw: Any) -> EventRecord:
    values: dict[str, Any] = {"tenant": "acme", "workload_id": "w1", "message": kind} | kw
    return EventRecord(at=at(minutes), kind=kind, **values)
