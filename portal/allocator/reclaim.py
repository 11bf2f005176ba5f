"""Reclaim: a tenant refused only because borrowers hold its guaranteed share tells a minimal
set of borrowing workloads to stop, with a grace period (``policies.preemption`` chooses)."""

from __future__ import annotations

from dataclasses import replace

from policies.preemption import RunningItem, select_victims
from portal.allocator.draft import Draft
from portal.allocator.memory import Live
from portal.store.records import WorkloadState


def underway(draft: Draft, flavor: str, need: dict[str, int]) -> dict[str, int]:
    """What is still to be asked of each borrower in ``need``, after what its workloads
    already being preempted will give back: a reclaim whose victims end one at a time is
    re-planned after each end, and must not pick new victims for the share already coming."""
    left = {t: n - draft.preempting_amount.get((t, flavor), 0) for t, n in need.items()}
    return {t: n for t, n in left.items() if n > 0}


def preempt(draft: Draft, claimant: Live, flavor: str, need: dict[str, int]) -> list[str]:
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
            seq=lv.seq,
        )
        for lv in (draft.live[w] for w in draft.ledger.holders_of(flavor))
        if lv.rec.state is WorkloadState.RUNNING and lv.rec.tenant in need
    ]
    victims = select_victims(candidates, need, flavor) or []
    now = draft.now
    for wid in victims:
        lv = draft.live[wid]
        deadline = now + draft.grace_for(lv.rec.kind)
        draft.update(
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
        draft.event(
            "workload.preempting",
            lv.rec.tenant,
            wid,
            f"{lv.rec.name} preempted for {claimant.rec.tenant} ({claimant.rec.name})",
            {"claimant": claimant.rec.id, "deadline": deadline.isoformat()},
        )
    return victims
