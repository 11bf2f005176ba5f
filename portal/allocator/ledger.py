"""Per-(tenant, flavor) aggregates of what running work holds, kept incrementally.

The quota rules need usage per tenant and flavor on every decision; summing allocations each
time would be O(workloads). The ledger is updated on every allocation and release instead.
It works over the containers it is given, so the live state and a decision's working copy
(``overlay``) share this one definition of the bookkeeping.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, MutableMapping

from portal.store.records import AllocationRecord


class Ledger:
    def __init__(
        self,
        usage: MutableMapping[tuple[str, str], int] | None = None,
        gpu_equivalents: MutableMapping[str, MutableMapping[str, float]] | None = None,
        borrowed: MutableMapping[tuple[str, str], int] | None = None,
        holders: MutableMapping[str, MutableMapping[str, int]] | None = None,
    ) -> None:
        self.usage: MutableMapping[tuple[str, str], int] = {} if usage is None else usage
        self.gpu_equivalents: MutableMapping[str, MutableMapping[str, float]] = (
            defaultdict(dict) if gpu_equivalents is None else gpu_equivalents
        )
        self.borrowed: MutableMapping[tuple[str, str], int] = {} if borrowed is None else borrowed
        # flavor -> workload id -> amount held: lets ETA and reclaim visit only the holders of
        # one flavor instead of every live workload.
        self.holders: MutableMapping[str, MutableMapping[str, int]] = (
            defaultdict(dict) if holders is None else holders
        )

    def add(self, a: AllocationRecord, tenant: str) -> None:
        if not a.flavor:
            return
        key = (tenant, a.flavor)
        self.usage[key] = self.usage.get(key, 0) + a.amount
        geq = self.gpu_equivalents[tenant]
        geq[a.flavor] = geq.get(a.flavor, 0.0) + a.gpu_equivalent
        held = self.holders[a.flavor]
        held[a.workload_id] = held.get(a.workload_id, 0) + a.amount
        if a.borrowed:
            self.borrowed[key] = self.borrowed.get(key, 0) + a.amount

    def remove(self, a: AllocationRecord, tenant: str) -> None:
        if not a.flavor:
            return
        key = (tenant, a.flavor)
        left = self.usage.get(key, 0) - a.amount
        if left > 0:
            self.usage[key] = left
        else:
            self.usage.pop(key, None)
        geq = self.gpu_equivalents[tenant]
        rest = geq.get(a.flavor, 0.0) - a.gpu_equivalent
        if rest > 1e-9:
            geq[a.flavor] = rest
        else:
            geq.pop(a.flavor, None)
        held = self.holders[a.flavor]
        still = held.get(a.workload_id, 0) - a.amount
        if still > 0:
            held[a.workload_id] = still
        else:
            held.pop(a.workload_id, None)
        if a.borrowed:
            b = self.borrowed.get(key, 0) - a.amount
            if b > 0:
                self.borrowed[key] = b
            else:
                self.borrowed.pop(key, None)

    def used(self, tenant: str, flavor: str) -> int:
        return self.usage.get((tenant, flavor), 0)

    def tenant_gpu_equivalents(self, tenant: str) -> Mapping[str, float]:
        """The tenant's GPU-equivalents per flavor: a view, read it before the next change."""
        geq = self.gpu_equivalents
        if tenant not in geq:
            return {}
        return geq[tenant]

    def holders_of(self, flavor: str) -> Mapping[str, int]:
        """Workload id -> amount of ``flavor`` it holds."""
        if flavor not in self.holders:
            return {}
        return self.holders[flavor]

    def used_of_flavor(self, flavor: str) -> int:
        """Everyone's usage of ``flavor`` (a walk over tenants, not over its holders)."""
        return sum(v for (_, fl), v in self.usage.items() if fl == flavor)
