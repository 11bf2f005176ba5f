"""A new workload onto a draft: its record queued, then tried.

Most requests are tried by the scheduling cycle (``cycle.schedule``), which may queue them and
start a reclaim of borrowed work for them. An optional extra (an elastic job's slice) is tried
by ``start_on_free`` instead: it starts now on capacity nobody holds or has reserved, within
its tenant's quota, or the whole decision is dropped — never queued, nobody told to stop.
"""

from __future__ import annotations

from datetime import timedelta

from policies.errors import Conflict
from policies.requests import WorkloadRequest
from portal.allocator import codec
from portal.allocator.admission import try_start
from portal.allocator.draft import Draft
from portal.allocator.memory import Live
from portal.allocator.ops import Enqueue
from portal.store.records import WorkloadRecord, WorkloadState


class NoFreeRoom(Conflict):
    """A free-capacity-only request that would have had to wait or reclaim: nothing changed."""


def enqueue(
    draft: Draft,
    req: WorkloadRequest,
    wid: str,
    idempotency_key: str | None,
    expected_duration_s: float | None,
) -> Live:
    """Queue the new workload ``wid`` on the draft (not tried yet)."""
    now = draft.now
    # Arrival order must survive a restart, which re-sorts by creation time: keep creation
    # times strictly increasing even when the clock repeats itself.
    last = draft.scalars.last_created
    if last is not None and now <= last:
        now = last + timedelta(microseconds=1)
    draft.set_scalars(last_created=now)
    rec = WorkloadRecord(
        id=wid,
        tenant=req.tenant,
        owner=req.owner,
        name=req.name,
        kind=req.kind.value,
        request=codec.device_request_to_dict(req.devices),
        gang_size=req.gang_size,
        priority=req.priority,
        state=WorkloadState.QUEUED,
        created_at=now,
        idempotency_key=idempotency_key,
        expected_duration_s=expected_duration_s,
    )
    lv = Live(rec, req, draft.next_seq())
    draft.do(Enqueue(lv))
    draft.event("workload.requested", req.tenant, wid, f"{req.owner} asked for {req.name}")
    return lv


def start_on_free(draft: Draft, lv: Live) -> None:
    """Start ``lv`` now, or raise ``NoFreeRoom``.

    Admission and placement are the cycle's own (``try_start``), but a node reserved for a
    waiting workload stays out of reach, and a refusal raises: the caller's draft, with
    whatever the refusal wrote into it (a reclaim of borrowed work, the queued record), is
    then never committed — so a try leaves no trace on anyone.
    """
    holder = draft.scalars.reserved_for
    avoid = draft.scalars.reserved if holder is not None and holder in draft.queued else None
    blocked = try_start(draft, lv, avoid or frozenset())
    if blocked is not None:
        raise NoFreeRoom(
            f"{lv.rec.name} does not fit in free capacity now ({blocked.reason}): {blocked.message}"
        )
