"""What the allocator answers: typed, immutable views of workloads, the queue and usage."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from portal.store.records import AllocationRecord, WorkloadRecord, WorkloadState


@dataclass(frozen=True, slots=True)
class WorkloadStatus:
    """A workload as its owner sees it.

    ``reason`` is set while queued (``quota``, ``capacity``, ``topology``, ``budget``) and on
    preemption; ``message`` is the human sentence; positions are 1-based; ``eta_s`` is the
    estimated wait in seconds (None when it cannot be estimated).
    """

    id: str
    tenant: str
    owner: str
    name: str
    kind: str
    state: WorkloadState
    reason: str
    message: str
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    allocations: tuple[AllocationRecord, ...] = ()
    position: int | None = None
    tenant_position: int | None = None
    eta_s: float | None = None
    preempt_deadline: datetime | None = None
    flavor: str | None = None
    # The wait's p20-p80 interval and why, in words; on status reads (not on the answer to a
    # request, whose decision computes the point alone).
    eta_low_s: float | None = None
    eta_high_s: float | None = None
    eta_reason: str = ""


@dataclass(frozen=True, slots=True)
class QueueEntry:
    workload_id: str
    tenant: str
    owner: str
    name: str
    priority: int
    position: int
    tenant_position: int
    reason: str
    message: str
    enqueued_at: datetime
    gpu_equivalent: float
    eta_s: float | None
    # The wait's p20–p80 interval around ``eta_s`` and why, in words (estimates.py).
    eta_low_s: float | None = None
    eta_high_s: float | None = None
    eta_reason: str = ""


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What a start-up or periodic reconcile changed."""

    released: tuple[str, ...] = ()  # workloads whose allocations were released
    adopted: tuple[str, ...] = ()
    flagged: tuple[str, ...] = ()  # running on devices the allocator does not know of
    node_lost: tuple[str, ...] = ()


def status_of(
    rec: WorkloadRecord,
    message: str,
    allocations: tuple[AllocationRecord, ...] = (),
    position: int | None = None,
    tenant_position: int | None = None,
    eta_s: float | None = None,
    interval: tuple[float | None, float | None, str] = (None, None, ""),
) -> WorkloadStatus:
    """A workload's status from its record and what only memory knows; ``interval``: the
    wait's low and high ends and its reason."""
    return WorkloadStatus(
        id=rec.id,
        tenant=rec.tenant,
        owner=rec.owner,
        name=rec.name,
        kind=rec.kind,
        state=rec.state,
        reason=rec.reason,
        message=message,
        created_at=rec.created_at,
        started_at=rec.started_at,
        ended_at=rec.ended_at,
        allocations=allocations,
        position=position,
        tenant_position=tenant_position,
        eta_s=eta_s,
        preempt_deadline=rec.preempt_deadline,
        flavor=allocations[0].flavor if allocations else None,
        eta_low_s=interval[0],
        eta_high_s=interval[1],
        eta_reason=interval[2],
    )
