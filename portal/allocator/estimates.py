"""Estimates the allocator gives people: queue ETAs and GPU-hours used this budget period.

Functions over the allocator's state, kept apart from its bookkeeping like ``scheduling``.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from policies import quota
from policies.eta import ReleaseCurve

if TYPE_CHECKING:
    from portal.allocator.engine import Allocator
    from portal.allocator.live import Live


def eta(self: Allocator, lv: Live, ahead: list[Live], now: datetime) -> float | None:
    """Estimated wait (policies.eta) in the unit of the workload's first candidate flavor."""
    walk = QueueEtas(self, now)
    for other in ahead:
        walk.passed(other)
    return walk.eta(lv)


class QueueEtas:
    """ETAs along a walk down the ordered queue: ``eta(entry)``, then ``passed(entry)``.

    A queued workload waits for everything ahead of it that asks for its flavor — only its own
    tenant's work when it waits for quota, everyone's when it waits for capacity — so the walk
    keeps those amounts as running sums, and builds each flavor's release curve (the running
    holders' expected ends) once. A whole queue costs O(queued + running · log running)
    instead of O(queued · (queued + running)).
    """

    def __init__(self, alloc: Allocator, now: datetime) -> None:
        self._alloc = alloc
        self._now = now.timestamp()
        self._ahead: dict[tuple[str, str | None], int] = {}
        self._curves: dict[tuple[str, str | None], ReleaseCurve] = {}

    def _flavors(self, lv: Live) -> list[str]:
        return [str(lv.req.devices.flavor(m)) for m in self._alloc._models_for(lv.req)]

    def passed(self, lv: Live) -> None:
        """``lv`` is ahead of every entry asked about from now on."""
        amount = lv.req.devices.amount() * lv.req.gang_size
        for fl in set(self._flavors(lv)):
            for key in ((fl, None), (fl, lv.rec.tenant)):
                self._ahead[key] = self._ahead.get(key, 0) + amount

    def eta(self, lv: Live) -> float | None:
        flavors = self._flavors(lv)
        if not flavors:
            return None
        fl = flavors[0]
        a = self._alloc
        tenant = lv.rec.tenant if lv.rec.reason == quota.QueueReason.QUOTA.value else None
        if tenant is not None:
            q = a._quotas.get((tenant, fl))
            free = max(0, (q.limit if q else 0) - a._ledger.usage.get((tenant, fl), 0))
        else:
            used = sum(v for (_, f), v in a._ledger.usage.items() if f == fl)
            free = max(0, a._capacity.get(fl, 0) - used)
        need = lv.req.devices.amount() * lv.req.gang_size
        return self._curve(fl, tenant).wait(self._ahead.get((fl, tenant), 0), free, need, self._now)

    def _curve(self, fl: str, tenant: str | None) -> ReleaseCurve:
        key = (fl, tenant)
        curve = self._curves.get(key)
        if curve is None:
            ends: list[tuple[float, int]] = []
            live = self._alloc._live
            for wid, held in self._alloc._ledger.holders.get(fl, {}).items():
                o = live.get(wid)
                if o is not None and held and (tenant is None or o.rec.tenant == tenant):
                    ends.append((o.end_at, held))
            curve = self._curves[key] = ReleaseCurve(ends)
        return curve


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
