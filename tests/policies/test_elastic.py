"""Elastic jobs' rules (``policies.elastic``): the members bound, the settings, and when a job
grows or gives back a slice, from samples and a time given as arguments."""

from __future__ import annotations

import pytest

from policies.elastic import (
    ElasticSettings,
    MemberBounds,
    Resize,
    Sample,
    decide,
    slice_priority,
)
from policies.errors import InvalidRequest
from policies.requests import MAX_PRIORITY

NOW = 10_000.0
SETTINGS = ElasticSettings()  # 80 %, 5 min, 30 min


def steady(util: float, since_s: float) -> list[Sample]:
    """One sample a minute from ``since_s`` seconds ago to now."""
    return [Sample(NOW - t, util) for t in range(int(since_s), -1, -60)]


@pytest.mark.parametrize(
    ("lo", "hi", "field"),
    [
        (0, 2, "members.min"),
        (3, 2, "members.max"),
        (1, 2000, "members.max"),
        (True, 2, "members.min"),
    ],
)
def test_bounds_name_the_field(lo: int, hi: int, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        MemberBounds(lo, hi)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"threshold": 1.5}, "elastic.threshold"),
        ({"window_s": -1}, "elastic.window_s"),
        ({"idle_s": 1e9}, "elastic.idle_s"),
        ({"threshold": 0.5, "idle_below": 0.6}, "elastic.idle_below"),
    ],
)
def test_settings_name_the_field(kw: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        ElasticSettings(**kw)
    assert err.value.field == field


def verdict(members: int, job: list[Sample], newest: list[Sample], free: bool = True) -> Resize:
    return decide(
        members=members,
        bounds=MemberBounds(2, 4),
        settings=SETTINGS,
        job_samples=job,
        newest_slice_samples=newest,
        capacity_free=free,
        now=NOW,
    )


def test_grows_only_after_a_whole_busy_window_with_capacity_free() -> None:
    assert verdict(2, steady(0.9, 300), []) is Resize.GROW
    assert verdict(2, steady(0.9, 240), []) is Resize.NONE  # 4 minutes of history: too short
    assert verdict(2, steady(0.9, 300), [], free=False) is Resize.NONE
    dip = steady(0.9, 300)
    dip[2] = Sample(dip[2].at, 0.79)
    assert verdict(2, dip, []) is Resize.NONE  # one sample under 80 % in the window
    old_dip = [Sample(NOW - 600, 0.1), *steady(0.9, 300)]
    assert verdict(2, old_dip, []) is Resize.GROW  # before the window: ignored
    assert verdict(4, steady(0.9, 300), []) is Resize.NONE  # at max


def test_gives_back_a_slice_idle_for_the_idle_time_never_below_min() -> None:
    idle = steady(0.0, 1800)
    assert verdict(3, steady(0.5, 1800), idle) is Resize.SHRINK
    assert verdict(3, steady(0.5, 1800), steady(0.0, 1740)) is Resize.NONE  # 29 minutes
    assert verdict(2, steady(0.5, 1800), idle) is Resize.NONE  # at min: nothing to give back
    woke = [*steady(0.0, 1800), Sample(NOW, 0.2)]
    assert verdict(3, steady(0.5, 1800), woke) is Resize.NONE


def test_a_slice_runs_one_priority_step_below_its_job() -> None:
    assert slice_priority(0) == -1
    assert slice_priority(-MAX_PRIORITY) == -MAX_PRIORITY
