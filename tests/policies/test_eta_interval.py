"""Calibrated waits (policies.eta): run-length history, interval curves and calibration."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.errors import InvalidRequest
from policies.eta import (
    MIN_HISTORY,
    Interval,
    IntervalCurve,
    Release,
    RunLengths,
    WaitCalibration,
    release_of,
)

NOW = 1_000.0
G = ("team-a", "job")


def _release(amount: int, a: float, b: float, c: float) -> Release:
    low, point, high = sorted((a, b, c))
    return Release(amount, NOW + low, NOW + point, NOW + high, declared=False)


releases = st.lists(
    st.builds(
        _release,
        st.integers(0, 8),
        st.floats(0, 1e5),
        st.floats(0, 1e5),
        st.floats(0, 1e5),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(releases, st.integers(0, 40), st.integers(0, 40), st.integers(0, 8), st.integers(1, 8))
def test_interval_is_ordered_and_monotone_in_the_queue_ahead(
    rels: list[Release], ahead: int, more: int, free: int, need: int
) -> None:
    curve = IntervalCurve(rels)
    first = curve.interval(ahead, free, need, NOW, 1, "H100")
    later = curve.interval(ahead + more, free, need, NOW, 2, "H100")
    if first is None:
        assert later is None  # more ahead never makes an unknown wait known
        return
    assert 0.0 <= first.low <= first.point <= first.high
    if later is not None:
        assert later.low >= first.low
        assert later.point >= first.point
        assert later.high >= first.high


def test_interval_says_what_frees_and_why() -> None:
    curve = IntervalCurve([Release(4, NOW + 720, NOW + 720, NOW + 720, declared=True)])
    got = curve.interval(2, 0, 1, NOW, 3, "H100")
    assert got == Interval(
        720.0,
        720.0,
        720.0,
        "3 workloads ahead of you; the next H100 frees in about 12 min when a job reaches "
        "its time limit",
    )
    assert curve.interval(4, 0, 1, NOW, 3, "H100") is None  # 5 needed, only 4 ever free


def test_no_end_time_is_no_estimate() -> None:
    inf = math.inf
    curve = IntervalCurve([Release(8, inf, inf, inf, declared=False)])
    assert curve.interval(0, 0, 1, NOW, 0, "H100") is None
    assert "no running workload has an end time" in IntervalCurve([])._reason(0, "H100", NOW)


def test_remaining_time_is_conditioned_on_time_run_so_far() -> None:
    h = RunLengths()
    for length in range(10, 110, 10):  # 10, 20, ..., 100
        h.add(G, float(length))
    # Runs that outlived 55 s: 60..100; remaining 5, 15, 25, 35, 45.
    assert h.remaining(G, 55.0) == (5.0, 25.0, 35.0)
    # Fresh: all ten runs count.
    assert h.remaining(G, 0.0) == (20.0, 50.0, 80.0)
    # Outlived every run of its group and of everybody: no estimate.
    assert h.remaining(G, 100.0) is None


def test_a_group_with_little_history_borrows_everyones() -> None:
    h = RunLengths()
    for _ in range(MIN_HISTORY):
        h.add(("team-b", "job"), 1000.0)
    h.add(G, 10.0)  # one run of its own is too few
    assert h.remaining(G, 0.0) == (1000.0, 1000.0, 1000.0)
    with pytest.raises(InvalidRequest):
        h.add(G, -1.0)


def test_release_of_prefers_a_declared_limit_over_history() -> None:
    h = RunLengths()
    for length in (100.0, 200.0, 300.0, 400.0, 500.0):
        h.add(G, length)
    declared = release_of(2, NOW - 50, NOW + 30, G, h, NOW)
    assert (declared.low, declared.point, declared.high, declared.declared) == (
        NOW + 30,
        NOW + 30,
        NOW + 30,
        True,
    )
    guessed = release_of(2, NOW - 150, None, G, h, NOW)
    assert (guessed.low, guessed.point, guessed.high) == (NOW + 50, NOW + 150, NOW + 350)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(1, 1e4), st.floats(0, 1e5)), min_size=MIN_HISTORY, max_size=50),
    st.floats(0, 1e4),
    st.floats(0, 1e4),
    st.floats(0, 1e4),
)
def test_calibration_keeps_the_order(
    pairs: list[tuple[float, float]], a: float, b: float, c: float
) -> None:
    cal = WaitCalibration()
    for est, real in pairs:
        cal.add(est, real)
    low, point, high = sorted((a, b, c))
    got = cal.apply(Interval(point, low, high, "r"))
    assert 0.0 <= got.low <= got.point <= got.high


def test_calibration_learns_a_systematic_underestimate() -> None:
    cal = WaitCalibration()
    for _ in range(10):
        cal.add(100.0, 300.0)
    got = cal.apply(Interval(50.0, 40.0, 60.0, "r"))
    # Every past wait was 3 times its estimate: the interval is there, the point moves in.
    assert (got.point, got.low, got.high) == (150.0, 150.0, 150.0)


def test_calibration_interval_is_the_point_times_the_p20_and_p80_ratios() -> None:
    cal = WaitCalibration()
    for ratio in range(1, 11):  # realized / estimated: 0.5, 1.0, ... 5.0
        cal.add(100.0, 50.0 * ratio)
    got = cal.apply(Interval(100.0, 0.0, 1e6, "r"))
    # The p20 and p80 of ten ratios are the 2nd and 8th; the raw width is not added, and a
    # point inside the interval stays.
    assert (got.low, got.point, got.high) == (100.0, 100.0, 400.0)


def test_calibration_covers_past_waits_at_its_stated_rate() -> None:
    """Split-conformal: on errors like the ones it learned from, the p20–p80 interval holds
    the realized wait close to 60 % of the time, whatever the raw interval said."""
    rng = random.Random(7)
    cal = WaitCalibration(window=2000)
    for _ in range(2000):
        est = rng.uniform(60, 3600)
        cal.add(est, est * rng.lognormvariate(0.3, 0.8))
    inside = 0
    for _ in range(2000):
        est = rng.uniform(60, 3600)
        real = est * rng.lognormvariate(0.3, 0.8)
        got = cal.apply(Interval(est, est, est, "r"))  # a raw interval that is a point
        inside += got.low <= real <= got.high
    assert 0.55 <= inside / 2000 <= 0.65


def test_calibration_keeps_the_newest_ratios() -> None:
    cal = WaitCalibration(window=MIN_HISTORY)
    for _ in range(MIN_HISTORY):
        cal.add(100.0, 1000.0)
    for _ in range(MIN_HISTORY):
        cal.add(100.0, 100.0)  # estimates got better: the old errors are forgotten
    assert len(cal) == MIN_HISTORY
    assert cal.apply(Interval(60.0, 60.0, 60.0, "r"))[:3] == (60.0, 60.0, 60.0)
    with pytest.raises(InvalidRequest, match="calibration window"):
        WaitCalibration(window=MIN_HISTORY - 1)


def test_history_keeps_the_newest_runs_of_a_group_and_of_the_pool() -> None:
    h = RunLengths(per_group=MIN_HISTORY, pooled=MIN_HISTORY)
    for _ in range(MIN_HISTORY):
        h.add(G, 100.0)
    for _ in range(MIN_HISTORY):
        h.add(G, 1000.0)  # the group's habits changed: the old runs are forgotten
    assert h.remaining(G, 0.0) == (1000.0, 1000.0, 1000.0)
    assert len(h) == MIN_HISTORY
    assert h.capacity == MIN_HISTORY
    with pytest.raises(InvalidRequest, match="run-length window"):
        RunLengths(per_group=0)
