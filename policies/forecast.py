"""Hourly demand forecasts: Holt-Winters exponential smoothing and a seasonal-naive baseline.

Pure: a series of hourly values in, a forecast out. The season follows the history's length:
weekly (168 hours, which holds the daily cycle too) from two full weeks on, daily (24) from two
full days, none below. Holt-Winters is statsmodels' ``ExponentialSmoothing`` with an additive
season and no trend (hourly counts are mostly small and often zero: a multiplicative season or
a trend extrapolated for weeks would run away); statsmodels is imported on the first forecast,
not with this module, so nothing that merely imports the portal pays for it.

The series themselves are binned here too (``hourly_counts``, ``hourly_gpu_hours``), so the
portal's history and the benchmark's trace become series in the same way.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from policies.errors import InvalidRequest

HOUR_S = 3600
HOURS_PER_DAY = 24
HOURS_PER_WEEK = 168
MIN_SEASONS = 2
"""Full seasons of history a seasonal model needs: one to start the season, one to check it."""
MIN_SMOOTHING_HOURS = 4
"""Below this many hours the forecast is the history's mean (nothing to smooth)."""
MAX_HORIZON_HOURS = 24 * 7 * 13
"""At most a quarter ahead: further than that an hourly seasonal model says nothing."""


class Method(StrEnum):
    """How a forecast was made (answers name it so a reader can judge it)."""

    HOLT_WINTERS = "holt-winters"
    EXPONENTIAL_SMOOTHING = "exponential-smoothing"
    MEAN = "mean"
    SEASONAL_NAIVE = "seasonal-naive"


@dataclass(frozen=True, slots=True)
class Forecast:
    """``values[h]``: the forecast for the ``h``-th hour after the history's last."""

    values: tuple[float, ...]
    method: Method
    season: int | None  # hours; None: no season


def season_for(hours: int) -> int | None:
    """The longest season ``hours`` of history supports (module docstring)."""
    for season in (HOURS_PER_WEEK, HOURS_PER_DAY):
        if hours >= MIN_SEASONS * season:
            return season
    return None


def _checked(history: Sequence[float], horizon: int) -> list[float]:
    if isinstance(horizon, bool) or not isinstance(horizon, int):
        raise InvalidRequest("horizon", horizon, f"an integer from 1 to {MAX_HORIZON_HOURS} hours")
    if not 1 <= horizon <= MAX_HORIZON_HOURS:
        raise InvalidRequest("horizon", horizon, f"1 to {MAX_HORIZON_HOURS} hours")
    if not history:
        raise InvalidRequest("history", "[]", "at least one hour of values")
    values = [float(v) for v in history]
    for i, v in enumerate(values):
        if not math.isfinite(v) or v < 0:
            raise InvalidRequest(f"history[{i}]", v, "a finite value >= 0")
    return values


def seasonal_naive(history: Sequence[float], horizon: int, season: int | None = None) -> Forecast:
    """Each hour as it was one season earlier (the last value without a season).

    Args:
        history: hourly values, oldest first.
        horizon: hours to forecast.
        season: hours per season; ``None`` picks ``season_for(len(history))``.
    """
    values = _checked(history, horizon)
    if season is None:
        season = season_for(len(values))
    elif isinstance(season, bool) or not isinstance(season, int) or season < 1:
        raise InvalidRequest("season", season, "a positive number of hours")
    if season is None or season > len(values):
        return Forecast((values[-1],) * horizon, Method.SEASONAL_NAIVE, None)
    last = values[-season:]
    return Forecast(tuple(last[h % season] for h in range(horizon)), Method.SEASONAL_NAIVE, season)


def holt_winters(history: Sequence[float], horizon: int) -> Forecast:
    """Holt-Winters with the season ``season_for`` allows, simple exponential smoothing
    without one, and the mean for a history too short (or too flat) to smooth."""
    values = _checked(history, horizon)
    n = len(values)
    mean = sum(values) / n
    if n < MIN_SMOOTHING_HOURS or max(values) == min(values):
        return Forecast((mean,) * horizon, Method.MEAN, None)
    season = season_for(n)
    # Imported here: statsmodels (with scipy and pandas) takes seconds to import.
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    with warnings.catch_warnings():
        # Convergence notes of the optimiser on flat or sparse series: the fit is still usable,
        # and a non-finite one is caught below.
        warnings.simplefilter("ignore")
        model = ExponentialSmoothing(
            values,
            trend=None,
            seasonal="add" if season else None,
            seasonal_periods=season,
            initialization_method="estimated",
        )
        predicted = model.fit().forecast(horizon)
    out = tuple(max(0.0, float(v)) for v in predicted)
    if not all(math.isfinite(v) for v in out):
        return seasonal_naive(values, horizon)
    return Forecast(out, Method.HOLT_WINTERS if season else Method.EXPONENTIAL_SMOOTHING, season)


def mae(actual: Sequence[float], predicted: Sequence[float]) -> float:
    """Mean absolute error of two equally long series."""
    if len(actual) != len(predicted) or not actual:
        raise InvalidRequest(
            "predicted", f"{len(predicted)} values", f"as many as actual ({len(actual)}), >= 1"
        )
    return sum(abs(a - p) for a, p in zip(actual, predicted, strict=True)) / len(actual)


def naive_scale(history: Sequence[float], season: int) -> float | None:
    """The in-sample MAE of the seasonal-naive forecast one season ahead: MASE's divisor.
    ``None`` when the history is shorter than a season and a step or has no variation."""
    if season < 1 or len(history) <= season:
        return None
    diffs = [abs(history[i] - history[i - season]) for i in range(season, len(history))]
    scale = sum(diffs) / len(diffs)
    return scale if scale > 0 else None


def mase(
    actual: Sequence[float], predicted: Sequence[float], history: Sequence[float], season: int
) -> float | None:
    """Mean absolute scaled error (Hyndman and Koehler): below 1 beats the in-sample
    seasonal-naive forecast. ``None`` when ``naive_scale`` is."""
    scale = naive_scale(history, season)
    return None if scale is None else mae(actual, predicted) / scale


def hourly_counts(times: Iterable[int], start: int, hours: int) -> list[float]:
    """Events per hour of ``[start, start + hours·3600)``; times outside are left out.

    Args:
        times: epoch seconds of the events (arrivals).
        start: epoch seconds at a whole hour.
        hours: the series' length.
    """
    _check_window(start, hours)
    out = [0.0] * hours
    for t in times:
        i = (t - start) // HOUR_S
        if 0 <= i < hours:
            out[i] += 1.0
    return out


def hourly_gpu_hours(
    intervals: Iterable[tuple[int, int, float]], start: int, hours: int
) -> list[float]:
    """GPU-hours held per hour: each ``(begin, end, gpus)`` (epoch seconds, GPU-equivalents)
    adds ``gpus`` × the part of each hour it covers."""
    _check_window(start, hours)
    out = [0.0] * hours
    stop = start + hours * HOUR_S
    for begin, end, gpus in intervals:
        lo, hi = max(begin, start), min(end, stop)
        while lo < hi:
            i = (lo - start) // HOUR_S
            edge = min(hi, start + (i + 1) * HOUR_S)
            out[i] += gpus * (edge - lo) / HOUR_S
            lo = edge
    return out


def _check_window(start: int, hours: int) -> None:
    if start % HOUR_S:
        raise InvalidRequest("start", start, "epoch seconds at a whole hour")
    if isinstance(hours, bool) or not isinstance(hours, int) or hours < 0:
        raise InvalidRequest("hours", hours, "an integer >= 0")
