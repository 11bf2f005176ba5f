"""Cost gauges for the service's Prometheus ``/metrics``: the current UTC month so far.

| metric | labels | value |
|---|---|---|
| ``gpuportal_cost_month_to_date`` | tenant, currency | money spent this month |
| ``gpuportal_idle_cost_month_to_date`` | tenant, currency | of which idle (with utilization) |
| ``gpuportal_allocated_gpu_hours_month_to_date`` | tenant, flavor | GPU-equivalent-hours held |
| ``gpuportal_budget_projected_ratio`` | tenant, kind, flavor | projected month-end spend / budget |

Pricing a month reads every allocation of it (and, with telemetry, one series per workload),
so a scrape reuses the last answer for ``ttl_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from policies.pricing import GroupBy
from portal.accounting.service import Accounting, Step, month_of
from portal.store.records import QuotaRecord


class CostCollector(Collector):
    """Month-to-date cost, GPU-hours and budget burn of every tenant.

    Args:
        accounting: what prices the month.
        quotas: the quotas now (their GPU-hour budgets), e.g. ``allocator.quotas``.
        ttl_s: how long one computation serves scrapes.
    """

    def __init__(
        self,
        accounting: Accounting,
        quotas: Callable[[], list[QuotaRecord]],
        *,
        ttl_s: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._acc = accounting
        self._quotas = quotas
        self._ttl = ttl_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Metric]] | None = None

    def describe(self) -> list[Metric]:
        # Described without computing, so registering costs nothing.
        return self._families()[0]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = self._monotonic()
            if self._cached is None or now - self._cached[0] >= self._ttl:
                self._cached = (now, self._compute())
            return iter(self._cached[1])

    @staticmethod
    def _families() -> tuple[list[Metric], tuple[GaugeMetricFamily, ...]]:
        cost = GaugeMetricFamily(
            "gpuportal_cost_month_to_date",
            "Money spent on GPUs this UTC month so far",
            labels=["tenant", "currency"],
        )
        idle = GaugeMetricFamily(
            "gpuportal_idle_cost_month_to_date",
            "Money spent on GPUs measured idle this UTC month so far",
            labels=["tenant", "currency"],
        )
        hours = GaugeMetricFamily(
            "gpuportal_allocated_gpu_hours_month_to_date",
            "GPU-equivalent-hours held this UTC month so far",
            labels=["tenant", "flavor"],
        )
        ratio = GaugeMetricFamily(
            "gpuportal_budget_projected_ratio",
            "Spend projected to the month's end at the rate so far, over the budget",
            labels=["tenant", "kind", "flavor"],
        )
        families = (cost, idle, hours, ratio)
        return list(families), families

    def _compute(self) -> list[Metric]:
        out, (cost, idle, hours, ratio) = self._families()
        now = self._acc.clock()
        start = datetime.fromtimestamp(month_of(now).start, UTC)
        if now > start:
            report = self._acc.report(start, now, Step.WHOLE)
            for (tenant,), t in sorted(report.grouped((GroupBy.TENANT,)).items()):
                cost.add_metric([tenant, report.currency], float(t.cost))
                if report.measured:
                    idle.add_metric([tenant, report.currency], float(t.idle_cost))
            by_flavor = report.grouped((GroupBy.TENANT, GroupBy.FLAVOR))
            for (tenant, flavor), t in sorted(by_flavor.items()):
                hours.add_metric([tenant, flavor], float(t.allocated_gpu_hours))
        for b in self._acc.budgets(self._quotas()):
            if b.budget > 0:
                ratio.add_metric(
                    [b.tenant, b.kind.value, b.flavor or ""], float(b.projected / b.budget)
                )
        return out
