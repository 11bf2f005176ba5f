"""Scaling strategies compared by ``benchmarks.inference``, and where a fourth one plugs in.

A strategy gives a service its replica bounds at deploy time and may change them while the
trace plays (``step``, called every ``STEP_S`` with the arrivals seen so far, never the future
ones). Three are static: their ``step`` does nothing and the portal's own autoscaler does the
rest. ``forecast`` sizes the warm pool with the portal's pre-warm planner
(``policies.prewarm``: the same fit, error check and plan as a service with
``warm_policy: forecast``), from the arrivals of the simulated days before the replay and
those seen so far, binned per simulated hour; the autoscaler still moves the serving count.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.forecast import HOURS_PER_DAY
from policies.prewarm import ArrivalForecast, forecast_arrivals, plan_ahead
from portal.inference.prewarm import REACTIVE_FLOOR, arrivals_per_replica

STEP_S = 1.0
"""How often a strategy's ``step`` is called during the replay."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """A service's ``replicas``: serving ``minimum``..``maximum``, ``warm`` beside them."""

    minimum: int
    maximum: int
    warm: int

    def spec(self) -> dict[str, int]:
        return {"min": self.minimum, "max": self.maximum, "warm": self.warm}

    @property
    def gpus(self) -> int:
        """The most devices the service can hold at once (one per replica)."""
        return self.maximum + self.warm


class Scaler(Protocol):
    """What a strategy may do to its service while the trace plays."""

    async def set_bounds(self, bounds: Bounds) -> None: ...

    async def serving(self) -> int:
        """The serving replicas the service wants now (its ``desired``)."""
        ...


class Strategy(Protocol):
    @property
    def name(self) -> str:
        """Its name in the report and in its tenants' names (a DNS label)."""
        ...

    def bounds(self, max_replicas: int) -> Bounds:
        """The bounds to deploy with; their ``gpus`` sizes the tenant's quota (a planner that
        raises ``warm`` later answers the highest it will use, and lowers them in ``step``)."""
        ...

    async def step(self, scaler: Scaler, now_s: float, seen: tuple[float, ...]) -> None:
        """Called every ``STEP_S`` with the arrivals up to ``now_s`` (seconds into the trace)."""
        ...


@dataclass(frozen=True, slots=True)
class Static:
    """Fixed bounds; the portal's autoscaler moves the serving count within them."""

    name: str
    minimum: int
    warm: int

    def bounds(self, max_replicas: int) -> Bounds:
        return Bounds(self.minimum, max(self.minimum, max_replicas), self.warm)

    async def step(self, scaler: Scaler, now_s: float, seen: tuple[float, ...]) -> None:
        return None


class Forecast:
    """Forecast-driven warm pool: deployed as ``reactive`` (min 0, warm 0, the same quota),
    then every step ``warm`` is set to the planner's size, at most ``budget``.

    A bin is a simulated hour (``day_s / 24``); the fit is cached and refit once per bin
    (in a thread: a fit takes tenths of a second of CPU), on whole bins only. The plan covers
    the bins from now to a load time (and one step) ahead: a load started now is ready then.
    The serving replicas the plan counts on are kept as ``min`` (``WarmPlan.keep_serving``,
    what the portal's autoscaler does for a forecast-policy service).
    """

    name = "forecast"

    def __init__(
        self,
        *,
        budget: int = 1,
        day_s: float = 0.0,
        load_s: float = 0.0,
        history: Sequence[float] = (),
        history_s: float = 0.0,
        target: float = 1.0,
        request_s: float = 1.0,
    ) -> None:
        self.budget = budget
        self.bin_s = day_s / HOURS_PER_DAY if day_s else 1.0
        # A load started now serves arrivals from a load time on: the pool covers the bins
        # from now to a load time (and one step) ahead, not whole bins beyond it.
        self.lead_s = load_s + STEP_S
        self.horizon = 2 + math.ceil(self.lead_s / self.bin_s)  # bins each fit forecasts
        self.history = tuple(history)  # arrivals before the replay, seconds (negative)
        self.first_bin = -math.ceil(history_s / self.bin_s)
        self.per_replica = arrivals_per_replica(target, request_s, self.bin_s)
        self.reasons: Counter[str] = Counter()  # steps per plan reason
        self.timeline: list[tuple[float, int, str]] = []  # per step: (s, warm planned, reason)
        self.maximum = 1
        self._fit: ArrivalForecast | None = None
        self._fit_bin: int | None = None
        self._bounds = Bounds(0, 1, 0)

    def bounds(self, max_replicas: int) -> Bounds:
        self.maximum = max(1, max_replicas)
        self._bounds = Bounds(0, self.maximum, 0)
        return self._bounds

    def bins(self, seen: Sequence[float], upto: int) -> list[float]:
        """Arrivals per whole bin from the history's first to ``upto`` (excluded)."""
        counts = [0.0] * (upto - self.first_bin)
        for t in (*self.history, *seen):
            i = math.floor(t / self.bin_s) - self.first_bin
            if 0 <= i < len(counts):
                counts[i] += 1
        return counts

    async def step(self, scaler: Scaler, now_s: float, seen: tuple[float, ...]) -> None:
        b = math.floor(now_s / self.bin_s)
        if b != self._fit_bin:
            done = self.bins(seen, b)
            self._fit = await asyncio.to_thread(forecast_arrivals, done, self.horizon)
            self._fit_bin = b
        assert self._fit is not None
        plan = plan_ahead(
            self._fit,
            0,
            math.floor((now_s + self.lead_s) / self.bin_s) - b + 1,
            warm_budget=self.budget,
            reactive_floor=REACTIVE_FLOOR,
            arrivals_per_replica=self.per_replica,
            serving=await scaler.serving(),
        )
        self.reasons[plan.reason.value] += 1
        self.timeline.append((now_s, plan.replicas, plan.reason.value))
        # The portal's autoscaler keeps ``keep_serving`` of a forecast-policy service's
        # serving replicas; a service driven from outside gets the same floor as its ``min``.
        bounds = Bounds(plan.keep_serving, self.maximum, plan.replicas)
        if bounds != self._bounds:
            await scaler.set_bounds(bounds)
            self._bounds = bounds


STRATEGIES: Mapping[str, Strategy] = {
    "reactive": Static("reactive", minimum=0, warm=0),
    "warm-pool": Static("warm-pool", minimum=0, warm=1),
    "fixed-min": Static("fixed-min", minimum=1, warm=0),
    "forecast": Forecast(),
}
"""``forecast`` here is a placeholder: a run builds one per cell (``Forecast(...)`` with
the cell's trace history, day and load time)."""
