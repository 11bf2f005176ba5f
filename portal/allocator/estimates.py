"""Estimates the allocator gives people: where a queued workload stands and when it may start.

Reads a ``Memory`` (the live state, under the allocator's lock); changes nothing.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from policies import quota
from policies.eta import (
    Interval,
    IntervalCurve,
    Release,
    ReleaseCurve,
    RunLengths,
    WaitCalibration,
    release_of,
)
from portal.allocator.memory import Live, Memory
from portal.allocator.releases import ReleaseIndex
from portal.allocator.views import QueueEntry


def eta(mem: Memory, lv: Live, ahead: list[Live], now: datetime) -> float | None:
    """Estimated wait (policies.eta): the soonest over the flavors the workload may use;
    None: no estimate (only a release it cannot foresee admits it)."""
    walk = QueueEtas(mem, now, bulk=False)
    for other in ahead:
        walk.passed(other)
    return walk.eta(lv)


class QueueEtas:
    """ETAs along a walk down the ordered queue: ``eta(entry)``, then ``passed(entry)``.

    A queued workload waits for everything ahead of it that asks for its flavor — only its own
    tenant's work when it waits for quota, everyone's when it waits for capacity — so the walk
    keeps those amounts as running sums, and builds each flavor's release curve (the running
    holders' expected ends, kept sorted by the state's release timelines) once: a whole queue
    costs O(queued + running). ``bulk`` False, for one question, walks a timeline only as far
    as its answer instead of building the curve.
    """

    def __init__(self, mem: Memory, now: datetime, *, bulk: bool = True) -> None:
        self._mem = mem
        self._bulk = bulk
        self._now = now.timestamp()
        self._ahead: dict[tuple[str, str | None], int] = {}
        self._curves: dict[tuple[str, str | None], ReleaseCurve] = {}

    def _flavors(self, lv: Live) -> list[str]:
        return [str(lv.req.devices.flavor(m)) for m in self._mem.models_for(lv.req)]

    def passed(self, lv: Live) -> None:
        """``lv`` is ahead of every entry asked about from now on."""
        amount = lv.req.devices.amount() * lv.req.gang_size
        for fl in set(self._flavors(lv)):
            for key in ((fl, None), (fl, lv.rec.tenant)):
                self._ahead[key] = self._ahead.get(key, 0) + amount

    def eta(self, lv: Live) -> float | None:
        """The soonest wait over the flavors ``lv`` may use (it starts on whichever frees
        first); None when none of them has an estimate."""
        waits = [self._eta_on(lv, fl) for fl in dict.fromkeys(self._flavors(lv))]
        known = [w for w in waits if w is not None]
        return min(known) if known else None

    def _eta_on(self, lv: Live, fl: str) -> float | None:
        mem = self._mem
        tenant = lv.rec.tenant if lv.rec.reason == quota.QueueReason.QUOTA.value else None
        if tenant is not None:
            q = mem.quotas.get((tenant, fl))
            free = max(0, (q.limit if q else 0) - mem.ledger.used(tenant, fl))
        else:
            free = max(0, mem.capacity().get(fl, 0) - mem.ledger.used_of_flavor(fl))
        need = lv.req.devices.amount() * lv.req.gang_size
        wait = self._wait(fl, tenant, free, need)
        if wait == 0.0 and tenant is not None:
            # Its limit has room, yet it waits: capacity (or what it may borrow) binds.
            free = max(0, mem.capacity().get(fl, 0) - mem.ledger.used_of_flavor(fl))
            wait = self._wait(fl, None, free, need)
        if wait == 0.0:
            # It fits by the counts and still waits (it may not borrow what is free, or the
            # free devices are in the wrong places): only a release can admit it, and when
            # that comes is unknown. Zero would read "under a minute".
            return None
        return wait

    def _wait(self, fl: str, tenant: str | None, free: int, need: int) -> float | None:
        ahead = self._ahead.get((fl, tenant), 0)
        if not self._bulk:
            return _releases(self._mem).timeline(fl, tenant).wait(ahead, free, need, self._now)
        key = (fl, tenant)
        curve = self._curves.get(key)
        if curve is None:
            curve = self._curves[key] = _releases(self._mem).timeline(fl, tenant).curve()
        return curve.wait(ahead, free, need, self._now)


def _releases(mem: Memory) -> ReleaseIndex:
    if mem.releases is None:
        raise RuntimeError("ETAs are read on the applied state, not on a decision's draft")
    return mem.releases


def queue_entries(mem: Memory, now: datetime) -> list[QueueEntry]:
    ordered = mem.order(now)
    per_tenant: dict[str, int] = {}
    out = []
    etas = QueueEtas(mem, now)
    intervals = queue_intervals(mem, now, history_of(mem)) if ordered else {}
    for i, lv in enumerate(ordered, start=1):
        per_tenant[lv.rec.tenant] = per_tenant.get(lv.rec.tenant, 0) + 1
        models = mem.models_for(lv.req) or [""]
        geq = lv.req.devices.gpu_equivalent(models[0]) * lv.req.gang_size if models[0] else 0.0
        out.append(
            QueueEntry(
                workload_id=lv.rec.id,
                tenant=lv.rec.tenant,
                owner=lv.rec.owner,
                name=lv.rec.name,
                priority=lv.rec.priority,
                position=i,
                tenant_position=per_tenant[lv.rec.tenant],
                reason=lv.rec.reason,
                message=lv.message,
                enqueued_at=lv.rec.created_at,
                gpu_equivalent=geq,
                **eta_fields(etas.eta(lv), intervals.get(lv.rec.id)),
            )
        )
        etas.passed(lv)
    return out


def history_of(mem: Memory) -> RunLengths:
    """The run lengths the state has seen end (none on a decision's draft)."""
    return mem.run_lengths if mem.run_lengths is not None else RunLengths()


NO_RELEASE_FORESEEN = "waits for a release; no running workload it waits for has an end time"


def eta_fields(point: float | None, got: Interval | None) -> dict[str, Any]:
    """``eta_s`` with the p20-p80 interval around it and its reason. The calibrated estimate
    (``got``: declared ends and, for holders without one, their tenant's past run lengths)
    gives the point when it has one; else ``point`` (declared ends alone). Neither: no
    interval either, and the reason says only a release admits it (portal.waits)."""
    if got is not None:
        return {
            "eta_s": got.point,
            "eta_low_s": min(got.point, got.low),
            "eta_high_s": max(got.point, got.high),
            "eta_reason": got.reason,
        }
    if point is None:
        return {
            "eta_s": None,
            "eta_low_s": None,
            "eta_high_s": None,
            "eta_reason": NO_RELEASE_FORESEEN,
        }
    return {"eta_s": point, "eta_low_s": point, "eta_high_s": point, "eta_reason": ""}


def queue_position(
    mem: Memory, workload_id: str, now: datetime
) -> tuple[int, int, float | None] | None:
    """Position, position within its tenant and ETA of one queued workload — what
    ``queue_entries`` says about it, without computing the other entries."""
    ordered = mem.order(now)
    for i, lv in enumerate(ordered):
        if lv.rec.id == workload_id:
            tenant = lv.rec.tenant
            tpos = sum(1 for o in ordered[: i + 1] if o.rec.tenant == tenant)
            return i + 1, tpos, eta(mem, lv, ordered[:i], now)
    return None


def queue_intervals(
    mem: Memory,
    now: datetime,
    history: RunLengths,
    calibration: WaitCalibration | None = None,
) -> dict[str, Interval | None]:
    """The calibrated wait (policies.eta.IntervalCurve) of every queued workload by id: its
    point, p20–p80 interval and reason, or None when no known or estimated end frees enough
    (only a release nobody can foresee admits it). Holders without a declared end are given
    the remaining time their tenant's runs of their kind took (``history``). Walks the queue
    once, like ``queue_entries``: O(queued + running · log). ``calibration`` (past estimates
    against the waits that followed) rescales each raw interval."""
    t = now.timestamp()
    releases: dict[tuple[str, str | None], list[Release]] = {}
    for lv in mem.live.values():
        if not lv.allocations:
            continue
        rec = lv.rec
        started = rec.started_at.timestamp() if rec.started_at is not None else t
        end = lv.end_at if math.isfinite(lv.end_at) else None
        held: dict[str, int] = {}
        for a in lv.allocations:
            if a.flavor:
                held[a.flavor] = held.get(a.flavor, 0) + a.amount
        for fl, amount in held.items():
            r = release_of(amount, started, end, (rec.tenant, rec.kind), history, t)
            for key in ((fl, None), (fl, rec.tenant)):
                releases.setdefault(key, []).append(r)
    curves: dict[tuple[str, str | None], IntervalCurve] = {}
    ahead: dict[tuple[str, str | None], tuple[int, int]] = {}
    out: dict[str, Interval | None] = {}
    for lv in mem.order(now):
        flavors = [str(lv.req.devices.flavor(m)) for m in mem.models_for(lv.req)]
        need = lv.req.devices.amount() * lv.req.gang_size
        got = _interval(mem, lv, flavors, need, t, releases, curves, ahead)
        out[lv.rec.id] = calibration.apply(got) if calibration and got else got
        for fl in set(flavors):
            for key in ((fl, None), (fl, lv.rec.tenant)):
                amount, count = ahead.get(key, (0, 0))
                ahead[key] = (amount + need, count + 1)
    return out


def _interval(
    mem: Memory,
    lv: Live,
    flavors: list[str],
    need: int,
    now: float,
    releases: dict[tuple[str, str | None], list[Release]],
    curves: dict[tuple[str, str | None], IntervalCurve],
    ahead: dict[tuple[str, str | None], tuple[int, int]],
) -> Interval | None:
    """The soonest wait over the workload's candidate flavors: it starts on whichever frees
    first (a request for any model waits on all of them)."""
    best: Interval | None = None
    for fl in dict.fromkeys(flavors):
        got = _flavor_interval(mem, lv, fl, need, now, releases, curves, ahead)
        if got is not None and (best is None or got.point < best.point):
            best = got
    return best


def _flavor_interval(
    mem: Memory,
    lv: Live,
    fl: str,
    need: int,
    now: float,
    releases: dict[tuple[str, str | None], list[Release]],
    curves: dict[tuple[str, str | None], IntervalCurve],
    ahead: dict[tuple[str, str | None], tuple[int, int]],
) -> Interval | None:
    unit = fl.split("/")[0]
    scopes: list[str | None] = [None]
    if lv.rec.reason == quota.QueueReason.QUOTA.value:
        scopes.insert(0, lv.rec.tenant)
    for tenant in scopes:
        if tenant is not None:
            q = mem.quotas.get((tenant, fl))
            free = max(0, (q.limit if q else 0) - mem.ledger.used(tenant, fl))
        else:
            free = max(0, mem.capacity().get(fl, 0) - mem.ledger.used_of_flavor(fl))
        key = (fl, tenant)
        curve = curves.get(key)
        if curve is None:
            curve = curves[key] = IntervalCurve(releases.get(key, []))
        amount, count = ahead.get(key, (0, 0))
        got = curve.interval(amount, free, need, now, count, unit)
        if got is None or got.point > 0.0:
            return got
    # It fits by the counts and still waits (the free devices are in the wrong places, or it
    # may not borrow them): a release must admit it. Counting nothing free as usable, the
    # estimate is when the releases cover the queue ahead and it; None when no holder has a
    # known or estimated end, never zero ("under a minute").
    amount, count = ahead.get((fl, None), (0, 0))
    got = curves[(fl, None)].interval(amount, 0, need, now, count, unit)
    if got is None or got.point <= 0.0:
        return None
    return Interval(
        got.point, got.low, got.high, f"free {unit} devices do not fit it; {got.reason}"
    )
