"""The memory changes a decision is made of, written once for the draft and the live state.

Each op is a frozen value with two methods: ``apply(memory)`` changes a ``Memory`` (a decision's
working copy while it is decided, the live state once it is committed: the same code both
times, so what the decider saw is what memory becomes), and ``record(changes)`` adds the rows
the store must write for it. Ops are total on the memory they were decided on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol

from policies.inventory import Node
from policies.placement.state import Placement
from portal.allocator import codec
from portal.allocator.memory import Live, Memory, period_hours, run_length
from portal.store.records import (
    AllocationRecord,
    ChangeSet,
    QuotaRecord,
    TenantRecord,
    WorkloadRecord,
    WorkloadState,
)


class Op(Protocol):
    def apply(self, mem: Memory) -> None: ...

    def record(self, out: ChangeSet) -> None: ...


def restored_placement(node: Node, a: AllocationRecord) -> Placement:
    """The placement an allocation holds on ``node`` (a MIG instance not in the node's
    discovered layout was created for it)."""
    p = codec.placement_of(a)
    if p.mig_profile is not None:
        g = p.gpus[0]
        if 0 <= g < len(node.gpus) and not any(
            i.start == p.mig_start for i in node.gpus[g].mig_layout
        ):
            p = replace(p, mig_created=True)
    return p


def _index_state(mem: Memory, wid: str, old: WorkloadState | None, new: WorkloadState) -> None:
    """Keep the sets of queued and preempting workloads current."""
    for state, ids in (
        (WorkloadState.QUEUED, mem.queued),
        (WorkloadState.PREEMPTING, mem.preempting),
    ):
        if old is state and new is not state:
            ids.discard(wid)
        elif new is state:
            ids.add(wid)


def _count_preempting(mem: Memory, lv: Live, sign: int) -> None:
    """Count (1) or stop counting (-1) a workload's devices as being preempted."""
    for a in lv.allocations:
        if a.flavor:
            key = (lv.rec.tenant, a.flavor)
            left = mem.preempting_amount.get(key, 0) + sign * a.amount
            if left:
                mem.preempting_amount[key] = left
            else:
                mem.preempting_amount.pop(key, None)


@dataclass(frozen=True, slots=True)
class PutTenant:
    rec: TenantRecord

    def apply(self, mem: Memory) -> None:
        mem.tenants[self.rec.name] = self.rec
        mem.quotas_changed()

    def record(self, out: ChangeSet) -> None:
        out.tenants.append(self.rec)


@dataclass(frozen=True, slots=True)
class PutQuota:
    rec: QuotaRecord

    def apply(self, mem: Memory) -> None:
        mem.quotas[(self.rec.tenant, self.rec.flavor)] = self.rec
        mem.quotas_changed()

    def record(self, out: ChangeSet) -> None:
        out.quotas.append(self.rec)


@dataclass(frozen=True, slots=True)
class Enqueue:
    """A new workload, queued."""

    live: Live

    def apply(self, mem: Memory) -> None:
        mem.live[self.live.rec.id] = self.live
        _index_state(mem, self.live.rec.id, None, self.live.rec.state)

    def record(self, out: ChangeSet) -> None:
        out.workloads.append(self.live.rec)


@dataclass(frozen=True, slots=True)
class Start:
    """A queued workload gets its devices."""

    rec: WorkloadRecord
    allocations: tuple[AllocationRecord, ...]
    placements: tuple[Placement, ...]

    def apply(self, mem: Memory) -> None:
        old = mem.live[self.rec.id]
        for p in self.placements:
            mem.cluster.apply(p)
        for a in self.allocations:
            mem.ledger.add(a, self.rec.tenant)
        mem.live[self.rec.id] = Live(self.rec, old.req, old.seq, self.allocations)
        _index_state(mem, self.rec.id, old.rec.state, self.rec.state)
        for p in self.placements:
            mem.observe(old.req.devices, p)

    def record(self, out: ChangeSet) -> None:
        out.workloads.append(self.rec)
        out.allocations.extend(self.allocations)


@dataclass(frozen=True, slots=True)
class Finish:
    """A workload ends (released, cancelled, failed, preempted): its devices come back, its
    GPU-hours join the period's totals."""

    rec: WorkloadRecord
    allocations: tuple[AllocationRecord, ...]
    at: datetime

    def apply(self, mem: Memory) -> None:
        wid = self.rec.id
        old = mem.live[wid]
        if old.rec.state is WorkloadState.PREEMPTING:
            _count_preempting(mem, old, -1)
        for a in old.allocations:
            if a.node in mem.nodes:  # a lost node's devices are gone with it
                mem.cluster.unapply(restored_placement(mem.nodes[a.node], a))
            mem.ledger.remove(a, old.rec.tenant)
            if a.created_at is not None and a.flavor:
                month, hours = period_hours(a.created_at, self.at)
                key = (old.rec.tenant, a.flavor, month)
                mem.period[key] = mem.period.get(key, 0.0) + a.gpu_equivalent * hours
        del mem.live[wid]
        _index_state(mem, wid, old.rec.state, self.rec.state)
        if mem.run_lengths is not None:
            length = run_length(self.rec)
            if length is not None:
                mem.run_lengths.add(
                    (self.rec.tenant, self.rec.kind), length, self.rec.expected_duration_s
                )

    def record(self, out: ChangeSet) -> None:
        out.workloads.append(self.rec)
        out.released.extend((a.id, self.at) for a in self.allocations)


@dataclass(frozen=True, slots=True)
class Update:
    """A workload's record changes (queue reason, preemption); ``persist`` False: only its
    in-memory wait message (``note``) changed, which is not worth a database write."""

    rec: WorkloadRecord
    note: str | None = None
    persist: bool = True

    def apply(self, mem: Memory) -> None:
        wid = self.rec.id
        old = mem.live[wid]
        new = replace(old, rec=self.rec, note=self.note)
        was, now = old.rec.state, self.rec.state
        if was is WorkloadState.PREEMPTING and now is not WorkloadState.PREEMPTING:
            _count_preempting(mem, old, -1)
        elif now is WorkloadState.PREEMPTING and was is not WorkloadState.PREEMPTING:
            _count_preempting(mem, new, 1)
        mem.live[wid] = new
        _index_state(mem, wid, was, now)

    def record(self, out: ChangeSet) -> None:
        if self.persist:
            out.workloads.append(self.rec)


@dataclass(frozen=True, slots=True)
class SetHistory:
    """A tenant's decayed usage history (fairness) folded up to ``value[1]``."""

    tenant: str
    value: tuple[float, datetime]

    def apply(self, mem: Memory) -> None:
        mem.history[self.tenant] = self.value

    def record(self, out: ChangeSet) -> None:
        out.usage_history[self.tenant] = self.value


@dataclass(frozen=True, slots=True)
class AddNode:
    node: Node
    order: int | None = None
    # Allocations already on the node (a node replaced with its running work kept).
    held: tuple[Placement, ...] = ()

    def apply(self, mem: Memory) -> None:
        mem.cluster.add_node(self.node, order=self.order)
        mem.nodes[self.node.name] = self.node
        for p in self.held:
            mem.cluster.apply(p)
        mem.inventory_changed()

    def record(self, out: ChangeSet) -> None:
        pass


@dataclass(frozen=True, slots=True)
class RemoveNode:
    name: str

    def apply(self, mem: Memory) -> None:
        mem.cluster.remove_node(self.name)
        del mem.nodes[self.name]
        mem.inventory_changed()

    def record(self, out: ChangeSet) -> None:
        pass
