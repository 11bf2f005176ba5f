"""What the gateway measures per service: requests held (no replica ready), in flight, served,
refused, and their latency (arrival to the replica's first byte, and to the end).

Written by the gateway on the event loop, read by the API, the autoscaler and ``/metrics``
from other threads: counters are plain ints (a read may be one request stale, never torn),
latencies a bounded window.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

WINDOW = 2048


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Traffic:
    """One service's requests through the gateway."""

    arrived: int = 0  # every request for the service: the pre-warm planner's arrivals
    held: int = 0  # waiting for a ready replica (scale from zero)
    held_total: int = 0  # ever held: the requests that met a cold start or a wake
    in_flight: int = 0  # sent to a replica, not answered to the end yet
    served: int = 0
    refused: int = 0  # 503 beyond the hold bound or after the hold timeout
    failed: int = 0  # the replica could not be reached, or its answer broke off
    first_byte_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    total_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))

    @property
    def waiting(self) -> int:
        """Requests not being answered yet: held, or sent and without a first byte."""
        return self.held

    def summary(self) -> dict[str, float | int | None]:
        first = list(self.first_byte_s)
        return {
            "held": self.held,
            "held_total": self.held_total,
            "in_flight": self.in_flight,
            "served": self.served,
            "refused": self.refused,
            "failed": self.failed,
            "first_byte_p50_s": quantile(first, 0.5),
            "first_byte_p99_s": quantile(first, 0.99),
        }


class TrafficBook(Collector):
    """Every service's ``Traffic``, by service id; a Prometheus collector of them."""

    def __init__(self) -> None:
        self._by_id: dict[str, tuple[str, str, Traffic]] = {}
        self._lock = threading.Lock()
        # Requests in flight per replica URL: a draining replica is stopped once it has none.
        self._at: dict[str, int] = {}

    def enter(self, url: str) -> None:
        with self._lock:
            self._at[url] = self._at.get(url, 0) + 1

    def leave(self, url: str) -> None:
        with self._lock:
            left = self._at.get(url, 0) - 1
            if left > 0:
                self._at[url] = left
            else:
                self._at.pop(url, None)

    def in_flight_at(self, url: str | None) -> int:
        """Requests sent to the replica at ``url`` and not answered to the end yet."""
        return 0 if url is None else self._at.get(url, 0)

    def of(self, service_id: str, tenant: str = "", name: str = "") -> Traffic:
        hit = self._by_id.get(service_id)
        if hit is not None:
            return hit[2]
        with self._lock:
            return self._by_id.setdefault(service_id, (tenant, name, Traffic()))[2]

    def get(self, service_id: str) -> Traffic | None:
        hit = self._by_id.get(service_id)
        return None if hit is None else hit[2]

    def collect(self) -> Iterator[Metric]:
        labels = ["tenant", "service"]
        held = GaugeMetricFamily(
            "gpuportal_service_requests_held", "Requests held for a ready replica.", labels=labels
        )
        flight = GaugeMetricFamily(
            "gpuportal_service_requests_in_flight", "Requests sent to a replica.", labels=labels
        )
        served = CounterMetricFamily(
            "gpuportal_service_requests_served", "Requests answered by a replica.", labels=labels
        )
        refused = CounterMetricFamily(
            "gpuportal_service_requests_refused", "Requests refused with 503.", labels=labels
        )
        for tenant, name, t in list(self._by_id.values()):
            held.add_metric([tenant, name], t.held)
            flight.add_metric([tenant, name], t.in_flight)
            served.add_metric([tenant, name], t.served)
            refused.add_metric([tenant, name], t.refused)
        return iter((held, flight, served, refused))
