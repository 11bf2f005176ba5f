"""Prometheus metrics of the service, and the request observer that feeds them and logs.

Each app has its own ``CollectorRegistry`` (``app.state.metrics.registry``), so several apps in
one process (tests, benchmarks) never share counters. ``GET /metrics`` serves it in the text
exposition format and needs ``custom:gpuportal:metrics:read`` like any other route needs its
scope; Prometheus sends the token as ``Authorization: Bearer <t>``.

| metric | type | labels |
|---|---|---|
| ``gpuportal_http_request_duration_seconds`` | histogram | method, route (template), status |
| ``gpuportal_allocator_decisions_total`` | counter | outcome |
| ``gpuportal_queue_length`` | gauge | tenant, reason |
| ``gpuportal_allocated_units`` | gauge | tenant, flavor |
| ``gpuportal_borrowed_units`` | gauge | tenant, flavor |
| ``gpuportal_alerts`` | gauge (pending or firing) | rule, state, tenant |
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from portal.alerting.metrics import AlertCollector
from portal.allocator import Allocator
from portal.api.auth import Caller
from portal.api.auth import Scope as PortalScope
from portal.api.deps import requires

log = logging.getLogger("portal.api.access")

UNMATCHED = "unmatched"
"""The ``route`` label of requests no route matched (keeps the label set bounded)."""
QUIET_ROUTES = frozenset({"/", "/health", "/ready", "/metrics"})
"""Probe and scrape routes (JupyterHub checks ``/`` every minute): logged at debug level."""
ALLOCATING_ROUTE = ("POST", "/api/v1/workloads")

# Request latencies from sub-millisecond reads to slow allocations behind a busy lock.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Outcome(StrEnum):
    """What the allocator decided about a workload."""

    ALLOCATED = "allocated"  # devices bound (at once or later, from the queue)
    QUEUED = "queued"  # asked, and waits
    REFUSED = "refused"  # the request was turned down (invalid, forbidden, unknown tenant)
    RELEASED = "released"  # devices given back, or left the queue
    PREEMPTED = "preempted"  # told to stop for someone's guaranteed quota
    FAILED = "failed"  # its node was lost


class ServiceMetrics:
    """The metrics of one app over one allocator."""

    def __init__(self, alloc: Allocator) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.request_seconds = Histogram(
            "gpuportal_http_request_duration_seconds",
            "Time from receiving an API request to the end of its response.",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "gpuportal_allocator_decisions",
            "Allocator decisions about workloads, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in Outcome:  # every series exists from the start, at 0
            self.decisions.labels(outcome.value)
        self.registry.register(AllocatorCollector(alloc))
        self.registry.register(AlertCollector.of_store(lambda: alloc.store.engine))

    def decided(self, outcome: Outcome, count: int = 1) -> None:
        self.decisions.labels(outcome.value).inc(count)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class AllocatorCollector(Collector):
    """Queue and allocation gauges, read from the allocator at scrape time."""

    def __init__(self, alloc: Allocator) -> None:
        self._alloc = alloc

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        if not self._alloc.started:
            return iter(())
        usage = [
            (t.name, line) for t in self._alloc.tenants() for line in self._alloc.usage(t.name)
        ]
        # Not queue(): that orders the queue and computes every ETA under the allocator's lock.
        waiting = self._alloc.queue_counts()
        queue_len, allocated, borrowed = self._families()
        for (tenant, reason), n in sorted(waiting.items()):
            queue_len.add_metric([tenant, reason or "unknown"], n)
        for tenant, line in usage:
            allocated.add_metric([tenant, line.flavor], line.used)
            borrowed.add_metric([tenant, line.flavor], line.borrowed)
        return iter((queue_len, allocated, borrowed))

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "gpuportal_queue_length",
                "Queued workloads per tenant and reason (quota, capacity, topology, ...).",
                labels=["tenant", "reason"],
            ),
            GaugeMetricFamily(
                "gpuportal_allocated_units",
                "Units of each flavor allocated to a tenant (GPUs, MIG slices, milli-GPUs).",
                labels=["tenant", "flavor"],
            ),
            GaugeMetricFamily(
                "gpuportal_borrowed_units",
                "Units allocated beyond the tenant's guaranteed quota (preemptible).",
                labels=["tenant", "flavor"],
            ),
        )


class RouteTemplates:
    """Maps a request path to its route's template (``/api/v1/workloads/{workload_id}``),
    read from the app's OpenAPI document on first use — so every documented route, included
    routers and all, gets its own label without depending on the router's internals."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._compiled: list[tuple[re.Pattern[str], str]] | None = None

    def match(self, path: str) -> str:
        if self._compiled is None:
            self._compiled = self._compile()
        for pattern, template in self._compiled:
            if pattern.fullmatch(path):
                return template
        return UNMATCHED

    def _compile(self) -> list[tuple[re.Pattern[str], str]]:
        templates = list(self._app.openapi().get("paths", {}))
        templates += [u for u in (self._app.openapi_url, self._app.docs_url) if u]
        # Most literal segments first: /tenants/{t}/quotas/{f} before /tenants/{t}.
        templates.sort(key=lambda t: (-sum(1 for s in t.split("/") if "{" not in s), t))
        return [(self._regex(t), t) for t in templates]

    @staticmethod
    def _regex(template: str) -> re.Pattern[str]:
        parts = re.split(r"(\{[^}]+\})", template)
        out = []
        for i, part in enumerate(parts):
            if part.startswith("{"):
                # A trailing parameter may hold slashes (flavors like H100-80GB/3g.40gb).
                out.append(".+" if i == len(parts) - 2 and not parts[-1] else "[^/]+")
            else:
                out.append(re.escape(part))
        return re.compile("".join(out))


class RequestObserver:
    """ASGI middleware: times each HTTP request, records it by route template, counts refused
    allocation requests, and writes one log line with method, route, status, duration_ms and
    caller."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics, templates: RouteTemplates) -> None:
        self.app = app
        self.metrics = metrics
        self.templates = templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            self._observe(scope, status, time.perf_counter() - began)

    def _observe(self, scope: Scope, status: int, seconds: float) -> None:
        observe(self.metrics, scope, self.templates.match(route_path(scope)), status, seconds)


def route_path(scope: Scope) -> str:
    """The request's path inside the app (a mount's ``root_path`` taken off)."""
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", ""))
    return path[len(root) :] if root and path.startswith(root) else path


def observe(metrics: ServiceMetrics, scope: Scope, route: str, status: int, seconds: float) -> None:
    """Record one answered request under its route template and write its access line: the
    one definition for every request, the gateway's included (it knows its template)."""
    path = str(scope.get("path", ""))
    method = str(scope.get("method", ""))
    metrics.request_seconds.labels(method, route, str(status)).observe(seconds)
    if (method, route) == ALLOCATING_ROUTE and 400 <= status < 500 and status != 401:
        metrics.decided(Outcome.REFUSED)
    caller = (scope.get("state") or {}).get("caller")
    fields = {
        "method": method,
        "route": route,
        "path": path,
        "status": status,
        "duration_ms": round(seconds * 1000, 3),
        "caller": caller.name if isinstance(caller, Caller) else None,
    }
    level = logging.DEBUG if route in QUIET_ROUTES else logging.INFO
    log.log(level, "%s %s %d", method, fields["path"], status, extra={"fields": fields})


router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    summary="Prometheus metrics of the service (text exposition format)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
def metrics(
    request: Request, _caller: Annotated[Caller, requires(PortalScope.METRICS_READ)]
) -> Response:
    m: ServiceMetrics = request.app.state.metrics
    return Response(m.exposition(), media_type=CONTENT_TYPE_LATEST)
