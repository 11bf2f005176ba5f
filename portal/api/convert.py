"""Allocator views and records → response bodies. Pure functions, no I/O."""

from __future__ import annotations

from policies.placement.state import NodeState
from policies.quota import FlavorUsage
from portal.allocator import QueueEntry, WorkloadStatus
from portal.api.schemas import (
    AllocationOut,
    GpuOut,
    MigInstanceOut,
    NodeOut,
    QueueEntryOut,
    QuotaOut,
    TenantOut,
    UsageOut,
    WorkloadOut,
)
from portal.store.records import AllocationRecord, QuotaRecord, TenantRecord


def tenant_out(t: TenantRecord) -> TenantOut:
    return TenantOut(
        name=t.name, cohort=t.cohort, weight=t.weight, pools=list(t.pools), version=t.version
    )


def quota_out(q: QuotaRecord) -> QuotaOut:
    return QuotaOut(
        tenant=q.tenant,
        flavor=q.flavor,
        guaranteed=q.guaranteed,
        limit=q.limit,
        budget_gpu_hours=q.budget_gpu_hours,
        version=q.version,
        ceiling_guaranteed=q.ceiling_guaranteed,
        ceiling_limit=q.ceiling_limit,
    )


def allocation_out(a: AllocationRecord) -> AllocationOut:
    return AllocationOut(
        id=a.id,
        member=a.member,
        node=a.node,
        flavor=a.flavor,
        amount=a.amount,
        gpu_equivalent=a.gpu_equivalent,
        gpus=list(a.gpus),
        gpu_uuids=list(a.gpu_uuids),
        milli=a.milli,
        gpu_memory_mib=a.gpu_memory_mib,
        mig_profile=a.mig_profile,
        mig_start=a.mig_start,
        borrowed=a.borrowed,
    )


def workload_out(s: WorkloadStatus) -> WorkloadOut:
    return WorkloadOut(
        id=s.id,
        tenant=s.tenant,
        owner=s.owner,
        name=s.name,
        kind=s.kind,
        state=s.state,
        reason=s.reason,
        message=s.message,
        created_at=s.created_at,
        started_at=s.started_at,
        ended_at=s.ended_at,
        allocations=[allocation_out(a) for a in s.allocations],
        position=s.position,
        tenant_position=s.tenant_position,
        eta_s=s.eta_s,
        preempt_deadline=s.preempt_deadline,
        flavor=s.flavor,
    )


def queue_entry_out(e: QueueEntry) -> QueueEntryOut:
    return QueueEntryOut(
        workload_id=e.workload_id,
        tenant=e.tenant,
        owner=e.owner,
        name=e.name,
        priority=e.priority,
        position=e.position,
        tenant_position=e.tenant_position,
        reason=e.reason,
        message=e.message,
        enqueued_at=e.enqueued_at,
        gpu_equivalent=e.gpu_equivalent,
        eta_s=e.eta_s,
    )


def usage_out(tenant: str, u: FlavorUsage) -> UsageOut:
    return UsageOut(
        tenant=tenant,
        flavor=u.flavor,
        guaranteed=u.guaranteed,
        limit=u.limit,
        used=u.used,
        borrowed=u.borrowed,
        lent=u.lent,
    )


def node_out(st: NodeState, *, topology: bool = True) -> NodeOut:
    """``st`` as the API shows it; ``topology=False`` leaves ``links`` and ``numa`` null."""
    node = st.node
    gpus = [
        GpuOut(
            index=g.index,
            model=g.model,
            memory_mib=g.memory_mib,
            uuid=g.uuid,
            mig_enabled=g.mig_enabled,
            shareable=g.shareable,
            free_milli=st.free_milli[g.index],
            free_memory_mib=st.free_mem[g.index],
            mig_layout=[
                MigInstanceOut(
                    profile=i.profile,
                    start=i.start,
                    uuid=i.uuid,
                    free=i.start in st.mig_free[g.index],
                )
                for i in st.mig_layout[g.index]
            ],
        )
        for g in node.gpus
    ]
    topo = node.topology if topology else None
    return NodeOut(
        name=node.name,
        schedulable=st.schedulable,
        rack=node.rack,
        zone=node.zone,
        clique=node.clique,
        pool=node.pool,
        cpu_milli=node.cpu_milli,
        memory_mib=node.memory_mib,
        cpu_free_milli=st.cpu_free,
        memory_free_mib=st.mem_free,
        gpus=gpus,
        links=[[c.name.lower() for c in row] for row in topo.links] if topo else None,
        numa=list(topo.numa) if topo else None,
    )
