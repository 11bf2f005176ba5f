"""Hourly forecasts: the season follows the history, Holt-Winters learns a daily and weekly
pattern through noise better than repeating last week, and bad input is refused."""

from __future__ import annotations

import math
import random

import pytest

from policies.errors import InvalidRequest
from policies.forecast import (
    HOURS_PER_DAY,
    HOURS_PER_WEEK,
    Method,
    holt_winters,
    hourly_counts,
    hourly_gpu_hours,
    mae,
    mase,
    naive_scale,
    season_for,
    seasonal_naive,
)


def _pattern(hour: int) -> float:
    """Busy working hours, quiet weekends: a daily and a weekly cycle."""
    day, hod = divmod(hour % HOURS_PER_WEEK, HOURS_PER_DAY)
    level = 6.0 if 9 <= hod < 18 else 1.0
    return level * (0.3 if day >= 5 else 1.0)


def _poisson(rng: random.Random, lam: float) -> float:
    # Knuth's method: small rates only, which is all these series have.
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return float(k)
        k += 1


def test_the_season_follows_the_history() -> None:
    assert season_for(2 * HOURS_PER_WEEK) == HOURS_PER_WEEK
    assert season_for(2 * HOURS_PER_WEEK - 1) == HOURS_PER_DAY
    assert season_for(2 * HOURS_PER_DAY) == HOURS_PER_DAY
    assert season_for(2 * HOURS_PER_DAY - 1) is None


def test_seasonal_naive_repeats_the_last_season() -> None:
    history = [float(h % 5) for h in range(3 * HOURS_PER_DAY)]
    f = seasonal_naive(history, 30)
    assert f.season == HOURS_PER_DAY
    assert list(f.values) == history[-HOURS_PER_DAY:] + history[-HOURS_PER_DAY:][:6]
    assert seasonal_naive([1.0, 4.0], 3).values == (4.0, 4.0, 4.0)


def test_holt_winters_learns_the_week_and_beats_seasonal_naive_through_noise() -> None:
    rng = random.Random(7)
    weeks = 4
    series = [_poisson(rng, _pattern(h)) for h in range((weeks + 1) * HOURS_PER_WEEK)]
    history, actual = series[: weeks * HOURS_PER_WEEK], series[weeks * HOURS_PER_WEEK :]
    hw = holt_winters(history, HOURS_PER_WEEK)
    naive = seasonal_naive(history, HOURS_PER_WEEK)
    assert (hw.method, hw.season) == (Method.HOLT_WINTERS, HOURS_PER_WEEK)
    assert all(v >= 0 for v in hw.values)
    # Smoothing averages the noise of several weeks; the naive forecast repeats one week's.
    truth = [_pattern(h) for h in range(weeks * HOURS_PER_WEEK, (weeks + 1) * HOURS_PER_WEEK)]
    assert mae(truth, hw.values) < 0.6 * mae(truth, naive.values)
    assert mae(actual, hw.values) < mae(actual, naive.values)


def test_short_histories_fall_back() -> None:
    three_days = [_pattern(h) for h in range(3 * HOURS_PER_DAY)]
    f = holt_winters(three_days, 5)
    assert (f.method, f.season) == (Method.HOLT_WINTERS, HOURS_PER_DAY)
    assert holt_winters([1.0, 2.0, 3.0, 1.0, 2.0], 2).method is Method.EXPONENTIAL_SMOOTHING
    assert holt_winters([1.0, 3.0], 2) == holt_winters([2.0, 2.0], 2)
    assert holt_winters([0.0] * 500, 3).values == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("history", "horizon", "field"),
    [
        ([], 3, "history"),
        ([1.0, -1.0], 3, "history[1]"),
        ([1.0, math.nan], 3, "history[1]"),
        ([1.0], 0, "horizon"),
        ([1.0], 10**6, "horizon"),
        ([1.0], True, "horizon"),
    ],
)
def test_bad_input_names_the_field(history: list[float], horizon: int, field: str) -> None:
    for forecast in (holt_winters, seasonal_naive):
        with pytest.raises(InvalidRequest) as err:
            forecast(history, horizon)
        assert err.value.field == field


def test_errors_against_the_naive_scale() -> None:
    history = [0.0, 2.0, 0.0, 4.0]  # naive (season 1) in-sample errors 2, 2, 4: scale 8/3
    assert naive_scale(history, 1) == pytest.approx(8 / 3)
    assert mase([1.0, 1.0], [3.0, 1.0], history, 1) == pytest.approx(1 / (8 / 3))
    assert naive_scale([1.0, 1.0, 1.0], 1) is None
    assert naive_scale([1.0], 1) is None
    with pytest.raises(InvalidRequest):
        mae([1.0], [1.0, 2.0])


def test_binning_counts_and_splits_across_hours() -> None:
    start = 10 * 3600
    assert hourly_counts(
        [start - 1, start, start + 3599, start + 7200, start + 3 * 3600], start, 3
    ) == [
        2.0,
        0.0,
        1.0,
    ]
    # 2 GPUs from 00:30 to 02:15 into the window; 0.5 GPU for the whole second hour.
    usage = hourly_gpu_hours(
        [(start + 1800, start + 2 * 3600 + 900, 2.0), (start + 3600, start + 7200, 0.5)], start, 3
    )
    assert usage == pytest.approx([1.0, 2.5, 0.5])
    with pytest.raises(InvalidRequest) as err:
        hourly_counts([], start + 1, 3)
    assert err.value.field == "start"
