"""The pre-warm planner: how many warm (loaded, asleep) replicas a service keeps, sized from
its forecast arrivals within its warm budget.

A trusted forecast sizes the pool to the busiest hour ahead: enough replicas for its arrivals,
less those already serving, never more than the budget (and down to zero when nothing is
expected: a warm replica holds GPUs). While it does, the serving replicas it counts are kept
(``keep_serving``): an idle serving replica holds the same GPU as a warm one, and stopping it
only for the pool to load another leaves a load time with no replica ready. A forecast that
has been wrong lately is not trusted: then the pool is the reactive floor, what the service
keeps without a forecast. The error is MASE (``policies.forecast.mase``): 1 is as wrong as
repeating the last season was.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from policies.errors import InvalidRequest
from policies.forecast import HOURS_PER_DAY, MIN_SEASONS, holt_winters, mae, naive_scale, season_for

MAX_FORECAST_ERROR = 1.0
"""Recent MASE above which the forecast is not trusted: worse than the seasonal-naive one."""
MIN_EXPECTED = 0.5
"""Forecast arrivals in a bin below which none is expected: a fit's small positive night
values would otherwise keep a warm replica (and its GPUs) all night."""
CHECKED_BINS = HOURS_PER_DAY
"""The latest bins a forecast is checked on before it is trusted: a whole daily cycle."""


class WarmReason(StrEnum):
    """Why a plan has its size."""

    FORECAST = "forecast"
    HIGH_ERROR = "high-error"  # recent error above the limit: the reactive floor
    NO_ERROR_YET = "no-error-yet"  # the forecast was never checked: the reactive floor
    NO_FORECAST = "no-forecast"  # nothing forecast: the reactive floor


@dataclass(frozen=True, slots=True)
class WarmPlan:
    replicas: int
    reason: WarmReason
    keep_serving: int = 0
    """Serving replicas not to scale down below while this plan holds: one stopped would be
    replaced at once by a warm replica (the same GPU, and a load time with none ready)."""


def _count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequest(name, value, "an integer >= 0")


def plan_warm(
    forecast_arrivals: Sequence[float],
    *,
    recent_error: float | None,
    warm_budget: int,
    reactive_floor: int,
    arrivals_per_replica: float,
    serving: int = 0,
    max_error: float = MAX_FORECAST_ERROR,
) -> WarmPlan:
    """Warm replicas for a service.

    Args:
        forecast_arrivals: forecast arrivals per hour over the hours the pool must cover (the
            time a cold replica takes to become ready, rounded up to hours, or more).
        recent_error: the forecast's MASE over its latest checked hours (``recent_error``);
            ``None`` when it was never checked.
        warm_budget: the most warm replicas the service may keep (its ``replicas.warm``).
        reactive_floor: the warm replicas kept without a trusted forecast (capped by the
            budget).
        arrivals_per_replica: arrivals per hour one replica serves.
        serving: replicas serving now; they take arrivals before a warm one is woken.
        max_error: the recent MASE above which the forecast is not trusted.
    """
    _count("warm_budget", warm_budget)
    _count("reactive_floor", reactive_floor)
    _count("serving", serving)
    if not math.isfinite(arrivals_per_replica) or arrivals_per_replica <= 0:
        raise InvalidRequest("arrivals_per_replica", arrivals_per_replica, "a number > 0")
    if not math.isfinite(max_error) or max_error <= 0:
        raise InvalidRequest("max_error", max_error, "a number > 0")
    for i, v in enumerate(forecast_arrivals):
        if not math.isfinite(v) or v < 0:
            raise InvalidRequest(f"forecast_arrivals[{i}]", v, "a finite value >= 0")
    if recent_error is not None and (math.isnan(recent_error) or recent_error < 0):
        raise InvalidRequest("recent_error", recent_error, "a MASE >= 0, or none")
    floor = min(reactive_floor, warm_budget)
    if not forecast_arrivals:
        return WarmPlan(floor, WarmReason.NO_FORECAST)
    if recent_error is None:
        return WarmPlan(floor, WarmReason.NO_ERROR_YET)
    if recent_error > max_error:
        return WarmPlan(floor, WarmReason.HIGH_ERROR)
    # A tiny tolerance: 2.0000000001 forecast arrivals for 1 per replica still need 2.
    needed = math.ceil(max(forecast_arrivals) / arrivals_per_replica - 1e-9)
    keep = min(serving, needed) if warm_budget else 0
    return WarmPlan(max(0, min(needed - serving, warm_budget)), WarmReason.FORECAST, keep)


def recent_error(
    actual: Sequence[float], predicted: Sequence[float], history: Sequence[float]
) -> float:
    """The MASE of ``predicted`` against what happened, scaled by the seasonal-naive error on
    ``history`` (the hours before the forecast, oldest first). A history that never varied
    has no scale: then any miss is an infinite error and no miss is none."""
    error = mae(actual, predicted)
    scale = naive_scale(history, season_for(len(history)) or 1)
    if scale is None:
        return 0.0 if error == 0 else math.inf
    return error / scale


@dataclass(frozen=True, slots=True)
class ArrivalForecast:
    """Arrivals per bin ahead of a history, and how wrong the same model was lately."""

    ahead: tuple[float, ...]  # ahead[0]: the bin right after the history's last
    recent_error: float | None  # MASE on the history's last ``CHECKED_BINS``; None: unchecked
    method: str


def forecast_arrivals(history: Sequence[float], horizon: int) -> ArrivalForecast:
    """Fit Holt-Winters on ``history`` (arrivals per bin, oldest first, whole bins only) and
    forecast ``horizon`` bins. The error is out of sample: a second fit on all but the last
    ``CHECKED_BINS`` is scored on them. Fewer bins than a daily season needs, plus the
    checked ones, give no error (the planner then keeps its floor)."""
    ahead = holt_winters(history, horizon)
    error = None
    fitted = len(history) - CHECKED_BINS
    if fitted >= MIN_SEASONS * HOURS_PER_DAY:
        older, checked = list(history[:fitted]), list(history[fitted:])
        past = holt_winters(older, CHECKED_BINS)
        error = recent_error(checked, past.values, older)
    return ArrivalForecast(ahead.values, error, ahead.method.value)


def expected(forecast: Sequence[float]) -> list[float]:
    """The bins where an arrival is expected (``MIN_EXPECTED``), others as none."""
    return [v if v >= MIN_EXPECTED else 0.0 for v in forecast]


def plan_ahead(
    forecast: ArrivalForecast,
    offset: int,
    horizon: int,
    *,
    warm_budget: int,
    reactive_floor: int,
    arrivals_per_replica: float,
    serving: int = 0,
) -> WarmPlan:
    """``plan_warm`` on the ``horizon`` bins from ``offset`` bins after the forecast's first
    (a cached fit serves the bins after it too), counting only expected arrivals."""
    return plan_warm(
        expected(forecast.ahead[offset : offset + horizon]),
        recent_error=forecast.recent_error,
        warm_budget=warm_budget,
        reactive_floor=reactive_floor,
        arrivals_per_replica=arrivals_per_replica,
        serving=serving,
    )
