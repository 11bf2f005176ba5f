"""Records ↔ table rows, and the device claims an allocation makes."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import RowMapping

from policies import mig
from policies.errors import InvalidRequest
from policies.flavors import Flavor, FlavorKind
from portal.store.records import (
    AllocationRecord,
    EventRecord,
    QuotaRecord,
    TenantRecord,
    WorkloadRecord,
    WorkloadState,
)

Row = RowMapping

# A claim is (node, gpu index, MIG memory slice); see models.DeviceClaim.
Claim = tuple[str, int, int]


def tenant_row(t: TenantRecord) -> dict[str, Any]:
    return {
        "name": t.name,
        "cohort": t.cohort,
        "weight": t.weight,
        "pools": list(t.pools),
        "version": t.version,
    }


def tenant_record(r: Row) -> TenantRecord:
    return TenantRecord(
        name=r["name"],
        cohort=r["cohort"],
        weight=r["weight"],
        pools=tuple(r["pools"]),
        version=r["version"],
    )


def quota_row(q: QuotaRecord) -> dict[str, Any]:
    return {
        "tenant": q.tenant,
        "flavor": q.flavor,
        "guaranteed": q.guaranteed,
        "limit": q.limit,
        "budget_gpu_hours": q.budget_gpu_hours,
        "version": q.version,
        "ceiling_guaranteed": q.ceiling_guaranteed,
        "ceiling_limit": q.ceiling_limit,
    }


def quota_record(r: Row) -> QuotaRecord:
    return QuotaRecord(
        tenant=r["tenant"],
        flavor=r["flavor"],
        guaranteed=r["guaranteed"],
        limit=r["limit"],
        budget_gpu_hours=r["budget_gpu_hours"],
        version=r["version"],
        ceiling_guaranteed=r["ceiling_guaranteed"],
        ceiling_limit=r["ceiling_limit"],
    )


WORKLOAD_FIELDS = (
    "id",
    "tenant",
    "owner",
    "name",
    "kind",
    "request",
    "gang_size",
    "priority",
    "state",
    "created_at",
    "reason",
    "message",
    "idempotency_key",
    "started_at",
    "ended_at",
    "expected_duration_s",
    "preempt_deadline",
    "version",
)


def workload_row(w: WorkloadRecord) -> dict[str, Any]:
    row = {name: getattr(w, name) for name in WORKLOAD_FIELDS}
    row["state"] = WorkloadState(w.state)
    return row


def workload_record(r: Row) -> WorkloadRecord:
    values = {name: r[name] for name in WORKLOAD_FIELDS}
    values["state"] = WorkloadState(values["state"])
    return WorkloadRecord(**values)


ALLOCATION_FIELDS = (
    "id",
    "workload_id",
    "member",
    "node",
    "flavor",
    "amount",
    "gpu_equivalent",
    "milli",
    "gpu_memory_mib",
    "mig_profile",
    "mig_start",
    "cpu_milli",
    "memory_mib",
    "borrowed",
    "created_at",
    "released_at",
)


def allocation_row(a: AllocationRecord, now: datetime) -> dict[str, Any]:
    row = {name: getattr(a, name) for name in ALLOCATION_FIELDS}
    row["gpus"] = list(a.gpus)
    row["gpu_uuids"] = list(a.gpu_uuids)
    row["created_at"] = a.created_at or now
    row["released_at"] = None
    return row


def allocation_record(r: Row) -> AllocationRecord:
    values = {name: r[name] for name in ALLOCATION_FIELDS}
    return AllocationRecord(gpus=tuple(r["gpus"]), gpu_uuids=tuple(r["gpu_uuids"]), **values)


def event_row(e: EventRecord) -> dict[str, Any]:
    return {
        "at": e.at,
        "kind": e.kind,
        "tenant": e.tenant,
        "workload_id": e.workload_id,
        "message": e.message,
        "data": dict(e.data),
    }


def event_record(r: Row) -> EventRecord:
    return EventRecord(
        at=r["at"],
        kind=r["kind"],
        tenant=r["tenant"],
        workload_id=r["workload_id"],
        message=r["message"],
        data=r["data"],
    )


def claims(a: AllocationRecord) -> list[Claim]:
    """The exclusive claims of an allocation: every MIG memory slice it occupies.

    A whole GPU occupies all memory slices of its model (one slot for a model without MIG), a
    MIG instance the run of slices its profile spans from ``mig_start``, a share or a CPU-only
    allocation (no flavor, no GPUs) nothing.

    Raises:
        InvalidRequest: the flavor, MIG profile or placement does not describe real devices.
    """
    if not a.flavor and not a.gpus:
        return []  # CPU-only: CPU and memory are counted, no device is claimed
    flavor = _parse_flavor(a.flavor) if isinstance(a.flavor, str) else Flavor.parse(a.flavor)
    if flavor.kind is FlavorKind.SHARE:
        return []
    if flavor.kind is FlavorKind.MIG:
        assert flavor.profile is not None  # Flavor guarantees it for MIG
        if len(a.gpus) != 1 or a.mig_start is None:
            raise InvalidRequest(
                "MIG allocation",
                f"{a.id} (gpus={list(a.gpus)}, mig_start={a.mig_start})",
                "exactly one GPU index and a mig_start",
            )
        profile = mig.geometry(flavor.model).profile(flavor.profile)
        if a.mig_start not in profile.placements:
            raise InvalidRequest(
                "MIG placement",
                f"{flavor.profile}@{a.mig_start} in allocation {a.id}",
                f"a start slot in {list(profile.placements)}",
            )
        return [
            (a.node, a.gpus[0], s) for s in range(a.mig_start, a.mig_start + profile.memory_slices)
        ]
    slots = mig.geometry(flavor.model).memory_slices if mig.is_mig_capable(flavor.model) else 1
    return [(a.node, g, s) for g in a.gpus for s in range(slots)]


# Every allocation of a commit parses its flavor, and a cluster has only a few dozen of them.
# Flavor is immutable; invalid names raise every time (lru_cache keeps no exceptions).
_parse_flavor = lru_cache(maxsize=1024)(Flavor.parse)


def pg_text_array(values: Iterable[str]) -> str:
    """``values`` as a PostgreSQL text array literal, for a ``%s::text[]`` parameter.

    psycopg adapts a Python list element by element in Python code (the largest client-side
    cost of a pipelined commit's claims); this is one join. Every element is quoted, so
    ``NULL``, commas, braces, quotes, backslashes and spaces stay the text they are."""
    return (
        "{"
        + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
        + "}"
    )


def pg_int_array(values: Iterable[int]) -> str:
    """``values`` as a PostgreSQL integer array literal, for a ``%s::int[]`` parameter."""
    return "{" + ",".join(map(str, map(int, values))) + "}"
