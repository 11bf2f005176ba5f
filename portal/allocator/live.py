"""The allocator's in-memory working types: a live workload, a transaction's change set and
undo log, and aggregates of the inventory."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from policies.inventory import Node
from policies.requests import WorkloadRequest
from portal.store.records import AllocationRecord, ChangeSet, WorkloadRecord


@dataclass(slots=True)
class Live:
    """A non-terminal workload in memory."""

    rec: WorkloadRecord
    req: WorkloadRequest
    seq: int
    allocations: list[AllocationRecord] = field(default_factory=list)
    # The latest wait message when only its figures changed since the persisted one.
    note: str | None = None
    # When the devices are expected back (epoch seconds; inf: unknown), for ETAs.
    end_at: float = float("inf")

    @property
    def message(self) -> str:
        return self.note if self.note is not None else self.rec.message


@dataclass(frozen=True, slots=True)
class InventoryFacts:
    """Aggregates of the inventory that every request check needs; rebuilt only when the
    inventory changes (scanning every node per decision is O(nodes))."""

    models: frozenset[str]
    max_gpus: int
    max_cpu_milli: int
    max_memory_mib: int

    @staticmethod
    def of(nodes: Iterable[Node]) -> InventoryFacts:
        models: set[str] = set()
        max_gpus = max_cpu = max_mem = 0
        for n in nodes:
            models.update(g.model for g in n.gpus)
            max_gpus = max(max_gpus, len(n.gpus))
            max_cpu = max(max_cpu, n.cpu_milli)
            max_mem = max(max_mem, n.memory_mib)
        return InventoryFacts(frozenset(models), max_gpus, max_cpu, max_mem)


class Txn:
    """Changes of one decision: what to commit, and how to undo it in memory if that fails."""

    def __init__(self) -> None:
        self.changes = ChangeSet()
        self.undo: list[Callable[[], object]] = []
