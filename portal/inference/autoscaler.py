"""The autoscaler: every evaluation, reads each active service's metric, keeps a window of
readings, and sets the service's desired replicas with ``policies.services.desired_replicas``.

- The metric per replica: ``waiting_requests`` is the engines' own waiting count (vLLM's
  ``vllm:num_requests_waiting``, SGLang's ``sglang:num_queue_reqs``, TGI's ``tgi_queue_size``,
  scraped from each ready replica's metrics path) plus the requests the gateway holds;
  ``concurrency`` the gateway's requests in flight and held; ``time_to_first_token`` the
  gateway's recent p90 to the first byte; ``gpu_utilization`` the percent busy of the
  serving replicas' allocations, from the telemetry the portal stores
  (``portal.telemetry.reads.workload_utilization``): one reading per sample time newer than
  the last one read, averaged over the replicas sampled then. Samples that did not measure
  utilization are no evidence: without a new measured sample there is no new reading, and no
  scale decision waits on a window the readings do not cover.
- Never above the tenant's limit: the desired count is capped at the replicas the tenant's
  limit of the replica's flavor can hold (the allocator would queue the rest anyway).
- Scale-to-zero after ``idle_s`` without a request (``min`` 0), never while a replica is
  still queued or starting: the request that woke it would otherwise be dropped.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping

import httpx

from policies.services import (
    MAX_WINDOW_S,
    Reading,
    ReplicaState,
    ScalingMetric,
    desired_replicas,
)
from portal.inference.controller import ServiceController
from portal.inference.prewarm import serving_floor
from portal.inference.spec import Preset, ServiceSpec
from portal.inference.traffic import Traffic, quantile
from portal.store import services as stored
from portal.store.records import ServiceRecord
from portal.telemetry.reads import workload_utilization

log = logging.getLogger(__name__)

EVALUATE_EVERY_S = 1.0
SCRAPE_TIMEOUT_S = 0.5
UTILIZATION_LOOKBACK_S = 60.0
"""How far back the first read of a service's utilization (or one after a gap) looks."""
WAITING_METRIC: Mapping[Preset, str] = {
    Preset.VLLM: "vllm:num_requests_waiting",
    Preset.TEST: "vllm:num_requests_waiting",
    Preset.SGLANG: "sglang:num_queue_reqs",
    Preset.TGI: "tgi_queue_size",
    Preset.CUSTOM: "vllm:num_requests_waiting",
}

Scrape = Callable[[str], str]
"""The Prometheus text at a URL (raises ``httpx.HTTPError`` when there is none)."""


_scraper: httpx.Client | None = None


def http_scrape(url: str) -> str:
    # One client for every scrape: a new one per call (``httpx.get``) builds a TLS context,
    # loading the CA bundle, milliseconds of CPU per replica per round.
    global _scraper
    if _scraper is None:
        _scraper = httpx.Client(timeout=SCRAPE_TIMEOUT_S)
    return _scraper.get(url).raise_for_status().text


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of ``name`` (any labels) in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return total


class Autoscaler:
    def __init__(self, controller: ServiceController, scrape: Scrape = http_scrape) -> None:
        self._controller = controller
        self._scrape = scrape
        self._readings: dict[str, deque[Reading]] = {}
        # The newest utilization sample time read per service: each sample is read once.
        self._sampled: dict[str, float] = {}

    def evaluate(self) -> None:
        """One evaluation of every active service."""
        c = self._controller
        for svc in stored.active_services(c.store):
            try:
                self._evaluate(svc)
            except Exception:
                log.exception("autoscaler: service %s", svc.name)

    def _evaluate(self, svc: ServiceRecord) -> None:
        c = self._controller
        spec = c.spec_of(svc)
        now = c.now.timestamp()
        current = svc.desired
        readings = self._readings.setdefault(svc.id, deque())
        if spec.scaling.metric is ScalingMetric.GPU_UTILIZATION:
            fresh = self._utilization(svc, now)
            readings.extend(fresh)
            value = fresh[-1].value if fresh else None
        else:
            value = self._value(svc, spec, c.traffic.get(svc.id) or Traffic(), max(1, current))
            if value is not None:
                readings.append(Reading(now, value))
        horizon = max(spec.scaling.up_window_s, spec.scaling.down_window_s, 1.0)
        while readings and readings[0].at < now - min(MAX_WINDOW_S, horizon) - 5:
            readings.popleft()
        last = c.last_request(svc)
        # A service deployed with a warm pool starts at zero and stays there until a request
        # comes; without one, the deploy counts as the last request (its first replica).
        if last is None and not spec.replicas.warm:
            last = svc.created_at
        idle_for = None if last is None else max(0.0, now - last.timestamp())
        want = desired_replicas(spec.scaling, spec.replicas, current, list(readings), now, idle_for)
        ceiling = spec.replica_ceiling(c.quotas(svc.tenant), c.models())
        want = min(want, max(current, ceiling))
        # A serving replica the forecast pool would replace at once is kept instead.
        want = max(want, serving_floor(c.warm_plans.get(svc.id), current))
        if want == 0 and current > 0 and self._still_starting(svc):
            want = current  # the idle timer never kills a replica that is not ready yet
        c.record_scaling(svc, want, idle_for or 0.0, value)
        if want != current:
            readings.clear()  # the next decision waits for a whole window at the new size

    def _value(
        self, svc: ServiceRecord, spec: ServiceSpec, traffic: Traffic, replicas: int
    ) -> float | None:
        metric = spec.scaling.metric
        if metric is ScalingMetric.WAITING_REQUESTS:
            name = WAITING_METRIC[spec.engine.preset]
            path = spec.engine.resolved.metrics_path
            waiting = 0.0
            for url in self._controller.ready_urls(svc.id):
                try:
                    waiting += metric_sum(self._scrape(url + path), name)
                except httpx.HTTPError:
                    continue
            return (waiting + traffic.held) / replicas
        if metric is ScalingMetric.CONCURRENCY:
            return (traffic.in_flight + traffic.held) / replicas
        if metric is ScalingMetric.TIME_TO_FIRST_TOKEN:
            return quantile(list(traffic.first_byte_s)[-100:], 0.9)
        return None

    def _utilization(self, svc: ServiceRecord, now: float) -> list[Reading]:
        """Readings (percent, at each sample's time) from the serving replicas' samples newer
        than the last read; warm ones are left out (asleep, they would read as idle)."""
        c = self._controller
        serving = [
            r.workload_id
            for r in stored.replicas(c.store, svc.id, live=True)
            if r.state is ReplicaState.READY and not r.pooled
        ]
        since = max(self._sampled.get(svc.id, 0.0), now - UTILIZATION_LOOKBACK_S)
        by_time: dict[float, list[float]] = {}
        for at, fraction in workload_utilization(c.store.engine, serving, since):
            if at > since or svc.id not in self._sampled:
                by_time.setdefault(at, []).append(fraction * 100.0)
        if by_time:
            self._sampled[svc.id] = max(by_time)
        return [Reading(at, sum(v) / len(v)) for at, v in sorted(by_time.items())]

    def _still_starting(self, svc: ServiceRecord) -> bool:
        waiting = (ReplicaState.QUEUED, ReplicaState.STARTING)
        return any(
            r.state in waiting and not r.pooled  # a warm one loading is no request's
            for r in stored.replicas(self._controller.store, svc.id, live=True)
        )
