"""The pre-start planner, with the Poisson arithmetic worked out in the comments."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.errors import InvalidRequest
from policies.prestart import (
    DEFAULT_HORIZON_S,
    DEFAULT_MISS,
    PrestartOption,
    PrestartReason,
    plan_prestart,
    poisson_quantile,
)

H100 = "H100-80GB"
# Over the default 10 minutes: 6/h is a mean of 1 spawn, 3/h of 0.5.
ONE = PrestartOption("gpu:H100-80GB:1", H100, 1.0, 6.0)
SHARE = PrestartOption("share:T4:250", "T4/share", 0.25, 3.0)
FOUR = PrestartOption("gpu:H100-80GB:4", H100, 4.0, 3.0)
FREE = {H100: 16.0, "T4/share": 4.0}


def test_defaults_are_pinned() -> None:
    assert (DEFAULT_HORIZON_S, DEFAULT_MISS) == (600.0, 0.2)


def test_the_poisson_quantile() -> None:
    # Poisson(1): P(0) = P(1) = 0.368, P(2) = 0.184. Keeping 1 misses 1 - 0.736 = 0.264 > 0.2;
    # keeping 2 misses 0.080.
    assert poisson_quantile(1.0, 0.2, 10) == 2
    # Poisson(0.5): P(0) = 0.607, P(1) = 0.303: 1 misses 0.090.
    assert poisson_quantile(0.5, 0.2, 10) == 1
    # Poisson(0.2): none kept misses 1 - 0.819 = 0.181 <= 0.2.
    assert poisson_quantile(0.2, 0.2, 10) == 0
    assert poisson_quantile(50.0, 0.2, 4) == 4  # capped


def test_each_option_gets_its_quantile_when_budget_and_capacity_allow() -> None:
    plan = plan_prestart([ONE, SHARE, FOUR], budget=100, free=FREE, queued=())
    assert [(t.key, t.count, t.reason) for t in plan] == [
        (ONE.key, 2, PrestartReason.FORECAST),
        (SHARE.key, 1, PrestartReason.FORECAST),
        (FOUR.key, 1, PrestartReason.FORECAST),
    ]


def test_a_small_budget_goes_to_the_likeliest_spawns_first() -> None:
    # Next-environment use probabilities: ONE#1 P(N>=1) = 0.632, SHARE#1 and FOUR#1 0.393 (the
    # cheaper first), ONE#2 P(N>=2) = 0.264. Budget 2.25: ONE#1 (1.25 left), SHARE#1 (1.0
    # left), FOUR#1 costs 4: no; ONE#2 (0 left).
    plan = plan_prestart([ONE, SHARE, FOUR], budget=2.25, free=FREE, queued=())
    assert [(t.count, t.reason) for t in plan] == [
        (2, PrestartReason.FORECAST),
        (1, PrestartReason.FORECAST),
        (0, PrestartReason.BUDGET),
    ]


def test_never_more_than_the_free_capacity_and_none_for_a_queued_flavor() -> None:
    plan = plan_prestart([ONE, SHARE, FOUR], budget=100, free={H100: 1.0, "T4/share": 4}, queued=())
    assert [(t.count, t.reason) for t in plan] == [
        (1, PrestartReason.CAPACITY),
        (1, PrestartReason.FORECAST),
        (0, PrestartReason.CAPACITY),
    ]
    plan = plan_prestart([ONE, SHARE, FOUR], budget=100, free=FREE, queued={H100})
    assert [(t.count, t.reason) for t in plan] == [
        (0, PrestartReason.QUEUED),
        (1, PrestartReason.FORECAST),
        (0, PrestartReason.QUEUED),
    ]


def test_no_demand_keeps_nothing() -> None:
    idle = PrestartOption("cpu", "cpu", 0.0, 0.0)
    (t,) = plan_prestart([idle], budget=10, free={}, queued=())
    assert (t.count, t.reason) == (0, PrestartReason.NO_DEMAND)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"budget": -1.0}, "budget"),
        ({"budget": math.nan}, "budget"),
        ({"horizon_s": 0.0}, "horizon_s"),
        ({"miss": 1.0}, "miss"),
        ({"max_per_option": 65}, "max_per_option"),
    ],
)
def test_bad_arguments_name_the_field(kw: dict[str, float], field: str) -> None:
    args: dict[str, object] = {"budget": 1.0, "free": {}, "queued": (), **kw}
    with pytest.raises(InvalidRequest) as err:
        plan_prestart([ONE], **args)  # type: ignore[arg-type]
    assert err.value.field == field
    with pytest.raises(InvalidRequest, match="spawns_per_hour"):
        PrestartOption("x", H100, 1.0, -1.0)
    with pytest.raises(InvalidRequest, match="distinct keys"):
        plan_prestart([ONE, ONE], budget=1, free={}, queued=())


option = st.builds(
    PrestartOption,
    key=st.sampled_from(["a", "b", "c", "d", "e"]),
    flavor=st.sampled_from(["H100-80GB", "T4/share", "cpu"]),
    cost=st.sampled_from([0.0, 0.25, 1.0, 4.0]),
    spawns_per_hour=st.floats(0, 120),
)


@given(
    options=st.lists(option, max_size=5, unique_by=lambda o: o.key),
    budget=st.floats(0, 20),
    free=st.dictionaries(st.sampled_from(["H100-80GB", "T4/share"]), st.floats(0, 16)),
    queued=st.sets(st.sampled_from(["H100-80GB", "T4/share"])),
)
def test_never_over_budget_free_capacity_or_a_queue(
    options: list[PrestartOption],
    budget: float,
    free: dict[str, float],
    queued: set[str],
) -> None:
    plan = plan_prestart(options, budget=budget, free=free, queued=queued)
    by_key = {o.key: o for o in options}
    assert sum(by_key[t.key].cost * t.count for t in plan) <= budget + 1e-6
    for flavor in free:
        held = sum(by_key[t.key].cost * t.count for t in plan if by_key[t.key].flavor == flavor)
        assert held <= free[flavor] + 1e-6
    for t in plan:
        o = by_key[t.key]
        if o.flavor in queued and o.cost > 0:
            assert t.count == 0
        mean = o.spawns_per_hour * DEFAULT_HORIZON_S / 3600
        assert t.count <= poisson_quantile(mean, DEFAULT_MISS, 4)
