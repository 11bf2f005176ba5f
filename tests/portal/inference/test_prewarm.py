"""Forecast-driven warm pools over a real allocator and store, hour by hour on a manual clock.

The arrivals are the gateway's own count (``Traffic.arrived``), raised here as requests would
raise it; the rig's STAND-IN runner, probe and calls are ``test_warm_pool``'s. The forecast
is refit every three simulated days (``refit_s``) to keep the test to a few fits.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from policies.errors import InvalidRequest
from policies.prewarm import WarmReason
from policies.services import Replicas, ScalingRule, WarmPolicy
from portal.inference.autoscaler import Autoscaler
from portal.inference.prewarm import ForecastWarm, serving_floor, warm_size
from portal.inference.spec import ServiceSpec
from tests.portal.allocator.conftest import ManualClock
from tests.portal.inference.test_warm_pool import H100, Rig, live, rig, spec

__all__ = ["rig"]  # the fixture, shared with the warm pool's tests

DAY_H = 24


def forecast_spec(budget: int) -> ServiceSpec:
    s = spec(0, 2, budget)
    return replace(s, scaling=ScalingRule(target=2, warm_policy=WarmPolicy.FORECAST))


def busy(hour: int, rng: random.Random) -> int:
    """A working day: about 20 requests an hour from 08:00 to 18:00, none at night."""
    return 20 + rng.randint(-3, 3) if 8 <= hour % DAY_H < 18 else 0


def play(rig: Rig, sid: str, sizer: ForecastWarm, hours: list[int]) -> None:
    """Each hour's arrivals through the gateway's count and a round in that hour, then a
    round at the start of the hour after them."""
    clock = rig.alloc.clock
    assert isinstance(clock, ManualClock)
    traffic = rig.controller.traffic.of(sid)
    for n in hours:
        traffic.arrived += n
        sizer.run()
        clock.advance(hours=1)
    sizer.run()


def deployed(rig: Rig, days: list[int], request_s: float | None = None) -> tuple[str, ForecastWarm]:
    """A service with a forecast warm pool (budget 2) deployed at 23:00, then ``days``
    (hours from midnight) played: the clock ends at the hour after them. It is fitted after
    the first hour, then every three days: right after the third day (72 whole hours, the
    last day checked), then not again in the test."""
    clock = rig.alloc.clock
    assert isinstance(clock, ManualClock)
    clock.now = clock.now.replace(hour=23)
    sid = rig.controller.deploy(forecast_spec(2)).service.id
    if request_s is not None:
        rig.controller.traffic.of(sid).total_s.extend([request_s] * 10)
    sizer = ForecastWarm(rig.controller, refit_s=3 * DAY_H * 3600)
    play(rig, sid, sizer, [0, *days])
    return sid, sizer


def working_days(n: int, scale: int = 1) -> list[int]:
    rng = random.Random(1)
    return [scale * busy(h, rng) for h in range(n * DAY_H)]


def test_a_forecast_service_keeps_a_replica_warm_ahead_of_the_morning_only(rig: Rig) -> None:
    sid, sizer = deployed(rig, working_days(3))
    c = rig.controller
    plan = c.warm_plans[sid]
    # Midnight: the next two hours are forecast empty, the forecast is trusted.
    assert plan.reason is WarmReason.FORECAST and plan.recent_error is not None
    assert plan.recent_error <= 1 and plan.replicas == 0 and plan.budget == 2
    c.step()
    assert not live(rig, sid)
    # 07:00: 08:00 is within the two hours ahead; 20 requests need one replica (2 in flight
    # of 1 s each hold 7200 an hour), and none serves: one warm, not the whole budget.
    play(rig, sid, sizer, [0] * 7)
    assert c.warm_plans[sid].replicas == 1
    c.step()
    (one,) = live(rig, sid).values()
    assert one.pooled and one.warm
    events = [e for e in c.events(sid) if e.kind == "service.warm_planned"]
    assert events[-1].data["warm"] == 1 and "sized from the forecast" in events[-1].message
    # The first request wakes it; the next round starts no other one (one now serves),
    # before the loop has planned again.
    c.touch(sid)
    c.step()
    (woken,) = live(rig, sid).values()
    assert woken.number == one.number and not woken.pooled
    # While the forecast wants a replica, the autoscaler keeps the serving one however long
    # it idles: stopped, it would be replaced by a warm one loaded again.
    sizer.run()
    assert c.warm_plans[sid].keep_serving == 1
    rig.alloc.clock.advance(hours=1)  # type: ignore[attr-defined]
    Autoscaler(c).evaluate()
    assert c.get(sid).desired == 1


def test_a_forecast_that_was_wrong_lately_falls_back_to_the_floor_with_the_reason(
    rig: Rig,
) -> None:
    days = working_days(3)
    # The third day is upside down: busy at night, quiet by day.
    days[2 * DAY_H :] = days[2 * DAY_H + 12 :] + days[2 * DAY_H : 2 * DAY_H + 12]
    sid, sizer = deployed(rig, days)
    c = rig.controller
    play(rig, sid, sizer, [0] * 7)
    plan = c.warm_plans[sid]
    assert plan.reason is WarmReason.HIGH_ERROR and plan.recent_error is not None
    assert plan.recent_error > 1 and plan.replicas == 0
    c.step()
    assert not live(rig, sid)
    last = [e for e in c.events(sid) if e.kind == "service.warm_planned"][-1]
    assert "recent error is too high" in last.message and last.data["reason"] == "high-error"


def test_the_planned_pool_never_goes_beyond_the_budget_or_the_tenants_limit(rig: Rig) -> None:
    # Requests of 100 s: 2 in flight per replica take 72 an hour; about 200 need 3.
    sid, sizer = deployed(rig, working_days(3, scale=10), request_s=100.0)
    c = rig.controller
    play(rig, sid, sizer, [0] * 7)
    assert c.warm_plans[sid].replicas == 2  # 3 needed, the budget is 2
    c.step()
    assert len(live(rig, sid)) == 2
    rig.alloc.set_quota("team-a", H100, guaranteed=1, limit=1)
    sizer.run()
    plan = c.warm_plans[sid]
    assert plan.replicas == 1 and plan.reason is WarmReason.FORECAST
    c.step()
    kept = [r for r in live(rig, sid).values() if r.reason != "warm pool shrunk"]
    assert len(kept) == 1
    last = [e for e in c.events(sid) if e.kind == "service.warm_planned"][-1]
    assert "the tenant's limit leaves room for 1" in last.message


def test_warm_size_keeps_the_fixed_policy_and_the_floor_before_any_plan() -> None:
    assert warm_size(spec(0, 2, 2), None, 0) == 2
    assert warm_size(forecast_spec(2), None, 0) == 0
    assert serving_floor(None, 2) == 0


def test_a_service_the_forecast_expects_nothing_for_scales_to_zero(rig: Rig) -> None:
    sid, sizer = deployed(rig, working_days(3))
    c = rig.controller
    c.touch(sid)  # a request at midnight: one replica serves
    c.step()
    sizer.run()
    plan = c.warm_plans[sid]
    assert plan.reason is WarmReason.FORECAST and plan.keep_serving == 0
    rig.alloc.clock.advance(hours=1)  # type: ignore[attr-defined]
    Autoscaler(c).evaluate()
    assert c.get(sid).desired == 0


def test_a_forecast_policy_needs_a_warm_budget() -> None:
    with pytest.raises(InvalidRequest) as err:
        replace(forecast_spec(1), replicas=Replicas(min=0, max=2, warm=0))
    assert err.value.field == "scaling.warm_policy"


def test_a_spec_stored_before_warm_policies_reads_as_fixed() -> None:
    s = forecast_spec(1)
    stored = s.to_dict()
    assert stored["scaling"]["warm_policy"] == "forecast"
    assert ServiceSpec.from_dict(s.tenant, s.owner, s.name, stored) == s
    del stored["scaling"]["warm_policy"]
    old = ServiceSpec.from_dict(s.tenant, s.owner, s.name, stored)
    assert old.scaling.warm_policy is WarmPolicy.FIXED
