"""Admission and placement of one queued workload on a draft: quota (per allowed model),
budget, then placement of every gang member or none; start it, or say why it waits.

The same rules answer offers (``offers``), so an offer and the answer to the request made from
it agree unless something changes in between.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from policies import quota
from policies.inventory import Node
from policies.placement.backfill import member_request
from policies.placement.framework import PlacementContext
from policies.placement.gangs import place_gang
from policies.placement.pipeline import NoFit
from policies.placement.state import Placement
from policies.requests import DeviceRequest, TopologyRequirement
from portal.allocator import reclaim
from portal.allocator.draft import Draft, allocation_id
from portal.allocator.memory import Live, Memory
from portal.allocator.ops import Start
from portal.store.records import AllocationRecord, WorkloadState


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why a workload did not start in this cycle."""

    reason: str
    message: str
    reclaim: dict[str, int] | None = None
    flavor: str | None = None
    capacity_model: str | None = None


def budget_message(tenant: str, flavor: str) -> str:
    return f"{tenant} has used its GPU-hour budget for {flavor} this period"


def try_start(draft: Draft, lv: Live, avoid: frozenset[str]) -> Blocked | None:
    """Admit and place ``lv``; start it and return None, or say why it cannot start."""
    req = lv.req
    dev = req.devices
    members = req.gang_size
    now = draft.now
    book = draft.book()
    tenant = draft.tenants[lv.rec.tenant]
    admitted: dict[str, quota.Admission] = {}
    refusal: Blocked | None = None
    if dev.kind is not None:
        for model in draft.models_for(req):
            fl = draft.flavor_name(dev, model)
            if not draft.budget_ok(tenant.name, fl, now):
                refusal = refusal or Blocked(
                    quota.QueueReason.BUDGET.value, budget_message(tenant.name, fl), flavor=fl
                )
                continue
            amount = dev.amount() * members
            adm = quota.admit(book, draft.ledger.usage, tenant.name, fl, amount)
            if adm.ok:
                admitted[model] = adm
            elif refusal is None or (refusal.reclaim is None and adm.reclaimable):
                plan = None
                if adm.reclaimable >= adm.shortfall > 0:
                    plan = quota.reclaim_plan(
                        book,
                        draft.ledger.usage,
                        draft.reclaimable_by_tenant(fl),
                        tenant.name,
                        fl,
                        amount,
                    )
                reason = adm.reason.value if adm.reason else quota.QueueReason.QUOTA.value
                refusal = Blocked(reason, adm.message, plan or None, fl)
        if not admitted:
            assert refusal is not None
            if refusal.reclaim:
                fl = refusal.flavor or ""
                left = reclaim.underway(draft, fl, refusal.reclaim)
                told = bool(left) and bool(reclaim.preempt(draft, lv, fl, left))
                if told or left != refusal.reclaim:
                    return replace(refusal, message=refusal.message + "; reclaiming it now")
            return refusal
    member, gang_topology = member_shape(draft, dev, frozenset(admitted))
    ctx = PlacementContext(pools=frozenset(tenant.pools), avoid=avoid, prefer=lv.req.prefer_nodes)
    got = place_gang(member, members, draft.cluster, draft.policy, ctx, gang_topology)
    if isinstance(got, NoFit):
        reason = quota.QueueReason.TOPOLOGY if got.topology else quota.QueueReason.CAPACITY
        return Blocked(
            reason.value, got.summary(), capacity_model=min(admitted) if admitted else None
        )
    placed_model = model_of(draft, got)
    admission = admitted.get(placed_model) if placed_model else None
    start(draft, lv, got, admission.borrowed if admission else 0)
    return None


def start(draft: Draft, lv: Live, placed: list[Placement], borrowed: int) -> None:
    now = draft.now
    draft.touch_history(lv.rec.tenant)
    lv = draft.live[lv.rec.id]
    allocs: list[AllocationRecord] = []
    for i, p in enumerate(placed):
        node = draft.nodes[p.node]
        model = node.gpus[p.gpus[0]].model if p.gpus else ""
        fl = lv.req.devices.flavor(model)
        gpu_eq = lv.req.devices.gpu_equivalent(model) if fl is not None else 0.0
        allocs.append(
            AllocationRecord(
                id=allocation_id(lv.rec.id, i, now),
                workload_id=lv.rec.id,
                member=i,
                node=p.node,
                flavor=str(fl) if fl is not None else "",
                amount=lv.req.devices.amount(),
                gpu_equivalent=gpu_eq,
                gpus=p.gpus,
                gpu_uuids=device_uuids(node, p),
                milli=p.milli,
                gpu_memory_mib=p.gpu_memory_mib,
                mig_profile=p.mig_profile,
                mig_start=p.mig_start,
                cpu_milli=p.cpu_milli,
                memory_mib=p.memory_mib,
                borrowed=borrowed > 0,
                created_at=now,
            )
        )
    rec = replace(lv.rec, state=WorkloadState.RUNNING, reason="", message="", started_at=now)
    draft.do(Start(draft.versioned(rec), tuple(allocs), tuple(placed)))
    where = ", ".join(f"{p.node}:{list(p.gpus)}" for p in placed)
    draft.event("workload.started", rec.tenant, rec.id, f"{rec.name} on {where}")


def member_shape(
    mem: Memory, dev: DeviceRequest, admitted: frozenset[str]
) -> tuple[DeviceRequest, TopologyRequirement]:
    """What one gang member asks placement for (restricted to the admitted models), and the
    gang's topology; memoized, as building a request re-validates it."""
    key = (dev, admitted)
    shapes = mem.memo.member_shapes
    got = shapes.get(key)
    if got is None:
        got = shapes[key] = member_request(dev, admitted)
    return got


def model_of(mem: Memory, placed: list[Placement]) -> str | None:
    p = placed[0]
    if not p.gpus:
        return None
    return mem.nodes[p.node].gpus[p.gpus[0]].model


def device_uuids(node: Node, p: Placement) -> tuple[str, ...]:
    """The UUIDs a process uses to see ``p``'s devices: the MIG instance's own when the
    inventory knows it (an existing instance discovered with its UUID), else the GPUs'."""
    if p.mig_profile is not None and not p.mig_created:
        (g,) = p.gpus
        for inst in node.gpus[g].mig_layout:
            if inst.start == p.mig_start and inst.profile == p.mig_profile and inst.uuid:
                return (inst.uuid,)
    return tuple(node.gpus[g].uuid for g in p.gpus)


def note_blocked(draft: Draft, lv: Live, blocked: Blocked, at: datetime | None = None) -> None:
    """Record why the workload waits. The reason is persisted when it changes; the message's
    figures change with every release, so while the reason stays the same only memory (what
    status and queue show) is updated — a cycle must not rewrite every queued row."""
    lv = draft.live[lv.rec.id]
    if lv.rec.reason == blocked.reason:
        if lv.message != blocked.message:
            draft.note(lv, blocked.message)
        return
    draft.update(lv, replace(lv.rec, reason=blocked.reason, message=blocked.message))
