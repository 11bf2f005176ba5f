"""Estimates the allocator gives people: where a queued workload stands and when it may start.

Reads a ``Memory`` (the live state, under the allocator's lock); changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from policies import eta_sim, quota
from policies.eta import Interval, ReleaseCurve, RunLengths, WaitCalibration, minutes_words
from policies.placement.framework import PlacementContext
from portal.allocator.draft import Decision
from portal.allocator.memory import Live, Memory
from portal.allocator.ops import restored_placement
from portal.allocator.releases import ReleaseIndex
from portal.allocator.views import QueueEntry
from portal.store.records import WorkloadState


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


def queue_entries(
    mem: Memory, now: datetime, intervals: dict[str, Interval | None] | None = None
) -> list[QueueEntry]:
    """Every queued workload's entry; ``intervals``: ``queue_intervals`` of this state when
    the caller keeps them (the allocator recomputes them once per change)."""
    ordered = mem.order(now)
    per_tenant: dict[str, int] = {}
    out = []
    etas = QueueEtas(mem, now)
    if intervals is None:
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
    """The wait of every queued workload by id: its point, p20–p80 interval and reason, or
    None when no replay admits it (only a release nobody can foresee admits it). The queue is
    replayed forward from this snapshot (``policies.eta_sim``): the running work ends at its
    time limits (shortened as its group's runs usually are) or, without one, after the time its
    tenant's runs of its kind took (``history``). ``calibration`` (past estimates against the
    waits that followed) rescales each interval."""
    t = now.timestamp()
    holders = []
    for lv in mem.live.values():
        if not lv.allocations:
            continue
        rec = lv.rec
        held: dict[str, int] = {}
        for a in lv.allocations:
            if a.flavor:
                held[a.flavor] = held.get(a.flavor, 0) + a.amount
        preempting = rec.state is WorkloadState.PREEMPTING and math.isfinite(lv.end_at)
        holders.append(
            eta_sim.Holder(
                rec.tenant,
                tuple(held.items()),
                rec.started_at.timestamp() if rec.started_at is not None else t,
                (rec.tenant, rec.kind),
                limit_s=rec.expected_duration_s,
                deadline=lv.end_at if preempting else None,
                placed=tuple(
                    restored_placement(mem.nodes[a.node], a)
                    for a in lv.allocations
                    if a.node in mem.nodes
                ),
            )
        )
    queue = [_waiting(mem, lv) for lv in mem.order(now)]
    got = eta_sim.simulate(
        t,
        mem.book(),
        mem.ledger.usage,
        holders,
        queue,
        history,
        placing=eta_sim.Placing(mem.cluster, mem.policy, eta_sim.place_tries(len(mem.cluster))),
    )
    out: dict[str, Interval | None] = {}
    for i, w in enumerate(queue):
        est = got.get(w.id)
        unit = w.flavors[0].split("/")[0] if w.flavors else "GPU"
        if est is not None and est.at_least is not None:
            # Not replayed to the end (the cap): an honest lower bound, not calibrated.
            low = est.at_least
            reason = f"{_ahead(i)}; starts {minutes_words(low)} at the earliest" + AT_LEAST
            out[w.id] = Interval(low, low, low, reason)
            continue
        if est is None or est.interval is None:
            out[w.id] = None
            continue
        iv = est.interval._replace(reason=_reason(i, unit, est))
        out[w.id] = calibration.apply(iv) if calibration else iv
    return out


AT_LEAST = " (the estimate replays a limited number of placements; the rest is unknown)"


def _waiting(mem: Memory, lv: Live) -> eta_sim.Waiting:
    """A queued workload as the replay sees it: its flavors (one per model it may use, in the
    allocator's order) and how it is placed."""
    dev = lv.req.devices
    pairs = tuple((m, mem.flavor_name(dev, m)) for m in mem.models_for(lv.req))
    tenant = mem.tenants.get(lv.rec.tenant)
    shape = None
    if dev.kind is not None and pairs:
        ctx = PlacementContext(
            pools=frozenset(tenant.pools) if tenant is not None else frozenset(),
            prefer=lv.req.prefer_nodes,
        )
        shape = eta_sim.Shape(dev, lv.req.gang_size, ctx, pairs)
    return eta_sim.Waiting(
        lv.rec.id,
        lv.rec.tenant,
        tuple(dict.fromkeys(fl for _, fl in pairs)),
        dev.amount() * lv.req.gang_size,
        (lv.rec.tenant, lv.rec.kind),
        lv.rec.expected_duration_s,
        shape,
    )


def _ahead(count: int) -> str:
    if count == 0:
        return "nothing ahead of you"
    return "1 workload ahead of you" if count == 1 else f"{count} workloads ahead of you"


def _reason(ahead: int, unit: str, est: eta_sim.Estimate) -> str:
    """What the estimate rests on, in words: the queue ahead and the releases it waits for
    (in its median replay): ends at time limits, or ends judged by past run lengths."""
    assert est.interval is not None
    when = minutes_words(est.interval.point)
    n = est.by_limit + est.by_history
    if n <= 1:
        how = "reaches its time limit" if est.by_limit else "ends, judging by past run lengths"
        return f"{_ahead(ahead)}; the next {unit} frees {when} when a job {how}"
    if est.by_history == 0:
        basis = "all at their time limits"
    elif est.by_limit == 0:
        basis = "judging by past run lengths"
    else:
        basis = f"{est.by_limit} at time limits, {est.by_history} judging by past run lengths"
    return f"{_ahead(ahead)}; {unit} frees for it {when}, after {n} jobs end ({basis})"


class WaitLearning:
    """The live calibration of the queue's intervals (``WaitCalibration``): the first raw
    estimate each queued workload was given (its point, and when), learned from when the
    allocator admits it. Workloads that end without starting are forgotten unlearned."""

    __slots__ = ("_first", "calibration")

    def __init__(self, calibration: WaitCalibration | None = None) -> None:
        self.calibration = calibration if calibration is not None else WaitCalibration()
        self._first: dict[str, tuple[float, float]] = {}  # id -> (read at, raw point)

    def seen(self, raw: Mapping[str, Interval | None], now: float) -> None:
        """Remember the estimates of workloads not estimated before."""
        first = self._first
        for wid, iv in raw.items():
            if iv is not None and wid not in first:
                first[wid] = (now, iv.point)

    def observe(self, decision: Decision) -> None:
        """Learn from the workloads a decision admitted (an allocator observer: quick)."""
        for rec in decision.changes.workloads:
            got = self._first.get(rec.id)
            if got is None:
                continue
            if rec.started_at is not None:
                del self._first[rec.id]
                at, point = got
                self.calibration.add(point, max(0.0, rec.started_at.timestamp() - at))
            elif rec.state.terminal:
                del self._first[rec.id]

    def apply(self, raw: Mapping[str, Interval | None]) -> dict[str, Interval | None]:
        cal = self.calibration
        return {wid: cal.apply(iv) if iv is not None else None for wid, iv in raw.items()}
