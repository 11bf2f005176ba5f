"""The scheduling cycle of the allocator, kept apart from its bookkeeping.

A cycle, under the allocator's lock:

1. end the grace period of preempted workloads whose deadline passed (their devices free up);
2. order the queue: priority, then the tenant's weighted dominant share (with decayed
   history), then arrival;
3. for each pending workload in that order: admit it by quota (per allowed model), place it
   (all gang members or none), start it — or record why not;
4. the first workload blocked by capacity reserves the node closest to fitting it, so smaller
   workloads behind it are placed elsewhere (backfill without starving the large one);
5. a workload refused only because borrowers hold its tenant's guaranteed share reclaims it:
   a minimal set of borrowing workloads is told to stop, with a grace period.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from policies import fairness, quota
from policies.flavors import FlavorKind
from policies.placement.framework import PlacementContext
from policies.placement.pipeline import NoFit, place_gang
from policies.placement.state import Placement
from policies.preemption import RunningItem, select_victims
from policies.requests import DeviceRequest, TopologyRequirement
from portal.allocator import estimates
from portal.allocator.views import QueueEntry
from portal.store.records import WorkloadState

if TYPE_CHECKING:
    from portal.allocator.engine import Allocator
    from portal.allocator.live import Live, Txn


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why a workload did not start in this cycle."""

    reason: str
    message: str
    reclaim: dict[str, int] | None = None
    flavor: str | None = None
    capacity_model: str | None = None


def order(self: Allocator) -> list[Live]:
    """Queued workloads in scheduling order (step 2)."""
    now = self._clock()
    shares: dict[str, float] = {}
    cap_geq = self._capacity_geq()
    pending = [self._live[w] for w in self._queued]
    for t in {lv.rec.tenant for lv in pending}:
        hist, at = self._history.get(t, (0.0, now))
        shares[t] = fairness.dominant_share(
            self._ledger.tenant_gpu_equivalents(t),
            cap_geq,
            self._tenants[t].weight if t in self._tenants else 1.0,
            history=fairness.decayed(hist, at.timestamp(), now.timestamp(), self._half_life),
        )
    items = [
        _Queued(lv.rec.priority, lv.rec.tenant, lv.rec.created_at.timestamp(), lv.seq, lv.rec.id)
        for lv in pending
    ]
    return [self._live[item.workload_id] for item in fairness.queue_order(items, shares)]


@dataclass(frozen=True, slots=True)
class _Queued:
    priority: int
    tenant: str
    enqueued_at: float
    seq: int
    workload_id: str


def schedule(
    self: Allocator, txn: Txn, fresh: str | None = None, freed: frozenset[str] | None = None
) -> None:
    """One scheduling cycle (see the module docstring). ``fresh``: only this new workload
    needs trying (nothing was freed), the rest keep their last verdicts and reservations.
    ``freed``: only these flavors got capacity or quota back, so only workloads that could use
    one of them are retried (``None``: everything may have changed)."""
    now = self._clock()
    # 1. expired grace periods
    expired = [
        lv
        for lv in (self._live[w] for w in sorted(self._preempting))
        if lv.rec.preempt_deadline is not None and lv.rec.preempt_deadline <= now
    ]
    ended: set[str] = set()
    for lv in expired:
        ended |= {a.flavor for a in lv.allocations if a.flavor}
        self._finish(txn, lv, WorkloadState.RELEASED, "preempted", now)
    if ended:
        # Preempted work ended: a partial cycle over what it freed, for everyone.
        for fl in ended:
            self._affected[fl] = None
        if freed is not None or fresh is not None:
            freed = (freed or frozenset()) | ended
    if fresh is not None and freed is None:
        _try_fresh(self, txn, self._live[fresh], now)
        return
    # 2.-5. A partial cycle (``freed``) keeps the reservation of a workload it does not retry.
    _drop_stale_reservation(self)
    if freed is None:
        self._reserved, self._reserved_for = frozenset(), None
    reserved: set[str] = set(self._reserved)
    holder = self._reserved_for
    budget = PARTIAL_CYCLE_TRIES if freed is not None else None
    failed_shapes: set[tuple[object, ...]] = set()
    tried: set[str] = set()
    for lv in order(self):
        shape = (lv.req.devices, lv.req.gang_size, lv.rec.tenant)
        if shape in failed_shapes:
            continue
        if freed is not None and lv.req.devices.kind is not None:
            usable = freed & self._flavors_for(lv.req)
            if not usable or (
                lv.rec.reason in _QUOTA_REASONS and not _quota_may_change(self, lv, usable)
            ):
                continue
        if budget is not None:
            if budget == 0:
                break  # the rest wait for the next full cycle (``tick``)
            budget -= 1
        if lv.rec.id == holder:
            reserved, holder = set(), None  # the holder itself may use its reserved node
        tried.add(lv.rec.id)
        blocked = try_start(self, txn, lv, frozenset(reserved), now)
        if blocked is None:
            continue
        if blocked.reason in (quota.QueueReason.CAPACITY.value, quota.QueueReason.TOPOLOGY.value):
            failed_shapes.add(shape)
            if not reserved and blocked.capacity_model is not None:
                node = reserve_for(self, lv, blocked.capacity_model)
                if node is not None:
                    reserved, holder = {node}, lv.rec.id
        note_blocked(self, txn, lv, blocked, now)
    self._reserved, self._reserved_for = frozenset(reserved), holder
    if fresh is not None and fresh in self._queued and fresh not in tried:
        _try_fresh(self, txn, self._live[fresh], now)


def _try_fresh(self: Allocator, txn: Txn, lv: Live, now: datetime) -> None:
    """Try one new workload against the current reservation."""
    _drop_stale_reservation(self)
    blocked = try_start(self, txn, lv, self._reserved, now)
    if blocked is not None:
        if not self._reserved and blocked.capacity_model is not None:
            node = reserve_for(self, lv, blocked.capacity_model)
            if node is not None:
                self._reserved, self._reserved_for = frozenset({node}), lv.rec.id
        note_blocked(self, txn, lv, blocked, now)


# A release retries at most this many queued workloads, in queue order; the periodic full
# cycle (``Allocator.tick``, every second in the service) reaches the rest. It bounds the
# latency of a release however long the queue is, as kube-scheduler bounds a cycle.
PARTIAL_CYCLE_TRIES = 16

_QUOTA_REASONS = (quota.QueueReason.QUOTA.value, quota.QueueReason.BUDGET.value)


def _quota_may_change(self: Allocator, lv: Live, flavors: frozenset[str]) -> bool:
    """Whether the last release can change ``lv``'s quota verdict for one of ``flavors``."""
    for fl in flavors:
        tenants = self._affected.get(fl, None)
        if tenants is None or lv.rec.tenant in tenants:
            return True
    return False


def _drop_stale_reservation(self: Allocator) -> None:
    """Forget the reservation once its workload is no longer queued."""
    if self._reserved_for is not None and self._reserved_for not in self._queued:
        self._reserved, self._reserved_for = frozenset(), None


def reserve_for(self: Allocator, lv: Live, model: str) -> str | None:
    """The node closest to fitting ``lv``: most free capacity of the right kind."""
    dev = lv.req.devices
    best: tuple[int, int] | None = None
    name = None
    for st in self._cluster.candidates(frozenset({model})):
        if not st.schedulable:
            continue
        free = st.max_free_milli if dev.kind is FlavorKind.SHARE else st.full_free
        key = (free, -st.order)
        if best is None or key > best:
            best, name = key, st.name
    return name


def _budget_ok(self: Allocator, tenant: str, flavor: str, now: datetime) -> bool:
    q = self._quotas.get((tenant, flavor))
    if q is None or q.budget_gpu_hours is None:
        return True
    used = self._gpu_hours_this_period(tenant, flavor, now)
    return not quota.budget_exhausted(
        quota.FlavorQuota(q.guaranteed, q.limit, q.budget_gpu_hours), used
    )


def try_start(
    self: Allocator, txn: Txn, lv: Live, avoid: frozenset[str], now: datetime
) -> Blocked | None:
    """Admit and place ``lv``; start it and return None, or say why it cannot start."""
    req = lv.req
    dev = req.devices
    members = req.gang_size
    book = self._quota_book()
    tenant = self._tenants[lv.rec.tenant]
    admitted: dict[str, quota.Admission] = {}
    refusal: Blocked | None = None
    if dev.kind is not None:
        for model in self._models_for(req):
            fl = self._flavor_name(dev, model)
            if not _budget_ok(self, tenant.name, fl, now):
                refusal = refusal or Blocked(
                    quota.QueueReason.BUDGET.value,
                    f"{tenant.name} has used its GPU-hour budget for {fl} this period",
                    flavor=fl,
                )
                continue
            adm = quota.admit(book, self._ledger.usage, tenant.name, fl, dev.amount() * members)
            if adm.ok:
                admitted[model] = adm
            elif refusal is None or (refusal.reclaim is None and adm.reclaimable):
                plan = None
                if adm.reclaimable >= adm.shortfall > 0:
                    plan = quota.reclaim_plan(
                        book,
                        self._ledger.usage,
                        self._reclaimable_by_tenant(fl),
                        tenant.name,
                        fl,
                        dev.amount() * members,
                    )
                reason = adm.reason.value if adm.reason else quota.QueueReason.QUOTA.value
                refusal = Blocked(reason, adm.message, plan or None, fl)
        if not admitted:
            assert refusal is not None
            if refusal.reclaim and preempt(
                self, txn, lv, refusal.flavor or "", refusal.reclaim, now
            ):
                return replace(refusal, message=refusal.message + "; reclaiming it now")
            return refusal
    member, gang_topology = _member_shape(self, dev, frozenset(admitted))
    ctx = PlacementContext(pools=frozenset(tenant.pools), avoid=avoid)
    got = place_gang(member, members, self._cluster, self._policy, ctx, gang_topology)
    if isinstance(got, NoFit):
        reason = quota.QueueReason.TOPOLOGY if got.topology else quota.QueueReason.CAPACITY
        return Blocked(
            reason.value, got.summary(), capacity_model=min(admitted) if admitted else None
        )
    placed_model = _model_of(self, got)
    admission = admitted.get(placed_model) if placed_model else None
    self._start(txn, lv, got, admission.borrowed if admission else 0, now)
    return None


def _member_shape(
    self: Allocator, dev: DeviceRequest, admitted: frozenset[str]
) -> tuple[DeviceRequest, TopologyRequirement]:
    """What one gang member asks placement for (restricted to the admitted models), and the
    gang's topology; memoized, as building a request re-validates it."""
    key = (dev, admitted)
    got = self._member_shapes.get(key)
    if got is None:
        gang = (
            dev.topology
            if dev.topology in (TopologyRequirement.SAME_NODE, TopologyRequirement.SAME_RACK)
            else TopologyRequirement.ANY
        )
        own = (
            dev.topology if dev.topology is TopologyRequirement.NVLINK else TopologyRequirement.ANY
        )
        member = replace(dev, models=admitted or dev.models, topology=own)
        got = self._member_shapes[key] = (member, gang)
    return got


def _model_of(self: Allocator, placed: list[Placement]) -> str | None:
    p = placed[0]
    if not p.gpus:
        return None
    return self._nodes[p.node].gpus[p.gpus[0]].model


def note_blocked(self: Allocator, txn: Txn, lv: Live, blocked: Blocked, now: datetime) -> None:
    """Record why the workload waits. The reason is persisted when it changes; the message's
    figures change with every release, so while the reason stays the same only memory (what
    status and queue show) is updated — a cycle must not rewrite every queued row."""
    if lv.rec.reason == blocked.reason:
        lv.note = blocked.message
        return
    lv.note = None
    self._set_record(txn, lv, replace(lv.rec, reason=blocked.reason, message=blocked.message))


def preempt(
    self: Allocator, txn: Txn, claimant: Live, flavor: str, need: dict[str, int], now: datetime
) -> list[str]:
    """Tell a minimal set of borrowing workloads to stop so ``claimant`` gets its share."""
    candidates = [
        RunningItem(
            workload_id=lv.rec.id,
            tenant=lv.rec.tenant,
            flavor=flavor,
            amount=sum(a.amount for a in lv.allocations if a.flavor == flavor),
            priority=lv.rec.priority,
            started_at=(lv.rec.started_at or lv.rec.created_at).timestamp(),
            borrowed=sum(a.amount for a in lv.allocations if a.flavor == flavor and a.borrowed),
        )
        for lv in (self._live[w] for w in self._ledger.holders.get(flavor, {}))
        if lv.rec.state is WorkloadState.RUNNING and lv.rec.tenant in need
    ]
    victims = select_victims(candidates, need, flavor)
    if not victims:
        return []
    for wid in victims:
        lv = self._live[wid]
        self._mark_preempting(txn, lv, 1)
        deadline = now + self.grace_for(lv.rec.kind)
        self._set_record(
            txn,
            lv,
            replace(
                lv.rec,
                state=WorkloadState.PREEMPTING,
                reason="preempted",
                message=(
                    f"{claimant.rec.tenant} reclaims its guaranteed {flavor}; "
                    f"stop or checkpoint before {deadline:%H:%M:%S} UTC"
                ),
                preempt_deadline=deadline,
            ),
        )
        self._set_end(txn, lv)
        self._event(
            txn,
            "workload.preempting",
            lv.rec.tenant,
            wid,
            f"{lv.rec.name} preempted for {claimant.rec.tenant} ({claimant.rec.name})",
            {"claimant": claimant.rec.id, "deadline": deadline.isoformat()},
        )
    return victims


def queue_entries(self: Allocator) -> list[QueueEntry]:
    ordered = order(self)
    per_tenant: dict[str, int] = {}
    out = []
    etas = estimates.QueueEtas(self, self._clock())
    for i, lv in enumerate(ordered, start=1):
        per_tenant[lv.rec.tenant] = per_tenant.get(lv.rec.tenant, 0) + 1
        models = self._models_for(lv.req) or [""]
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
                eta_s=etas.eta(lv),
            )
        )
        etas.passed(lv)
    return out


def queue_position(self: Allocator, workload_id: str) -> tuple[int, int, float | None] | None:
    """Position, position within its tenant and ETA of one queued workload — what
    ``queue_entries`` says about it, without computing the other entries."""
    ordered = order(self)
    for i, lv in enumerate(ordered):
        if lv.rec.id == workload_id:
            tenant = lv.rec.tenant
            tpos = sum(1 for o in ordered[: i + 1] if o.rec.tenant == tenant)
            return i + 1, tpos, self._eta(lv, ordered[:i], self._clock())
    return None
