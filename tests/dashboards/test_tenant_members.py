"""The Tenant view's members (workloads, GPU-hours, efficiency) and alerts, read through the
portal API as each seeded viewer.

team-a has one member, alice: nb-alice (1 × H100), train-a (4 × H100) and infer-a (250 milli
of a T4), all held for the 24 hours from ``START`` to ``NOW``, so this month she holds
24 + 4 × 24 + 0.25 × 24 = **126 GPU-hours**. An agent posts nb-alice's GPU at 50 % for the last
two hours (one sample per minute): used 2 h × 1 GPU × 50 % = **1.00 GPU-hour**, efficiency
1 / 126 = **0.8 %**, and nb-alice's latest minute is 50 %. train-a and infer-a have no samples:
their utilization is not measured (not 0 %).
"""

from __future__ import annotations

from typing import cast

import pytest
from fastapi import FastAPI

from dashboards.app import build_view
from dashboards.stores import Member, TenantStore
from dashboards.tenant import TenantView
from policies.alerts.engine import Alert, AlertKey, AlertState
from portal.accounting.service import Accounting
from portal.accounting.telemetry import TelemetryUtilization
from portal.alerting.store import AlertStore
from portal.api.cost import use_accounting
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import NOW, PRICES, VIEWERS
from tests.dashboards.test_scoping import rendered
from tests.dashboards.test_telemetry import _html, gpu_of

TWO_HOURS = 120


def measure_utilization(portal: Portal) -> None:
    """Price with the telemetry roll-ups, as the service does (``portal.api.cost.configure``);
    the seeded portal prices without them."""
    store = portal.allocator.store
    accounting = Accounting(
        store, PRICES, clock=portal.clock, utilization=TelemetryUtilization(store.engine)
    )
    use_accounting(cast(FastAPI, portal.recorder.app), accounting)


def post_utilization(portal: Portal, name: str, util: float, minutes: int) -> None:
    """One sample a minute of the seeded workload ``name``'s first GPU at ``util`` %, for the
    ``minutes`` before ``NOW``, through the agents' ingest route; then rolled up."""
    _, node, gpu = gpu_of(portal, name)
    now = NOW.timestamp()
    samples = [
        {
            "gpu_uuid": gpu,
            "at": now - 60 * (minutes - m) + 30,
            "utilization_pct": util,
            "memory_used_mib": 4096.0,
            "memory_total_mib": 81920.0,
        }
        for m in range(minutes)
    ]
    portal.ingest(node, samples)
    portal.telemetry.maintain()


def save_alerts(portal: Portal) -> None:
    """An idle alert about nb-alice and quota pressure on team-a, a noisy-neighbour alert
    about nb-bob (team-b), and an XID error of a GPU (no tenant)."""
    alice_wid, _, alice_gpu = gpu_of(portal, "nb-alice")
    bob_wid, _, bob_gpu = gpu_of(portal, "nb-bob")
    now = NOW.timestamp()

    def alert(
        rule: str, scope: str, tenant: str | None, owner: str | None, wid: str, summary: str
    ) -> Alert:
        workloads = (wid,) if wid else ()
        key = AlertKey(rule, scope, wid or scope)
        return Alert(
            key, AlertState.FIRING, tenant, owner, workloads, summary, 1.0, now - 900, now - 60
        )

    AlertStore(portal.allocator.store.engine).save(
        [
            alert("idle", alice_gpu, "team-a", "alice", alice_wid, "nb-alice: GPU idle for 2 h"),
            alert("quota_pressure", "team-a", "team-a", None, "", "team-a uses 8 of its 8"),
            alert("noisy_neighbour", bob_gpu, "team-b", "bob", bob_wid, "nb-bob: slows others"),
            alert("xid", "GPU-sim-hgx-2-3", None, None, "", "XID 79: fell off the bus"),
        ]
    )


def tenant_store(portal: Portal, token: str, tenant: str) -> TenantStore:
    store = TenantStore(portal.source(token), tenant=tenant, clock=lambda: NOW.timestamp())
    store.refresh()
    assert store.error == ""
    return store


def test_members_efficiency_is_what_the_samples_imply(portal: Portal) -> None:
    measure_utilization(portal)
    # Measured pricing, but no sample of alice's yet: unknown, not 0 %.
    before = tenant_store(portal, "tok-anna", "team-a").members()
    assert before == [Member("alice", 3, 0, 5, 126.0, None, None)]

    post_utilization(portal, "nb-alice", 50.0, TWO_HOURS)
    store = tenant_store(portal, "tok-anna", "team-a")
    assert store.note == ""
    (alice,) = store.members()
    assert (alice.owner, alice.running, alice.queued, alice.whole_gpus) == ("alice", 3, 0, 5)
    assert alice.gpu_hours == pytest.approx(126.0)
    assert alice.used_gpu_hours == pytest.approx(1.0)
    assert alice.efficiency == pytest.approx(1 / 126)

    view = TenantView(store, VIEWERS["tok-anna"])
    members = _html(view.members())
    assert (
        "<tr><td>alice</td><td>3</td><td>0</td><td>5</td><td>126.0</td><td>1.00</td>"
        "<td>0.8%</td></tr>" in members
    )
    workloads = _html(view.workloads())
    assert (
        "<tr><td>nb-alice</td><td>alice</td><td>notebook</td>"
        "<td>hgx-1: GPU 0 (H100-80GB ×1)</td><td>50%</td></tr>" in workloads
    )
    for name in ("train-a", "infer-a"):
        assert f"<td>{name}</td>" in workloads
    assert workloads.count("<td>not measured</td>") == 2


def test_without_utilization_data_members_say_not_measured(portal: Portal) -> None:
    # The seeded portal prices without telemetry: GPU-hours are known, use is not.
    store = tenant_store(portal, "tok-anna", "team-a")
    assert store.members() == [Member("alice", 3, 0, 5, 126.0, None, None)]
    assert store.latest == {w.id: None for w in store.workloads}
    view = TenantView(store, VIEWERS["tok-anna"])
    assert (
        "<tr><td>alice</td><td>3</td><td>0</td><td>5</td><td>126.0</td><td>not measured</td>"
        "<td>not measured</td></tr>" in _html(view.members())
    )
    assert _html(view.workloads()).count("<td>not measured</td>") == 3


def test_queued_members_and_a_second_tenant(portal: Portal) -> None:
    # team-b: bob runs nb-bob (2 × H100) and mig-bob (an A100 1g.10gb slice, not a whole GPU),
    # and waits with train-b; 48 + 24/7 GPU-hours.
    store = tenant_store(portal, "tok-lead", "team-b")
    (bob,) = store.members()
    assert (bob.owner, bob.running, bob.queued, bob.whole_gpus) == ("bob", 2, 1, 2)
    assert bob.gpu_hours == pytest.approx(48 + 24 / 7)
    running = _html(TenantView(store, VIEWERS["tok-lead"]).workloads())
    assert "nb-bob" in running and "mig-bob" in running
    assert "train-b" not in running  # queued: in the queue table, not here


def test_the_tenant_admin_sees_the_tenants_alerts_only(portal: Portal) -> None:
    save_alerts(portal)
    store = tenant_store(portal, "tok-anna", "team-a")
    assert sorted(a.rule for a in store.alerts) == ["idle", "quota_pressure"]
    table = _html(TenantView(store, VIEWERS["tok-anna"]).alerts())
    assert (
        "<tr><td>idle</td><td>firing</td><td>alice</td><td>nb-alice: GPU idle for 2 h</td></tr>"
        in table
    )
    assert (
        "<tr><td>quota pressure</td><td>firing</td><td>—</td><td>team-a uses 8 of its 8</td></tr>"
        in table
    )
    assert "nb-bob" not in table and "XID" not in table
    # The portal filtered: the answers carried nothing of team-b.
    answers = [e for e in portal.seen("tok-anna") if e.path == "/api/v1/alerts"]
    assert answers and all("tenant=team-a" in e.query for e in answers)
    assert all(b"team-b" not in e.body and b"XID" not in e.body for e in answers)


def test_leadership_sees_one_tenants_alerts_per_page(portal: Portal) -> None:
    save_alerts(portal)
    store = tenant_store(portal, "tok-lead", "team-b")
    assert [(a.rule, a.owner) for a in store.alerts] == [("noisy_neighbour", "bob")]


def test_a_member_sees_alerts_about_their_work_and_no_cost(portal: Portal) -> None:
    save_alerts(portal)
    store = tenant_store(portal, "tok-alice", "team-a")
    # Tenant-wide alerts are for the tenant's admins; members see those about their work.
    assert [a.rule for a in store.alerts] == ["idle"]
    assert store.spend is None
    assert store.note.startswith("not shown: GPU-hours and efficiency (your roles do not let you ")
    assert "read cost" in store.note and "custom:" not in store.note
    members = _html(TenantView(store, VIEWERS["tok-alice"]).members())
    assert "<tr><td>alice</td><td>3</td><td>0</td><td>5</td></tr>" in members
    assert "efficiency" not in members


def test_tenant_admin_sees_nothing_of_another_tenant_in_members_and_alerts(
    portal: Portal,
) -> None:
    measure_utilization(portal)
    save_alerts(portal)
    post_utilization(portal, "nb-alice", 50.0, 5)
    post_utilization(portal, "nb-bob", 70.0, 5)
    anna = VIEWERS["tok-anna"]
    page = build_view("tenant", portal.source("tok-anna"), anna, {}, lambda: NOW.timestamp())
    assert all(s.error == "" for s in page.stores)
    text = rendered(page.view)
    assert "nb-alice" in text and "quota pressure" in text and "50%" in text
    for other in ("team-b", "bob", "70%", "XID"):
        assert other not in text, other
    seen = portal.seen("tok-anna")
    assert {e.path for e in seen} >= {
        "/api/v1/workloads",
        "/api/v1/cost",
        "/api/v1/telemetry/series",
        "/api/v1/alerts",
    }
    for exchange in seen:
        assert "team-b" not in exchange.query, exchange
        assert b"team-b" not in exchange.body and b"bob" not in exchange.body, exchange


def test_a_live_update_changes_only_what_changed(portal: Portal) -> None:
    store = tenant_store(portal, "tok-anna", "team-a")
    changed: list[str] = []
    data = ["usage", "quotas", "queue", "workloads", "spend", "latest", "alerts", "note"]
    store.param.watch(lambda *events: changed.extend(e.name for e in events), data)
    store.refresh()
    assert changed == []  # nothing re-renders: the quota bars are costly to redraw
    train = next(w for w in store.workloads if w.name == "train-a")
    portal.allocator.release(train.id)  # at NOW: this month's GPU-hours stay as they were
    store.refresh()
    assert sorted(changed) == ["latest", "usage", "workloads"]
    assert "train-a" not in _html(TenantView(store, VIEWERS["tok-anna"]).workloads())
