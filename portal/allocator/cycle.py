"""The scheduling cycle, decided on a draft.

1. end the grace period of preempted workloads whose deadline passed (their devices free up);
2. order the queue: priority, then the tenant's weighted dominant share (with decayed
   history), then arrival;
3. for each pending workload in that order: admit it by quota (per allowed model), place it
   (all gang members or none), start it — or record why not (``admission``);
4. the first workload blocked by capacity reserves the node closest to fitting it, so smaller
   workloads behind it are placed elsewhere (backfill without starving the large one);
5. a workload refused only because borrowers hold its tenant's guaranteed share reclaims it
   (``reclaim``): a minimal set of borrowing workloads is told to stop, with a grace period.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies import quota
from policies.placement.backfill import reserve_node
from policies.requests import DeviceRequest
from portal.allocator.admission import Blocked, note_blocked, try_start
from portal.allocator.draft import Draft
from portal.allocator.memory import Live
from portal.store.records import WorkloadState

# A release retries at most this many queued workloads, in queue order; the periodic full
# cycle (``Allocator.tick``, every second in the service) reaches the rest. It bounds the
# latency of a release however long the queue is, as kube-scheduler bounds a cycle.
PARTIAL_CYCLE_TRIES = 16

_QUOTA_REASONS = (quota.QueueReason.QUOTA.value, quota.QueueReason.BUDGET.value)
_CAPACITY_REASONS = (quota.QueueReason.CAPACITY.value, quota.QueueReason.TOPOLOGY.value)


def schedule(draft: Draft, fresh: str | None = None, freed: frozenset[str] | None = None) -> None:
    """One scheduling cycle (see the module docstring). ``fresh``: only this new workload
    needs trying (nothing was freed), the rest keep their last verdicts and reservations.
    ``freed``: only these flavors got capacity or quota back, so only workloads that could use
    one of them are retried (``None``: everything may have changed)."""
    now = draft.now
    # 1. expired grace periods
    expired = [
        lv
        for lv in (draft.live[w] for w in sorted(draft.preempting))
        if lv.rec.preempt_deadline is not None and lv.rec.preempt_deadline <= now
    ]
    ended: set[str] = set()
    freed_by = draft.freed_by()
    for lv in expired:
        for fl in {a.flavor for a in lv.allocations if a.flavor}:
            ended.add(fl)
            freed_by[fl] = freed_by.get(fl, frozenset()) | {lv.rec.tenant}
        draft.finish(lv, WorkloadState.RELEASED, "preempted")
    if ended:
        # Preempted work ended: a partial cycle over what it freed, for everyone.
        affected = draft.affected()
        affected.update(dict.fromkeys(ended))
        draft.set_scalars(affected=tuple(affected.items()), freed_by=tuple(freed_by.items()))
        if freed is not None or fresh is not None:
            freed = (freed or frozenset()) | ended
    if fresh is not None and freed is None:
        _try_fresh(draft, draft.live[fresh])
        return
    # 2.-5. A partial cycle (``freed``) keeps the reservation of a workload it does not retry.
    _drop_stale_reservation(draft)
    if freed is None:
        draft.set_scalars(reserved=frozenset(), reserved_for=None)
    reserved: set[str] = set(draft.scalars.reserved)
    holder = draft.scalars.reserved_for
    # Work ordered before the holder is not bound by its reservation, and the first of it
    # blocked by capacity reserves instead — what a full cycle, which starts with none, does.
    ahead = holder is not None and holder in draft.queued
    budget = PARTIAL_CYCLE_TRIES if freed is not None else None
    failed_shapes: set[tuple[object, ...]] = set()
    tried: set[str] = set()
    affected = draft.affected() if freed is not None else {}
    # What ``_may_start`` computes per request shape: a queue of hundreds has a few dozen
    # shapes, and a shape's flavors do not change during a cycle.
    usable_of: dict[DeviceRequest, frozenset[str]] = {}
    why = _Freed(affected, draft.freed_by() if freed is not None else {}, usable_of)
    if freed is None:
        pending = draft.order(now)
    else:
        # Only what the release could help (and the holder, which ends ``ahead``) needs
        # ordering: the rest is skipped below whatever its place. Trying a workload changes
        # no other queued workload's request or reason, so filtering first skips the same.
        first_holder = holder

        def keep(lv: Live) -> bool:
            return lv.rec.id == first_holder or _may_start(draft, lv, freed, why)

        pending = draft.order(now, keep)
    for queued in pending:
        lv = draft.live[queued.rec.id]
        if ahead and lv.rec.id == draft.scalars.reserved_for:
            ahead = False
        shape = (lv.req.devices, lv.req.gang_size, lv.rec.tenant)
        if shape in failed_shapes:
            continue
        if freed is not None and not _may_start(draft, lv, freed, why):
            continue
        if budget is not None:
            if budget == 0:
                break  # the rest wait for the next full cycle (``tick``)
            budget -= 1
        if lv.rec.id == holder:
            reserved, holder = set(), None  # the holder itself may use its reserved node
        tried.add(lv.rec.id)
        blocked = try_start(draft, lv, frozenset() if ahead else frozenset(reserved))
        if blocked is None:
            continue
        if blocked.reason in _CAPACITY_REASONS:
            failed_shapes.add(shape)
            if (ahead or not reserved) and blocked.capacity_model is not None:
                node = reserve_for(draft, lv, blocked.capacity_model)
                if node is not None:
                    reserved, holder, ahead = {node}, lv.rec.id, False
        note_blocked(draft, lv, blocked)
    draft.set_scalars(reserved=frozenset(reserved), reserved_for=holder)
    if fresh is not None and fresh in draft.queued and fresh not in tried:
        _try_fresh(draft, draft.live[fresh])


def _try_fresh(draft: Draft, lv: Live) -> None:
    """Try one new workload against the current reservation."""
    _drop_stale_reservation(draft)
    holder = draft.scalars.reserved_for
    # A workload ordered before the holder is not bound by its reservation (see ``schedule``).
    first = (
        holder is not None
        and holder in draft.queued
        and draft.precedes(lv, draft.live[holder], draft.now)
    )
    reserved = frozenset() if first else draft.scalars.reserved
    blocked: Blocked | None = try_start(draft, lv, reserved)
    if blocked is None and first and holder is not None:
        # It went before the holder and took what it could: the holder's verdict (and what
        # it should reserve) may have changed, as a full cycle would find.
        draft.set_scalars(reserved=frozenset(), reserved_for=None)
        _try_fresh(draft, draft.live[holder])
    if blocked is not None:
        if (first or not draft.scalars.reserved) and blocked.capacity_model is not None:
            node = reserve_for(draft, lv, blocked.capacity_model)
            if node is not None:
                draft.set_scalars(reserved=frozenset({node}), reserved_for=lv.rec.id)
        note_blocked(draft, lv, blocked)


@dataclass(frozen=True, slots=True)
class _Freed:
    """What a partial cycle knows about what it freed: per flavor, the tenants whose quota
    verdict it can change (None: everyone) and those whose own usage fell; ``usable_of``:
    this cycle's memo of the freed flavors each request shape could use."""

    affected: dict[str, frozenset[str] | None]
    freed_by: dict[str, frozenset[str]]
    usable_of: dict[DeviceRequest, frozenset[str]]


def _may_start(draft: Draft, lv: Live, freed: frozenset[str], why: _Freed) -> bool:
    """Whether what a partial cycle freed (``freed``) may let queued ``lv`` start."""
    dev = lv.req.devices
    if dev.kind is None:
        return True
    usable = why.usable_of.get(dev)
    if usable is None:
        usable = why.usable_of[dev] = freed & draft.flavors_for(lv.req)
    return bool(usable) and (
        lv.rec.reason not in _QUOTA_REASONS or _quota_may_change(draft, why, lv, usable)
    )


def _quota_may_change(draft: Draft, why: _Freed, lv: Live, flavors: frozenset[str]) -> bool:
    """Whether the last release can change ``lv``'s quota verdict for one of ``flavors``.
    Not where its tenant's own quota refuses it and the release left that tenant's usage
    alone: then only its own release or a quota edit (a full cycle) can, and retrying it on
    every other tenant's release spent the partial cycle's tries on work that cannot start."""
    tenant = lv.rec.tenant
    amount = lv.req.devices.amount() * lv.req.gang_size
    for fl in flavors:
        tenants = why.affected.get(fl)
        if tenants is not None and tenant not in tenants:
            continue
        own = why.freed_by.get(fl)
        if own is None or tenant in own:
            return True
        if not quota.own_limit_refuses(draft.book(), draft.ledger.usage, tenant, fl, amount):
            return True
    return False


def _drop_stale_reservation(draft: Draft) -> None:
    """Forget the reservation once its workload is no longer queued."""
    holder = draft.scalars.reserved_for
    if holder is not None and holder not in draft.queued:
        draft.set_scalars(reserved=frozenset(), reserved_for=None)


def reserve_for(draft: Draft, lv: Live, model: str) -> str | None:
    """The node closest to fitting ``lv`` (``policies.placement.backfill.reserve_node``)."""
    return reserve_node(draft.cluster, lv.req.devices, model)
