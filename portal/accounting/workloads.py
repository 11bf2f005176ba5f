"""The cost of chosen workloads (a training job's attempts), priced like every other workload.

A job is not priced on its own terms: its attempts are allocator workloads, so their
allocation rows are read by ``history.usage_intervals`` and priced by
``policies.pricing.cost_lines`` with the accounting's price book, exactly as ``/api/v1/cost``
prices the tenant they are charged to. Time an attempt waited in the queue holds no
allocation and costs nothing; time it held devices costs, including the grace a preempted
attempt checkpoints in (its allocation is released only once its members ended).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction

from policies.pricing import CostTotal, Period, UsageInterval, cost_lines, totals
from portal.accounting.history import usage_intervals
from portal.accounting.service import Accounting

_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(2999, 1, 1, tzinfo=UTC)
ZERO = CostTotal(Fraction(0), Fraction(0), Fraction(0), Fraction(0))


@dataclass(frozen=True, slots=True)
class WorkloadCosts:
    """Exact GPU-hours and money per workload (``ZERO`` for one that held nothing)."""

    currency: str
    by_workload: Mapping[str, CostTotal]
    unpriced_models: tuple[str, ...]  # held by these workloads without a price: counted at 0
    unpriced_by_workload: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def subset(self, workload_ids: Collection[str]) -> WorkloadCosts:
        """The same prices for some of the workloads only (one read priced for several
        owners: each owner's totals and unpriced models are its own)."""
        ids = set(workload_ids)
        unpriced = {m for w in ids for m in self.unpriced_by_workload.get(w, ())}
        return WorkloadCosts(
            currency=self.currency,
            by_workload={w: t for w, t in self.by_workload.items() if w in ids},
            unpriced_models=tuple(sorted(unpriced)),
            unpriced_by_workload={w: m for w, m in self.unpriced_by_workload.items() if w in ids},
        )

    def of(self, workload_id: str) -> CostTotal:
        return self.by_workload.get(workload_id, ZERO)

    def total(self) -> CostTotal:
        """Every workload together (exact sums)."""
        sums = [Fraction(0)] * 4
        for t in self.by_workload.values():
            for i, x in enumerate((t.allocated_gpu_hours, t.used_gpu_hours, t.cost, t.idle_cost)):
                sums[i] += x
        return CostTotal(*sums)


def workload_costs(
    acc: Accounting, workload_ids: Collection[str], now: datetime | None = None
) -> WorkloadCosts:
    """What each of ``workload_ids`` cost, allocations still held counted up to ``now``
    (default: the accounting's clock). Allocated hours and money only: utilization is not
    read (the Cost view has efficiency and idle spend per tenant and owner)."""
    held_until = now if now is not None else acc.clock()
    intervals: list[UsageInterval] = []
    if workload_ids:
        intervals = usage_intervals(
            acc.store, _EARLIEST, _LATEST, held_until, workloads=workload_ids
        )
    by_workload: dict[str, list[UsageInterval]] = {}
    for iv in intervals:
        by_workload.setdefault(iv.workload_id, []).append(iv)
    book = acc.book_for(intervals)
    out: dict[str, CostTotal] = {}
    for wid, ivs in by_workload.items():
        lo, hi = min(iv.start for iv in ivs), max(iv.end for iv in ivs)
        if hi <= lo:
            continue  # held for less than a whole second: nothing charged
        lines = cost_lines(ivs, book, [Period(lo, hi)])
        out[wid] = totals(lines, ()).get((), ZERO)
    priced = set(acc.prices.book.schedules)
    unpriced = {
        wid: tuple(sorted({iv.flavor.model for iv in ivs} - priced))
        for wid, ivs in by_workload.items()
    }
    return WorkloadCosts(
        currency=acc.prices.currency,
        by_workload=out,
        unpriced_models=tuple(sorted({m for ms in unpriced.values() for m in ms})),
        unpriced_by_workload={w: ms for w, ms in unpriced.items() if ms},
    )
