"""Estimates the allocator gives people: queue ETAs and GPU-hours used this budget period.

Functions over the allocator's state, kept apart from its bookkeeping like ``scheduling``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from policies import quota
from policies.eta import estimate_wait

if TYPE_CHECKING:
    from portal.allocator.engine import Allocator
    from portal.allocator.live import Live


def eta(self: Allocator, lv: Live, ahead: list[Live], now: datetime) -> float | None:
    """Estimated wait (policies.eta) in the unit of the workload's first candidate flavor."""
    models = self._models_for(lv.req)
    if not models:
        return None
    fl = str(lv.req.devices.flavor(models[0]))
    need = lv.req.devices.amount() * lv.req.gang_size
    by_quota = lv.rec.reason == quota.QueueReason.QUOTA.value
    tenant = lv.rec.tenant

    def counts(other: Live) -> bool:
        return not by_quota or other.rec.tenant == tenant

    ahead_amounts = [
        o.req.devices.amount() * o.req.gang_size
        for o in ahead
        if counts(o) and any(str(o.req.devices.flavor(m)) == fl for m in self._models_for(o.req))
    ]
    ends: list[tuple[float, int]] = []
    live = self._live
    for wid, held in self._ledger.holders.get(fl, {}).items():
        o = live.get(wid)
        if o is not None and held and (not by_quota or o.rec.tenant == tenant):
            ends.append((o.end_at, held))
    if by_quota:
        q = self._quotas.get((tenant, fl))
        free = max(0, (q.limit if q else 0) - self._ledger.usage.get((tenant, fl), 0))
    else:
        used = sum(v for (_, f), v in self._ledger.usage.items() if f == fl)
        free = max(0, self._capacity.get(fl, 0) - used)
    return estimate_wait(ahead_amounts, ends, free, need, now.timestamp())


def gpu_hours_this_period(self: Allocator, tenant: str, flavor: str, now: datetime) -> float:
    """GPU-hours of ``flavor`` the tenant used this calendar month (UTC), running included."""
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if self._period_start != start:
        self._period_start = start
        self._period_done = {}
        owners: dict[str, str] = {}
        for a in self._store.allocations_between(start, now):
            if a.released_at is None or a.created_at is None or not a.flavor:
                continue
            if a.workload_id not in owners:
                w = self._store.workload(a.workload_id)
                owners[a.workload_id] = w.tenant if w is not None else ""
            tenant_of = owners[a.workload_id]
            add_period(self, tenant_of, a.flavor, a.gpu_equivalent, a.created_at, a.released_at)
    total = self._period_done.get((tenant, flavor), 0.0)
    for lv in self._live.values():
        if lv.rec.tenant != tenant:
            continue
        for a in lv.allocations:
            if a.flavor == flavor and a.created_at is not None:
                total += a.gpu_equivalent * (now - max(a.created_at, start)).total_seconds() / 3600
    return total


def add_period(
    self: Allocator, tenant: str, flavor: str, gpu_eq: float, begin: datetime, end: datetime
) -> None:
    if self._period_start is None or end <= self._period_start:
        return
    hours = (end - max(begin, self._period_start)).total_seconds() / 3600
    key = (tenant, flavor)
    self._period_done[key] = self._period_done.get(key, 0.0) + gpu_eq * hours
