"""Usage intervals from the allocator's persisted allocation history.

Every allocation row keeps when it was made (``created_at``) and when it was released
(``released_at``, NULL while held); its workload names the tenant and owner. That is all cost
accounting needs, so it reads those rows and changes nothing.

Times become whole epoch seconds by flooring both ends: an allocation held from 10:00:00.7 to
10:00:30.2 counts as [10:00:00, 10:00:30), so consecutive allocations never overlap and every
second is charged once. An allocation still held is counted up to ``now``.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, timedelta

from sqlalchemy import Table, or_, select

from policies.flavors import Flavor
from policies.pricing import UsageInterval
from portal.store.models import metadata
from portal.store.writer import Store

_ALLOCATIONS: Table = metadata.tables["allocations"]
_WORKLOADS: Table = metadata.tables["workloads"]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_seconds(at: datetime) -> int:
    """Whole seconds since the epoch, floored (exact: no float in between)."""
    return (at - _EPOCH) // timedelta(seconds=1)


def usage_intervals(
    store: Store,
    start: datetime,
    end: datetime,
    now: datetime,
    tenants: Collection[str] | None = None,
    workloads: Collection[str] | None = None,
) -> list[UsageInterval]:
    """Allocations held at some time in ``[start, end)``, as intervals of whole seconds.

    Args:
        store: the portal's store (read only).
        start, end: the window; intervals are not clipped to it (pricing cuts at periods).
        now: the end of allocations still held; none may start after it.
        tenants: only these tenants; ``None`` for all, including tenants deleted since.
        workloads: only the allocations of these workloads (a job's attempts); ``None``: all.
    """
    a, w = _ALLOCATIONS.c, _WORKLOADS.c
    query = (
        select(
            a.id,
            a.workload_id,
            a.flavor,
            a.amount,
            a.created_at,
            a.released_at,
            w.tenant,
            w.owner,
        )
        .join(_WORKLOADS, a.workload_id == w.id)
        .where(a.created_at < end, or_(a.released_at.is_(None), a.released_at > start))
        .order_by(a.created_at, a.id)
    )
    if tenants is not None:
        query = query.where(w.tenant.in_(sorted(tenants)))
    if workloads is not None:
        query = query.where(a.workload_id.in_(sorted(workloads)))
    with store.engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
    now_s = epoch_seconds(now)
    out: list[UsageInterval] = []
    for r in rows:
        begin = epoch_seconds(r["created_at"])
        released = r["released_at"]
        finish = epoch_seconds(released) if released is not None else max(begin, now_s)
        out.append(
            UsageInterval(
                allocation_id=r["id"],
                workload_id=r["workload_id"],
                tenant=r["tenant"],
                owner=r["owner"],
                flavor=Flavor.parse(r["flavor"]),
                amount=int(r["amount"]),
                start=begin,
                end=finish,
            )
        )
    return out
