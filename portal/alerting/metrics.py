"""Prometheus metrics of the alerts, as a collector the service's ``/metrics`` registers::

    registry.register(AlertCollector.of_store(lambda: engine))  # the stored pending/firing alerts

| metric | type | labels |
|---|---|---|
| ``gpuportal_alerts`` | gauge: alerts pending or firing now | rule, state, tenant ("" for none) |
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from policies.alerts import Alert, AlertState
from portal.alerting.store import AlertStore

ActiveAlerts = Callable[[], Iterable[Alert]]


class AlertCollector(Collector):
    """Counts the active alerts ``active()`` returns at each scrape (every rule and state that
    has none is left out, as Prometheus expects of label sets that come and go)."""

    def __init__(self, active: ActiveAlerts) -> None:
        self._active = active

    @classmethod
    def of_store(cls, engine: Callable[[], Engine]) -> AlertCollector:
        """Counting the alerts stored in the database of ``engine()`` (whichever process raised
        them); the engine is looked up at the first scrape, so building the app needs none."""
        stores: list[AlertStore] = []

        def active() -> list[Alert]:
            if not stores:
                stores.append(AlertStore(engine()))
            return list(stores[0].active())

        return cls(active)

    def describe(self) -> Iterator[Metric]:
        # Registering a collector without describe() runs collect() at once, which would read
        # the database while the app is still being built.
        yield self._family()

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "gpuportal_alerts",
            "Alerts pending or firing, by rule, state and tenant.",
            labels=["rule", "state", "tenant"],
        )

    def collect(self) -> Iterator[Metric]:
        counts = Counter(
            (a.key.rule, a.state.value, a.tenant or "")
            for a in self._active()
            if a.state in (AlertState.PENDING, AlertState.FIRING)
        )
        gauge = self._family()
        for (rule, state, tenant), n in sorted(counts.items()):
            gauge.add_metric([rule, state, tenant], n)
        yield gauge
