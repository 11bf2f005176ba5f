"""Allocator views and records → response bodies. Pure functions, no I/O."""

from __future__ import annotations

import dataclasses

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

# The records and the answers share their field names: the answers read them as attributes
# (nested allocations too), so a field added to both needs no line here.


def tenant_out(t: TenantRecord) -> TenantOut:
    return TenantOut.model_validate(t, from_attributes=True)


def quota_out(q: QuotaRecord) -> QuotaOut:
    return QuotaOut.model_validate(q, from_attributes=True)


def allocation_out(a: AllocationRecord) -> AllocationOut:
    return AllocationOut.model_validate(a, from_attributes=True)


def workload_out(s: WorkloadStatus) -> WorkloadOut:
    return WorkloadOut.model_validate(s, from_attributes=True)


def queue_entry_out(e: QueueEntry) -> QueueEntryOut:
    return QueueEntryOut.model_validate(e, from_attributes=True)


def usage_out(tenant: str, u: FlavorUsage) -> UsageOut:
    return UsageOut.model_validate({"tenant": tenant, **dataclasses.asdict(u)})


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
