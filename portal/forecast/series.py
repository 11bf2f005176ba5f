"""Hourly demand series per tenant and flavor, read from the allocator's history.

Two series per (tenant, flavor), hour by hour:

- **arrivals**: workloads created in the hour, counted under the flavor of their first
  allocation (a request may accept several models; the flavor is known once it is placed).
  Workloads never placed are not counted: the history holds no flavor for them.
- **GPU-hours**: GPU-equivalents held in the hour, from the same allocation intervals cost
  accounting prices (``portal.accounting.history``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Table, select

from policies.errors import InvalidRequest
from policies.forecast import HOUR_S, hourly_counts, hourly_gpu_hours
from portal.accounting.history import epoch_seconds, usage_intervals
from portal.store.models import metadata
from portal.store.writer import Store

_ALLOCATIONS: Table = metadata.tables["allocations"]
_WORKLOADS: Table = metadata.tables["workloads"]


@dataclass(frozen=True, slots=True)
class DemandSeries:
    """One tenant's demand for one flavor, hour by hour from ``start``."""

    tenant: str
    flavor: str
    start: datetime
    arrivals: tuple[float, ...]
    gpu_hours: tuple[float, ...]


def _whole_hour(name: str, at: datetime) -> int:
    if at.tzinfo is None:
        raise InvalidRequest(name, at.isoformat(), "a time with a time zone (UTC)")
    seconds = epoch_seconds(at)
    if seconds % HOUR_S or at.microsecond:
        raise InvalidRequest(name, at.isoformat(), "a whole hour, such as 2026-11-02T13:00:00Z")
    return seconds


def demand_series(
    store: Store,
    start: datetime,
    end: datetime,
    now: datetime,
    tenants: Collection[str] | None = None,
) -> list[DemandSeries]:
    """Every (tenant, flavor) with demand in ``[start, end)``, sorted; both at whole hours.

    Args:
        store: the portal's store (read only).
        start, end: the window, whole hours (UTC).
        now: the end of allocations still held.
        tenants: only these; ``None`` for all, including tenants deleted since.
    """
    begin, stop = _whole_hour("start", start), _whole_hour("end", end)
    if stop <= begin:
        raise InvalidRequest("end", end.isoformat(), f"after start ({start.isoformat()})")
    hours = (stop - begin) // HOUR_S
    arrivals: dict[tuple[str, str], list[int]] = defaultdict(list)
    for tenant, flavor, created in _first_placements(store, start, end, tenants):
        arrivals[(tenant, flavor)].append(created)
    held: dict[tuple[str, str], list[tuple[int, int, float]]] = defaultdict(list)
    for iv in usage_intervals(store, start, end, now, tenants=tenants):
        held[(iv.tenant, str(iv.flavor))].append((iv.start, iv.end, float(iv.gpu_equivalent)))
    return [
        DemandSeries(
            tenant,
            flavor,
            start,
            tuple(hourly_counts(arrivals.get((tenant, flavor), ()), begin, hours)),
            tuple(hourly_gpu_hours(held.get((tenant, flavor), ()), begin, hours)),
        )
        for tenant, flavor in sorted(arrivals.keys() | held.keys())
    ]


def _first_placements(
    store: Store, start: datetime, end: datetime, tenants: Collection[str] | None
) -> list[tuple[str, str, int]]:
    """(tenant, flavor of its first allocation, creation second) of each workload created in
    the window that was ever placed."""
    a, w = _ALLOCATIONS.c, _WORKLOADS.c
    query = (
        select(w.id, w.tenant, w.created_at, a.flavor)
        .join(_ALLOCATIONS, a.workload_id == w.id)
        .where(w.created_at >= start, w.created_at < end)
        .order_by(w.id, a.created_at, a.id)
    )
    if tenants is not None:
        query = query.where(w.tenant.in_(sorted(tenants)))
    seen: set[str] = set()
    out: list[tuple[str, str, int]] = []
    with store.engine.connect() as conn:
        for r in conn.execute(query):
            if r.id in seen:
                continue
            seen.add(r.id)
            out.append((r.tenant, r.flavor, epoch_seconds(r.created_at)))
    return out
