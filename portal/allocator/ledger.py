"""Per-(tenant, flavor) aggregates of what running work holds, kept incrementally.

The quota rules need usage per tenant and flavor on every decision; summing allocations each
time would be O(workloads). The ledger is updated on every allocation and release instead.
"""

from __future__ import annotations

from collections import defaultdict

from portal.store.records import AllocationRecord, WorkloadRecord


class Ledger:
    def __init__(self) -> None:
        self.usage: dict[tuple[str, str], int] = defaultdict(int)
        self.gpu_equivalents: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.borrowed: dict[tuple[str, str], int] = defaultdict(int)
        # flavor -> workload id -> amount held: lets ETA and reclaim visit only the holders of
        # one flavor instead of every live workload.
        self.holders: dict[str, dict[str, int]] = defaultdict(dict)

    def add(self, a: AllocationRecord, w: WorkloadRecord) -> None:
        if not a.flavor:
            return
        key = (w.tenant, a.flavor)
        self.usage[key] += a.amount
        self.gpu_equivalents[w.tenant][a.flavor] += a.gpu_equivalent
        held = self.holders[a.flavor]
        held[w.id] = held.get(w.id, 0) + a.amount
        if a.borrowed:
            self.borrowed[key] += a.amount

    def remove(self, a: AllocationRecord, w: WorkloadRecord) -> None:
        if not a.flavor:
            return
        key = (w.tenant, a.flavor)
        self.usage[key] -= a.amount
        if self.usage[key] <= 0:
            del self.usage[key]
        geq = self.gpu_equivalents[w.tenant]
        geq[a.flavor] -= a.gpu_equivalent
        if geq[a.flavor] <= 1e-9:
            del geq[a.flavor]
        held = self.holders[a.flavor]
        left = held.get(w.id, 0) - a.amount
        if left > 0:
            held[w.id] = left
        else:
            held.pop(w.id, None)
        if a.borrowed:
            self.borrowed[key] -= a.amount
            if self.borrowed[key] <= 0:
                del self.borrowed[key]

    def tenant_gpu_equivalents(self, tenant: str) -> dict[str, float]:
        return dict(self.gpu_equivalents.get(tenant, {}))
