"""Offers, cost, chargeback, budgets, telemetry series and requests on a user's behalf."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest

from policies.errors import Forbidden, InvalidRequest
from portal.client import AsyncPortal, Portal
from tests.portal.client.conftest import Served

# The allocator's manual clock starts here (tests/portal/allocator/conftest.py).
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
T2H = datetime(2026, 11, 2, 11, 0, tzinfo=UTC)


def test_offers_say_what_a_request_would_get(portal_server: Served) -> None:
    with Portal(portal_server.url, "alice") as alice:
        alice.request("team-a", "H100-80GB", count=2)
        offers = {o.key: o for o in alice.offers("team-a")}
    one = offers["gpu:H100-80GB:1"]
    assert (one.state, one.reason, one.position) == ("queued", "quota", 1)
    assert one.devices.count == 1
    assert offers["gpu:H100-80GB:4"].state == "not_allowed"


def test_a_service_requests_for_a_user_and_a_user_may_not(portal_server: Served) -> None:
    with Portal(portal_server.url, "root") as hub:
        w = hub.request("team-a", "H100-80GB", owner="alice", idempotency_key="spawn-alice")
    assert w.owner == "alice"
    with Portal(portal_server.url, "alice") as alice, pytest.raises(Forbidden, match="owner"):
        alice.request("team-a", "H100-80GB", owner="bob")


def test_cost_chargeback_and_budgets(portal_server: Served) -> None:
    with Portal(portal_server.url, "root") as root:
        root.request("team-b", "H100-80GB", count=2)
        summary = root.cost(start=T0, end=T2H, group_by=["tenant", "flavor"])
        assert (summary.start, summary.end) == (T0, T2H)
        assert [(g.tenant, g.flavor, g.allocated_gpu_hours) for g in summary.groups] == [
            ("team-b", "H100-80GB", 4.0)
        ]
        assert summary.total.allocated_gpu_hours == 4.0
        assert summary.unpriced_models == ["H100-80GB"]
        rows = list(csv.DictReader(io.StringIO(root.chargeback(start=T0, end=T2H, step="day"))))
        assert [(r["tenant"], r["flavor"]) for r in rows] == [("team-b", "H100-80GB")]
        root.set_quota(
            "team-b", "H100-80GB", guaranteed=2, limit=4, budget_gpu_hours=100, if_match='"1"'
        )
        [budget] = root.budgets("team-b")
        assert (budget.tenant, budget.kind, budget.budget) == ("team-b", "gpu_hours", 100)
        with pytest.raises(InvalidRequest, match="end"):
            root.cost(start=T2H, end=T0)
    with Portal(portal_server.url, "alice") as alice, pytest.raises(Forbidden, match="cost"):
        alice.cost()


async def test_the_async_client_reads_the_same(portal_server: Served) -> None:
    async with AsyncPortal(portal_server.url, "root") as root:
        w = await root.request("team-b", "H100-80GB", owner="bob")
        assert w.owner == "bob"
        assert {o.key for o in await root.offers("team-b")} >= {"gpu:H100-80GB:1"}
        summary = await root.cost(start=T0, end=T2H)
        assert [(g.tenant, g.allocated_gpu_hours) for g in summary.groups] == [("team-b", 2.0)]
        assert "team-b" in await root.chargeback(start=T0, end=T2H)
        assert await root.budgets() == []
        page = await root.series(workload_id=w.id, start=T0.timestamp(), end=T2H.timestamp())
        assert [s.workload_id for s in page.series] == [w.id]
        assert page.series[0].points == []
