"""Forecast-driven warm pools: a service with ``scaling.warm_policy: forecast`` has its warm
pool sized by the pre-warm planner (``policies.prewarm``), with ``replicas.warm`` as the
budget.

Every ``PLAN_EVERY_S`` (the ``prewarm`` loop, not per request) each such service's arrivals
are read from the gateway's count (``Traffic.arrived``) and binned per ``bin_s`` (an hour);
its Holt-Winters fit is cached and refit at most every ``refit_s`` of service time, and only
once a new bin has completed (a fit costs tenths of a second of CPU). The plan itself is
cheap and made every round from the cached fit: the warm replicas the busiest of the next
``horizon`` bins needs, less the serving ones, within the budget and what the tenant's limit
holds beside the serving replicas. A forecast never checked or lately wrong gives the
reactive floor (no warm replica: the autoscaler alone), with the reason shown in the
service's ``warm_plan`` and its events.

The history lives in this process: after a restart a service starts again from no history
(the reactive floor) until a daily cycle has been seen and checked.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from policies.prewarm import (
    CHECKED_BINS,
    ArrivalForecast,
    WarmReason,
    forecast_arrivals,
    plan_ahead,
)
from policies.services import WarmPolicy
from portal.inference.spec import ServiceSpec
from portal.store import services as stored
from portal.store.records import ChangeSet, EventRecord, ServiceRecord

if TYPE_CHECKING:
    from portal.inference.controller import ServiceController

log = logging.getLogger(__name__)

PLAN_EVERY_S = 5.0
"""Seconds between rounds of the ``prewarm`` loop."""
BIN_S = 3600.0
REFIT_S = 300.0
HORIZON_BINS = 2
"""The current hour and the next: a cold replica is ready well within them."""
HISTORY_BINS = 14 * 24
REACTIVE_FLOOR = 0
DEFAULT_REQUEST_S = 1.0
"""A request's duration before the gateway has timed one (Little's law below)."""


@dataclass(frozen=True, slots=True)
class WarmSizing:
    """The planner's latest answer for a service, as its view shows it."""

    replicas: int
    reason: WarmReason
    budget: int
    serving: int  # the serving replicas it was planned beside
    keep_serving: int  # the autoscaler does not scale below this many (``WarmPlan``)
    recent_error: float | None
    method: str | None
    at: datetime


@dataclass
class _History:
    first_bin: int
    counts: list[float]  # per bin from ``first_bin``; the last one is still filling
    seen: int  # ``Traffic.arrived`` when last read
    fit: ArrivalForecast | None = None
    fit_bin: int = 0  # the bin ``fit.ahead[0]`` forecasts
    fitted_at: float = -math.inf
    sizing: WarmSizing | None = field(default=None)


def warm_size(spec: ServiceSpec, sizing: WarmSizing | None, serving: int) -> int:
    """The warm replicas the controller keeps beside ``serving`` wanted now: ``replicas.warm``
    with the fixed policy; with the forecast policy the planner's size (the floor before its
    first plan). A forecast plan is re-read against the serving count at once: a request that
    woke a pooled replica must not make the next round start another one before the loop's
    next plan."""
    if spec.scaling.warm_policy is WarmPolicy.FIXED:
        return spec.replicas.warm
    if sizing is None:
        return min(spec.replicas.warm, REACTIVE_FLOOR)
    size = sizing.replicas
    if sizing.reason is WarmReason.FORECAST:
        size = max(0, size + sizing.serving - serving)
    return min(spec.replicas.warm, size)


def serving_floor(sizing: WarmSizing | None, current: int) -> int:
    """The serving replicas the autoscaler keeps of ``current`` under a forecast plan: those
    the plan counts on (one stopped would be replaced at once by a warm one, loaded again)."""
    if sizing is None or sizing.reason is not WarmReason.FORECAST:
        return 0
    return min(current, sizing.keep_serving)


def arrivals_per_replica(target: float, request_s: float, bin_s: float) -> float:
    """Arrivals one replica takes in a bin at the scaling target (requests in flight per
    replica): by Little's law, ``target`` requests of ``request_s`` each at once."""
    return max(target, 1.0) * bin_s / max(request_s, 1e-3)


class ForecastWarm:
    """Sizes the warm pools of a controller's forecast-policy services (module docstring)."""

    def __init__(
        self,
        controller: ServiceController,
        *,
        bin_s: float = BIN_S,
        refit_s: float = REFIT_S,
        horizon: int = HORIZON_BINS,
    ) -> None:
        self._c = controller
        self._bin_s = bin_s
        self._refit_s = refit_s
        self._horizon = horizon
        self._history: dict[str, _History] = {}

    def run(self) -> None:
        """One round over every active service with the forecast policy."""
        c = self._c
        kept: dict[str, _History] = {}
        for svc in stored.active_services(c.store):
            spec = c.spec_of(svc)
            if spec.scaling.warm_policy is not WarmPolicy.FORECAST:
                continue
            try:
                kept[svc.id] = self._round(svc, spec)
            except Exception:
                log.exception("prewarm: service %s", svc.name)
                if svc.id in self._history:
                    kept[svc.id] = self._history[svc.id]
        self._history = kept
        c.warm_plans = {sid: h.sizing for sid, h in kept.items() if h.sizing is not None}

    def _round(self, svc: ServiceRecord, spec: ServiceSpec) -> _History:
        c = self._c
        now = c.now
        clock = now.timestamp()
        b = int(clock // self._bin_s)
        traffic = c.traffic.of(svc.id, svc.tenant, svc.name)
        h = self._history.get(svc.id) or _History(b, [0.0], traffic.arrived)
        self._count(h, b, traffic.arrived)
        # Refit once a new bin has completed, and at most every ``refit_s``.
        if h.fit is None or (b > h.fit_bin and clock - h.fitted_at >= self._refit_s):
            done = h.counts[:-1]  # whole bins only
            if done:
                reach = self._horizon + math.ceil(self._refit_s / self._bin_s) + 1
                h.fit, h.fit_bin, h.fitted_at = forecast_arrivals(done, reach), b, clock
        durations = list(traffic.total_s)[-100:]
        request_s = sum(durations) / len(durations) if durations else DEFAULT_REQUEST_S
        room = max(0, spec.replica_ceiling(c.quotas(svc.tenant), c.models()) - svc.desired)
        budget = min(spec.replicas.warm, room)
        if h.fit is None or b - h.fit_bin + self._horizon > len(h.fit.ahead):
            plan_replicas, reason, keep = min(REACTIVE_FLOOR, budget), WarmReason.NO_FORECAST, 0
        else:
            plan = plan_ahead(
                h.fit,
                b - h.fit_bin,
                self._horizon,
                warm_budget=budget,
                reactive_floor=REACTIVE_FLOOR,
                arrivals_per_replica=arrivals_per_replica(
                    spec.scaling.target, request_s, self._bin_s
                ),
                serving=svc.desired,
            )
            plan_replicas, reason, keep = plan.replicas, plan.reason, plan.keep_serving
        sizing = WarmSizing(
            plan_replicas,
            reason,
            spec.replicas.warm,
            svc.desired,
            keep,
            None if h.fit is None else h.fit.recent_error,
            None if h.fit is None else h.fit.method,
            now,
        )
        old = h.sizing
        h.sizing = sizing
        if old is None or (old.replicas, old.reason) != (sizing.replicas, sizing.reason):
            self._event(svc, sizing, room)
        return h

    def _count(self, h: _History, b: int, arrived: int) -> None:
        """Add the arrivals since the last read to bin ``b`` (bins in between had none)."""
        while h.first_bin + len(h.counts) <= b:
            h.counts.append(0.0)
        h.counts[-1] += max(0, arrived - h.seen)  # a lower count: the book was renewed
        h.seen = arrived
        drop = len(h.counts) - HISTORY_BINS
        if drop > 0:
            del h.counts[:drop]
            h.first_bin += drop

    def _event(self, svc: ServiceRecord, s: WarmSizing, room: int) -> None:
        error = "none yet" if s.recent_error is None else f"{s.recent_error:.2f}"
        why = {
            WarmReason.FORECAST: "sized from the forecast",
            WarmReason.HIGH_ERROR: "the forecast's recent error is too high: the reactive floor",
            WarmReason.NO_ERROR_YET: "the forecast is not checked yet: the reactive floor",
            WarmReason.NO_FORECAST: "no forecast yet: the reactive floor",
        }[s.reason]
        capped = f"; the tenant's limit leaves room for {room}" if room < s.budget else ""
        message = (
            f"{svc.name}: warm pool {s.replicas} of budget {s.budget}: {why} "
            f"(recent error {error}, {CHECKED_BINS} bins checked){capped}"
        )
        data = {"service": svc.id, "warm": s.replicas, "reason": s.reason.value}
        event = EventRecord(s.at, "service.warm_planned", svc.tenant, None, message, data)
        self._c.store.commit(ChangeSet(events=[event]))
