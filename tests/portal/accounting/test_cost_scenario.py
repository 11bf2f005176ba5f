"""A day of allocations through the real allocator, store and API, priced by hand to the cent.

Prices: H100-80GB 4.00 per GPU-hour until 13:00, 3.00 from 13:00; T4 0.35, then 0.55.

| who (tenant) | flavor | held | cost |
|---|---|---|---|
| alice (ml) | H100-80GB x 1 | 08:00:00.4-14:30:00.9 (floored: 08:00-14:30) | 5x4 + 1.5x3 = 24.50 |
| bob (ml) | H100-80GB/3g.40gb (3/7) | 10:00-15:30 | (3 x 4 + 2.5 x 3) x 3/7 = 58.5/7 = 8.357... |
| carol (ml) | T4/share 250 milli (1/4) | 12:00-13:20:45 | 0.35/4 + 1245/3600x0.55/4 = 0.135052... |
| dave (ml) | H100-80GB x 2 | 23:00-01:00 next day | day 1: 2 x 3.00 = 6.00; day 2: 6.00 |
| erin (team-b) | H100-80GB x 1 | 10:00-11:00 | 4.00 |

ml, day 1: 24.50 + 58.5/7 + 0.135052... + 6.00 = 38.992194... -> 38.99 (rounded from the exact
sum; the rounded lines would add up to 24.50 + 8.36 + 0.14 + 6.00 = 39.00).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from policies.alerts import BudgetBurnRule
from policies.alerts.engine import RuleContext
from policies.alerts.samples import Snapshot
from policies.inventory import GPU, Node
from policies.mig import MigInstance
from policies.pricing import UsageInterval, UtilizationSegment
from policies.topology import Topology
from portal.accounting import Accounting, price_config
from portal.accounting.history import epoch_seconds
from portal.accounting.metrics import CostCollector
from portal.alerting.service import BudgetSource
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.api.cost import use_accounting
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx, t4

S = Scope
DAY1 = datetime(2026, 11, 2, tzinfo=UTC)
DAY2 = DAY1 + timedelta(days=1)
PRICES = price_config(
    {
        "currency": "EUR",
        "prices": {
            "H100-80GB": [
                {"per_gpu_hour": "4.00"},
                {"from": "2026-11-02T13:00:00Z", "per_gpu_hour": "3.00"},
            ],
            "T4": [
                {"per_gpu_hour": "0.35"},
                {"from": "2026-11-02T13:00:00Z", "per_gpu_hour": "0.55"},
            ],
        },
        "budgets": {"ml": "1000.00"},
    }
)


def member(name: str, tenant: str) -> Caller:
    scopes = {S.WORKLOADS_WRITE.value, f"{S.WORKLOADS_READ}!group={tenant}"}
    return Caller(name, CallerKind.USER, frozenset(scopes), frozenset({tenant}))


TOKENS = {
    **{n: member(n, "ml") for n in ("alice", "bob", "carol", "dave")},
    "erin": member("erin", "team-b"),
    "ml-admin": Caller(
        "mia", CallerKind.USER, frozenset({f"{S.COST_READ}!group=ml"}), frozenset({"ml"})
    ),
    "leader": Caller("lee", CallerKind.USER, frozenset({S.COST_READ.value}), frozenset()),
}


def h100_mig(name: str) -> Node:
    layout = (MigInstance("3g.40gb", 0), MigInstance("3g.40gb", 4))
    gpu = GPU(0, "H100-80GB", 81920, uuid=f"GPU-{name}-0", mig_enabled=True, mig_layout=layout)
    return Node(
        name, (gpu,), cpu_milli=32_000, memory_mib=131_072, topology=Topology.from_numa([0])
    )


def at(hour: int, minute: int = 0, second: int = 0, micro: int = 0, day: int = 0) -> datetime:
    return DAY1 + timedelta(
        days=day, hours=hour, minutes=minute, seconds=second, microseconds=micro
    )


class Alice80:
    """Alice's GPU measured at 2 % from 08:00 to 09:00 and 80 % after; nothing else measured."""

    settle_s = 0.0

    def __init__(self) -> None:
        self.allocation_id = ""
        self.asked: list[tuple[frozenset[str], int, int]] = []

    def resolution_s(self, start: int, end: int) -> int:
        return 60

    def version(self, start: int, end: int, resolution_s: int) -> object:
        return 0  # the segments never change

    def __call__(
        self, intervals: Sequence[UsageInterval], start: int, end: int, resolution_s: int
    ) -> Iterable[UtilizationSegment]:
        self.asked.append((frozenset(iv.allocation_id for iv in intervals), start, end))
        a = self.allocation_id
        nine = epoch_seconds(at(9))
        return [
            UtilizationSegment(a, epoch_seconds(at(8)), nine, 2.0),
            UtilizationSegment(a, nine, epoch_seconds(at(14, 30)), 80.0),
        ]


@pytest.fixture
def day(db_url: str) -> Iterator[tuple[TestClient, Alice80, ManualClock]]:
    clock = ManualClock(at(7))
    store = Store(db_url)
    alloc = Allocator(store, clock=clock)
    alloc.start([hgx("n1", gpus=4), h100_mig("m1"), t4("s1")])
    for tenant in ("ml", "team-b"):
        alloc.set_tenant(tenant)
        budget = 100.0 if tenant == "ml" else None
        alloc.set_quota(tenant, "H100-80GB", guaranteed=2, limit=4, budget_gpu_hours=budget)
        alloc.set_quota(tenant, "H100-80GB/3g.40gb", guaranteed=1, limit=2)
        alloc.set_quota(tenant, "T4/share", guaranteed=1000, limit=2000)
    util = Alice80()
    app = create_app(alloc, StaticAuthenticator(TOKENS))
    use_accounting(app, Accounting(store, PRICES, utilization=util, clock=clock))
    try:
        with TestClient(app) as client:
            run_the_day(client, clock, util)
            yield client, util, clock
    finally:
        store.close()


def run_the_day(client: TestClient, clock: ManualClock, util: Alice80) -> None:
    gpu = {"kind": "gpu", "count": 1, "models": ["H100-80GB"]}
    plan = [  # (when, who, devices or None to release, workload key)
        (at(8, micro=400_000), "alice", gpu, "a"),
        (at(10), "bob", {"kind": "mig", "mig_profile": "3g.40gb", "models": ["H100-80GB"]}, "b"),
        (at(10), "erin", gpu, "e"),
        (at(11), "erin", None, "e"),
        (at(12), "carol", {"kind": "share", "milli": 250, "models": ["T4"]}, "c"),
        (at(13, 20, 45), "carol", None, "c"),
        (at(14, 30, micro=900_000), "alice", None, "a"),
        (at(15, 30), "bob", None, "b"),
        (at(23), "dave", {**gpu, "count": 2}, "d"),
        (at(1, day=1), "dave", None, "d"),
    ]
    ids: dict[str, str] = {}
    for when, who, devices, key in plan:
        clock.now = when
        headers = {"Authorization": f"token {who}"}
        if devices is None:
            r = client.delete(f"/api/v1/workloads/{ids[key]}", headers=headers)
            assert r.status_code == 200, r.text
            continue
        tenant = "team-b" if who == "erin" else "ml"
        body = {"tenant": tenant, "name": key, "devices": devices}
        r = client.post("/api/v1/workloads", json=body, headers=headers)
        assert r.status_code == 201, r.text
        ids[key] = r.json()["id"]
        if key == "a":
            util.allocation_id = r.json()["allocations"][0]["id"]
    clock.now = at(12, day=1)


def summary(client: TestClient, token: str, **params: object) -> dict[str, Any]:
    query = {"start": DAY1.isoformat(), "end": (DAY2 + timedelta(days=1)).isoformat(), **params}
    r = client.get("/api/v1/cost", params=query, headers={"Authorization": f"token {token}"})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def costs(body: dict[str, Any], *keys: str) -> dict[tuple[object, ...], str]:
    groups = body["groups"]
    assert isinstance(groups, list)
    return {tuple(g[k] for k in keys): g["cost"] for g in groups}


def test_a_day_of_allocations_costs_what_the_hand_computation_says(
    day: tuple[TestClient, Alice80, ManualClock],
) -> None:
    client, _, _ = day
    body = summary(client, "leader", step="day", group_by=["tenant", "period"])
    assert body["currency"] == "EUR"
    assert body["unpriced_models"] == []
    assert costs(body, "tenant", "period_start") == {
        ("ml", "2026-11-02T00:00:00Z"): "38.99",
        ("ml", "2026-11-03T00:00:00Z"): "6.00",
        ("team-b", "2026-11-02T00:00:00Z"): "4.00",
    }
    # 38.992194... + 6 + 4 = 48.992194...
    assert body["total"]["cost"] == "48.99"

    by_owner = costs(summary(client, "leader", group_by=["owner", "flavor"]), "owner", "flavor")
    assert by_owner == {
        ("alice", "H100-80GB"): "24.50",
        ("bob", "H100-80GB/3g.40gb"): "8.36",
        ("carol", "T4/share"): "0.14",
        ("dave", "H100-80GB"): "12.00",
        ("erin", "H100-80GB"): "4.00",
    }


def test_efficiency_and_idle_spend_come_from_the_utilization_source(
    day: tuple[TestClient, Alice80, ManualClock],
) -> None:
    client, util, _ = day
    body = summary(client, "leader", group_by=["owner"])
    assert body["measured"] is True
    alice = next(g for g in body["groups"] if g["owner"] == "alice")
    # 1 h at 2 % (idle: 4.00) and 5.5 h at 80 %: used 0.02 + 4.4 = 4.42 of 6.5 GPU-hours.
    assert alice["allocated_gpu_hours"] == 6.5
    assert alice["used_gpu_hours"] == pytest.approx(4.42)
    assert alice["efficiency"] == pytest.approx(4.42 / 6.5)
    assert alice["idle_cost"] == "4.00"
    bob = next(g for g in body["groups"] if g["owner"] == "bob")
    assert bob["used_gpu_hours"] == 0 and bob["idle_cost"] == "0.00"
    # Asked about Alice's allocation (in one of the parts the window is priced in).
    assert any(util.allocation_id in ids for ids, _, _ in util.asked)


def test_the_chargeback_csv_has_a_row_per_day_tenant_owner_and_flavor(
    day: tuple[TestClient, Alice80, ManualClock],
) -> None:
    client, _, _ = day
    r = client.get(
        "/api/v1/cost/chargeback",
        params={"start": DAY1.isoformat(), "end": DAY2.isoformat() + "", "step": "day"},
        headers={"Authorization": "token ml-admin"},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    got = {(row["owner"], row["flavor"]): (row["cost"], row["allocated_gpu_hours"]) for row in rows}
    # ml-admin sees only ml: no erin. Day 1 only: dave's first hour.
    assert got == {
        ("alice", "H100-80GB"): ("24.50", "6.5000"),
        ("bob", "H100-80GB/3g.40gb"): ("8.36", "2.3571"),
        ("carol", "T4/share"): ("0.14", "0.3365"),
        ("dave", "H100-80GB"): ("6.00", "2.0000"),
    }
    assert {row["currency"] for row in rows} == {"EUR"}
    assert {row["period_start"] for row in rows} == {"2026-11-02T00:00:00Z"}


def test_a_tenant_admin_sees_only_their_tenant_and_leadership_sees_all(
    day: tuple[TestClient, Alice80, ManualClock],
) -> None:
    client, _, _ = day
    assert set(costs(summary(client, "ml-admin"), "tenant")) == {("ml",)}
    assert set(costs(summary(client, "leader"), "tenant")) == {("ml",), ("team-b",)}
    h = {"Authorization": "token ml-admin"}
    for path in ("/api/v1/cost", "/api/v1/cost/chargeback", "/api/v1/cost/budgets"):
        r = client.get(path, params={"tenant": "team-b"}, headers=h)
        assert r.status_code == 403, (path, r.text)
    # A member holds no cost scope at all.
    assert client.get("/api/v1/cost", headers={"Authorization": "token alice"}).status_code == 403


def test_budgets_report_spend_burn_rate_and_forecast_to_the_month_end(
    day: tuple[TestClient, Alice80, ManualClock],
) -> None:
    client, _, _ = day
    r = client.get("/api/v1/cost/budgets", headers={"Authorization": "token leader"})
    assert r.status_code == 200, r.text
    items = {(b["kind"], b["flavor"]): b for b in r.json()["items"]}
    assert set(items) == {("money", None), ("gpu_hours", "H100-80GB")}
    # Now is 2026-11-03 12:00: 60 h into a 30-day (720 h) month.
    money = items[("money", None)]
    assert money["tenant"] == "ml" and money["budget"] == 1000.0
    spent = 38.992194940476 + 6  # ml so far, exact sum as in the module docstring
    assert money["spent"] == pytest.approx(spent)
    assert money["burn_per_hour"] == pytest.approx(spent / 60)
    assert money["projected"] == pytest.approx(spent / 60 * 720)
    assert money["over"] is False and money["exhausted_at"] is None
    # GPU-hours of H100-80GB: alice 6.5 + dave 4 = 10.5 in 60 h -> 126 projected > 100.
    gpu = items[("gpu_hours", "H100-80GB")]
    assert gpu["spent"] == pytest.approx(10.5)
    assert gpu["projected"] == pytest.approx(126.0)
    assert gpu["over"] is True
    # 100 GPU-hours at 10.5 per 60 h last 571.428... h = 2,057,142.857 s from the month start.
    assert gpu["exhausted_at"] == "2026-11-24T19:25:42Z"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"start": "2026-11-03T00:00:00Z", "end": "2026-11-02T00:00:00Z"}, "end"),
        ({"start": "1900-01-01T00:00:00Z"}, "start"),
        ({"step": "week"}, "step"),
        ({"group_by": "colour"}, "group_by"),
        ({"start": "2020-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z", "step": "day"}, "window"),
    ],
)
def test_bad_windows_get_a_clear_422(
    day: tuple[TestClient, Alice80, ManualClock], params: dict[str, str], field: str
) -> None:
    client, _, _ = day
    r = client.get("/api/v1/cost", params=params, headers={"Authorization": "token leader"})
    assert r.status_code == 422, r.text
    assert field in r.text


def test_money_budgets_feed_the_budget_burn_alert_rule(
    day: tuple[TestClient, Alice80, ManualClock],
) -> None:
    client, _, clock = day
    acc: Accounting = client.app.state.accounting  # type: ignore[attr-defined]
    source: BudgetSource = acc.budget_samples  # what the alert service takes
    rule = BudgetBurnRule()

    def fired(at: float) -> list[str]:
        ctx = RuleContext(at, Snapshot(budgets=tuple(source(at))), {}, None)
        return [c.tenant or "" for c in rule.evaluate(ctx).conditions]

    now = clock.now.timestamp()
    (sample,) = source(now)
    assert sample.tenant == "ml" and sample.budget == Decimal("1000.00")
    assert round(sample.spent, 6) == Decimal("44.992195")
    assert fired(now) == []  # 44.99 in 60 h projects 539.91 for the month: under 1000
    # A smaller budget the same spend overruns: the rule names the tenant.
    acc.prices = replace(acc.prices, budgets={"ml": Decimal("500.00")})
    assert fired(now) == ["ml"]
    # Asked as of day 1, 12:00: ml's spend until then is alice's 4 h (16.00) and bob's 2 h
    # of 3/7 of a GPU (24/7); carol starts at noon. 16 + 24/7 = 19.428571...
    (early,) = source(at(12).timestamp())
    assert round(early.spent, 6) == Decimal("19.428571")


def test_month_to_date_gauges_in_metrics_match_the_hand_computation(
    day: tuple[TestClient, Alice80, ManualClock],
) -> None:
    client, _, _ = day
    app = client.app
    acc: Accounting = app.state.accounting  # type: ignore[attr-defined]
    alloc: Allocator = app.state.allocator  # type: ignore[attr-defined]
    app.state.metrics.registry.register(CostCollector(acc, alloc.quotas))  # type: ignore[attr-defined]
    app.state.authenticator = StaticAuthenticator(  # type: ignore[attr-defined]
        {"scraper": Caller("prom", CallerKind.SERVICE, frozenset({S.METRICS_READ.value}))}
    )
    r = client.get("/metrics", headers={"Authorization": "Bearer scraper"})
    assert r.status_code == 200, r.text
    values = {
        (m.name, tuple(sorted(s.labels.items()))): s.value
        for m in text_string_to_metric_families(r.text)
        for s in m.samples
        if m.name.startswith(
            (
                "gpuportal_cost",
                "gpuportal_idle",
                "gpuportal_allocated_gpu_hours",
                "gpuportal_budget",
            )
        )
    }
    cost = "gpuportal_cost_month_to_date"
    assert values[(cost, (("currency", "EUR"), ("tenant", "ml")))] == pytest.approx(44.992194940)
    assert values[(cost, (("currency", "EUR"), ("tenant", "team-b")))] == pytest.approx(4.0)
    idle = "gpuportal_idle_cost_month_to_date"
    assert values[(idle, (("currency", "EUR"), ("tenant", "ml")))] == pytest.approx(4.0)
    hours = "gpuportal_allocated_gpu_hours_month_to_date"
    assert values[(hours, (("flavor", "H100-80GB"), ("tenant", "ml")))] == pytest.approx(10.5)
    ratio = "gpuportal_budget_projected_ratio"
    gpu_key = (("flavor", "H100-80GB"), ("kind", "gpu_hours"), ("tenant", "ml"))
    assert values[(ratio, gpu_key)] == pytest.approx(1.26)
    money_key = (("flavor", ""), ("kind", "money"), ("tenant", "ml"))
    assert values[(ratio, money_key)] == pytest.approx(44.992194940 / 60 * 720 / 1000)
