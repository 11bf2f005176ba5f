"""The pre-warm planner sizes the pool to the busiest forecast hour within the budget, and
falls back to the reactive floor when the forecast has been wrong lately or never checked."""

from __future__ import annotations

import math

import pytest

from policies.errors import InvalidRequest
from policies.prewarm import (
    MAX_FORECAST_ERROR,
    MIN_EXPECTED,
    ArrivalForecast,
    WarmPlan,
    WarmReason,
    expected,
    forecast_arrivals,
    plan_ahead,
    plan_warm,
    recent_error,
)


def plan(forecast: list[float], **kw: object) -> WarmPlan:
    args: dict[str, object] = {
        "recent_error": 0.5,
        "warm_budget": 3,
        "reactive_floor": 1,
        "arrivals_per_replica": 10.0,
        **kw,
    }
    return plan_warm(forecast, **args)  # type: ignore[arg-type]


def test_a_trusted_forecast_sizes_the_pool_to_the_busiest_hour() -> None:
    assert plan([5.0, 25.0, 12.0]) == WarmPlan(3, WarmReason.FORECAST)
    assert plan([5.0, 20.0, 12.0]) == WarmPlan(2, WarmReason.FORECAST)
    # Serving replicas take arrivals first; the budget caps the rest.
    assert plan([5.0, 25.0], serving=2) == WarmPlan(1, WarmReason.FORECAST, keep_serving=2)
    assert plan([80.0]) == WarmPlan(3, WarmReason.FORECAST)
    # Nothing expected: no warm replica holds GPUs, even below the reactive floor.
    assert plan([0.0, 0.0]) == WarmPlan(0, WarmReason.FORECAST)


def test_the_serving_replicas_the_plan_counts_on_are_kept() -> None:
    # One replica needed and one serving: no warm one, and the serving one is not stopped
    # (the pool would load another at once); beyond the need they may go.
    assert plan([8.0], serving=1) == WarmPlan(0, WarmReason.FORECAST, keep_serving=1)
    assert plan([8.0], serving=3) == WarmPlan(0, WarmReason.FORECAST, keep_serving=1)
    assert plan([0.0], serving=2).keep_serving == 0  # nothing expected: the autoscaler's
    # An untrusted forecast holds nothing back; nor does a plan with no pool to refill.
    assert plan([8.0], serving=1, recent_error=math.inf).keep_serving == 0
    assert plan([8.0], serving=1, warm_budget=0).keep_serving == 0


def test_an_untrusted_or_missing_forecast_falls_back_to_the_reactive_floor() -> None:
    busy = [30.0, 30.0]
    assert plan(busy, recent_error=MAX_FORECAST_ERROR + 0.01) == WarmPlan(1, WarmReason.HIGH_ERROR)
    assert plan(busy, recent_error=MAX_FORECAST_ERROR).reason is WarmReason.FORECAST
    assert plan(busy, recent_error=None) == WarmPlan(1, WarmReason.NO_ERROR_YET)
    assert plan([]) == WarmPlan(1, WarmReason.NO_FORECAST)
    assert plan(busy, recent_error=2.0, max_error=3.0).reason is WarmReason.FORECAST
    # The floor never exceeds the budget.
    assert plan(busy, recent_error=math.inf, reactive_floor=5) == WarmPlan(3, WarmReason.HIGH_ERROR)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"warm_budget": -1}, "warm_budget"),
        ({"reactive_floor": 1.5}, "reactive_floor"),
        ({"serving": True}, "serving"),
        ({"arrivals_per_replica": 0.0}, "arrivals_per_replica"),
        ({"recent_error": -0.1}, "recent_error"),
        ({"max_error": math.nan}, "max_error"),
    ],
)
def test_bad_input_names_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        plan([1.0], **kw)
    assert err.value.field == field
    with pytest.raises(InvalidRequest) as err:
        plan([1.0, -2.0])
    assert err.value.field == "forecast_arrivals[1]"


def test_recent_error_is_scaled_by_the_naive_error_on_the_history() -> None:
    history = [0.0, 4.0, 0.0, 4.0]  # season 1: naive errors 4, 4, 4
    assert recent_error([2.0, 2.0], [0.0, 2.0], history) == pytest.approx(1 / 4)
    assert recent_error([1.0], [1.0], [3.0, 3.0]) == 0.0
    assert recent_error([1.0], [0.0], [3.0, 3.0]) == math.inf


def test_a_cached_forecast_is_planned_from_its_offset_and_ignores_unlikely_arrivals() -> None:
    fc = ArrivalForecast((0.3, 0.4, 12.0, 25.0, 0.0), recent_error=0.5, method="holt-winters")
    kw = {"warm_budget": 3, "reactive_floor": 1, "arrivals_per_replica": 10.0}
    # Bins 0-1: under MIN_EXPECTED (0.5) each, nothing expected: no warm replica.
    assert MIN_EXPECTED == 0.5 and expected([0.3, 0.5, 2.0]) == [0.0, 0.5, 2.0]
    assert plan_ahead(fc, 0, 2, **kw) == WarmPlan(0, WarmReason.FORECAST)
    # Two bins later (the same fit, reused): 25 arrivals need 3, one serves.
    assert plan_ahead(fc, 2, 2, serving=1, **kw) == WarmPlan(2, WarmReason.FORECAST, 1)
    untrusted = ArrivalForecast(fc.ahead, recent_error=1.5, method="holt-winters")
    assert plan_ahead(untrusted, 2, 2, **kw) == WarmPlan(1, WarmReason.HIGH_ERROR)


def test_a_forecast_is_checked_only_with_two_days_before_its_last_day() -> None:
    day = [0.0] * 8 + [20.0, 22.0, 19.0, 21.0, 20.0, 18.0, 23.0, 20.0, 21.0, 19.0] + [0.0] * 6
    # Two days: a forecast, never checked (a daily season needs two days before the check).
    short = forecast_arrivals(day * 2, 3)
    assert short.recent_error is None and len(short.ahead) == 3
    # Three days alike: checked on the third, and the night ahead is forecast empty.
    full = forecast_arrivals(day * 3, 3)
    assert full.recent_error is not None and full.method == "holt-winters"
    assert expected(full.ahead) == [0.0, 0.0, 0.0]
    # The third day turned upside down: far worse than repeating the day before.
    flipped = forecast_arrivals(day * 2 + day[12:] + day[:12], 3)
    assert flipped.recent_error is not None and flipped.recent_error > MAX_FORECAST_ERROR
