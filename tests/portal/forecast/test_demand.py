"""Demand series and the capacity outlook from a real allocator's history (SQLite and
PostgreSQL), and who may read the outlook through the API.

The morning, from 09:00 (H100 node of 4 GPUs, T4 node of 2 shareable GPUs):

| tenant | flavor | held | GPU-hours in hours 9, 10, 11 |
|---|---|---|---|
| ml | H100-80GB x 1 | 09:10-10:10 | 50/60, 10/60, 0 |
| ml | T4/share 500 | 09:40-11:00 | 20/60 x 0.5, 0.5, 0 |
| team-b | H100-80GB x 2 | 10:30- (held at 11:30) | 0, 1, 1 |
| ml | H100-80GB x 4 at 10:45 | never placed (queued): no arrival | |
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from policies.errors import InvalidRequest
from policies.forecast import HOURS_PER_WEEK, Method
from portal.accounting import Accounting
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.api.cost import use_accounting
from portal.forecast import capacity_outlook, demand_series
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, share, t4, wl

NINE = datetime(2026, 11, 2, 9, tzinfo=UTC)


def at(hour: int, minute: int = 0) -> datetime:
    return NINE.replace(hour=hour, minute=minute)


@pytest.fixture
def morning(db_url: str) -> Iterator[tuple[Allocator, ManualClock]]:
    clock = ManualClock(NINE)
    store = Store(db_url)
    alloc = Allocator(store, clock=clock)
    alloc.start([hgx("n1", gpus=4), t4("s1")])
    for tenant in ("ml", "team-b"):
        alloc.set_tenant(tenant)
        alloc.set_quota(tenant, "H100-80GB", guaranteed=2, limit=4)
        alloc.set_quota(tenant, "T4/share", guaranteed=500, limit=2000)
    try:
        ids: dict[str, str] = {}
        plan = [
            (at(9, 10), "a", wl("ml", gpus(1))),
            (at(9, 40), "b", wl("ml", share(500))),
            (at(10, 10), "a", None),
            (at(10, 30), "c", wl("team-b", gpus(2))),
            (at(10, 45), "d", wl("ml", gpus(4))),
            (at(11), "b", None),
        ]
        for when, key, req in plan:
            clock.now = when
            if req is None:
                alloc.release(ids[key])
            else:
                ids[key] = alloc.request(req).id
        clock.now = at(11, 30)
        yield alloc, clock
    finally:
        store.close()


def test_series_per_tenant_and_flavor(morning: tuple[Allocator, ManualClock]) -> None:
    alloc, clock = morning
    got = {(s.tenant, s.flavor): s for s in demand_series(alloc.store, at(9), at(12), clock.now)}
    assert set(got) == {("ml", "H100-80GB"), ("ml", "T4/share"), ("team-b", "H100-80GB")}
    assert got["ml", "H100-80GB"].arrivals == (1.0, 0.0, 0.0)  # the queued 4-GPU one: none
    assert got["ml", "H100-80GB"].gpu_hours == pytest.approx((50 / 60, 10 / 60, 0.0))
    assert got["ml", "T4/share"].gpu_hours == pytest.approx((20 / 60 * 0.5, 0.5, 0.0))
    assert got["team-b", "H100-80GB"].arrivals == (0.0, 1.0, 0.0)
    assert got["team-b", "H100-80GB"].gpu_hours == pytest.approx((0.0, 1.0, 1.0))
    only = demand_series(alloc.store, at(9), at(12), clock.now, tenants={"team-b"})
    assert [(s.tenant, s.flavor) for s in only] == [("team-b", "H100-80GB")]
    with pytest.raises(InvalidRequest) as err:
        demand_series(alloc.store, at(9, 30), at(12), clock.now)
    assert err.value.field == "start"


def test_outlook_holds_demand_against_capacity_and_guarantees(
    morning: tuple[Allocator, ManualClock],
) -> None:
    alloc, clock = morning
    out = capacity_outlook(alloc.store, alloc.capacity, alloc.quotas(), clock.now, weeks=2)
    assert out.forecast_start == at(11)
    assert out.history_start == at(11) - timedelta(days=28)
    flavors = {f.flavor: f for f in out.flavors}
    h100 = flavors["H100-80GB"]
    assert (h100.capacity_gpus, h100.guaranteed_gpus) == (4.0, 4.0)
    assert flavors["T4/share"].capacity_gpus == 2.0  # two shareable T4s
    assert flavors["T4/share"].guaranteed_gpus == 1.0  # 2 x 500 milli
    # History from the first demand on: hours 9 and 10 (50/60 and 10/60 + 1 GPU-hours, one
    # arrival each), too short to smooth: their mean, every hour.
    assert h100.method is Method.MEAN and h100.season_hours is None
    assert [w.start for w in h100.weeks] == [at(11), at(11) + timedelta(weeks=1)]
    week = h100.weeks[0]
    assert week.gpu_hours == pytest.approx(HOURS_PER_WEEK * 1.0)
    assert week.peak_gpus == pytest.approx(1.0)
    assert week.arrivals == pytest.approx(HOURS_PER_WEEK * 1.0)
    # A flavor nobody used: capacity and no demand.
    assert flavors["T4"].weeks[0].gpu_hours == 0.0
    with pytest.raises(InvalidRequest) as err:
        capacity_outlook(alloc.store, alloc.capacity, alloc.quotas(), clock.now, weeks=14)
    assert err.value.field == "weeks"


def _caller(name: str, *scopes: str) -> Caller:
    return Caller(name, CallerKind.USER, frozenset(scopes), frozenset())


def test_only_leadership_and_platform_admins_read_the_outlook(
    morning: tuple[Allocator, ManualClock],
) -> None:
    alloc, clock = morning
    tokens = {
        "leader": _caller("lee", Scope.COST_READ.value),
        "admin": _caller("ada", Scope.ADMIN.value),
        "ml-admin": _caller("mia", f"{Scope.COST_READ}!group=ml"),
        "member": _caller("max", Scope.WORKLOADS_WRITE.value),
    }
    app = create_app(alloc, StaticAuthenticator(tokens))
    use_accounting(app, Accounting(alloc.store, clock=clock))
    with TestClient(app) as client:

        def get(token: str, **params: object) -> tuple[int, dict[str, object]]:
            r = client.get(
                "/api/v1/forecast/capacity",
                params=params,
                headers={"Authorization": f"token {token}"},
            )
            return r.status_code, r.json()

        status, body = get("leader", weeks=1, history_days=2)
        assert status == 200, body
        flavors = body["flavors"]
        assert isinstance(flavors, list)
        assert [f["flavor"] for f in flavors] == ["H100-80GB", "T4", "T4/share"]
        assert len(flavors[0]["weeks"]) == 1
        assert get("admin")[0] == 200
        status, body = get("ml-admin")
        assert status == 403 and "without a group filter" in str(body), body
        assert get("member")[0] == 403
        status, body = get("leader", weeks=0)
        assert status == 422 and "weeks" in str(body), body
