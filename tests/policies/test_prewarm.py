"""The pre-warm planner sizes the pool to the busiest forecast hour within the budget, and
falls back to the reactive floor when the forecast has been wrong lately or never checked."""

from __future__ import annotations

import math

import pytest

from policies.errors import InvalidRequest
from policies.prewarm import MAX_FORECAST_ERROR, WarmPlan, WarmReason, plan_warm, recent_error


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
    assert plan([5.0, 25.0], serving=2) == WarmPlan(1, WarmReason.FORECAST)
    assert plan([80.0]) == WarmPlan(3, WarmReason.FORECAST)
    # Nothing expected: no warm replica holds GPUs, even below the reactive floor.
    assert plan([0.0, 0.0]) == WarmPlan(0, WarmReason.FORECAST)


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
