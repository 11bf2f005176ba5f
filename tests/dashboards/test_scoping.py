"""Scoping: each viewer's pages and data requests show only what their scopes allow; the quota
editor is only for quota writers."""

from __future__ import annotations

import panel as pn

from dashboards.app import build_view
from dashboards.stores import QuotaDraft, TenantStore, views_for
from dashboards.tenant import TenantView
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import VIEWERS


def rendered(view: object) -> str:
    """Every property value of the Bokeh models a view renders to: texts, options, plot data."""
    root = pn.panel(view).get_root()  # type: ignore[attr-defined]
    parts: list[str] = []
    for model in root.references():
        for value in model.properties_with_values(include_defaults=False).values():
            parts.append(str(value))
    return "\n".join(parts)


def test_landing_offers_the_views_each_viewers_scopes_open() -> None:
    offered = {t: [view.name for view in views_for(v)] for t, v in VIEWERS.items()}
    assert offered == {
        "tok-alice": ["my_work", "tenant"],
        "tok-bob": ["my_work", "tenant"],
        "tok-anna": ["my_work", "tenant", "cost"],
        "tok-lead": ["my_work", "tenant", "cost"],
        "tok-ops": ["cluster"],
        "tok-mia": ["my_work", "tenant", "cluster"],
        "tok-root": ["my_work", "tenant", "cluster", "cost"],
    }


def test_tenant_admin_sees_nothing_of_another_tenant(portal: Portal) -> None:
    anna = VIEWERS["tok-anna"]
    texts = []
    for view in views_for(anna):
        page = build_view(view.name, portal.source("tok-anna"), anna, {})
        assert all(s.error == "" for s in page.stores), view.name
        texts.append(rendered(page.view))
    shown = "\n".join(texts)
    assert "team-a" in shown and "482.40" in shown
    assert "team-b" not in shown and "nb-bob" not in shown and "198.86" not in shown
    seen = portal.seen("tok-anna")
    assert len(seen) >= 7  # workloads, tenant (usage, quotas, queue), cost (3 reports, budgets)
    for exchange in seen:
        assert "team-b" not in exchange.path + exchange.query, exchange
        assert b"team-b" not in exchange.body, exchange
        assert b"bob" not in exchange.body, exchange


def test_a_tenant_admin_cannot_ask_for_another_tenant(portal: Portal) -> None:
    anna = VIEWERS["tok-anna"]
    page = build_view("tenant", portal.source("tok-anna"), anna, {"tenant": "team-b"})
    assert "team-b" not in rendered(page.view)
    assert all("team-b" not in e.query for e in portal.seen("tok-anna"))


def test_leadership_sees_every_tenant_read_only(portal: Portal) -> None:
    lead = VIEWERS["tok-lead"]
    page = build_view("tenant", portal.source("tok-lead"), lead, {"tenant": "team-b"})
    text = rendered(page.view)
    assert "team-a" in text and "team-b" in text  # the tenant picker offers both
    assert "train-b" in text  # team-b's queue
    assert "Save quota" not in text
    cost = rendered(build_view("cost", portal.source("tok-lead"), lead, {}).view)
    assert "482.40" in cost and "198.86" in cost
    assert all(e.method == "GET" for e in portal.seen("tok-lead"))


def test_a_member_cannot_open_the_quota_editor(portal: Portal) -> None:
    alice = VIEWERS["tok-alice"]
    store = TenantStore(portal.source("tok-alice"), tenant="team-a")
    store.refresh()
    view = TenantView(store, alice)
    assert view.editor is None
    text = rendered(view)
    assert "Save quota" not in text
    assert "Changing quotas needs the tenant admin role of team-a" in text
    assert "Save quota" in rendered(TenantView(store, VIEWERS["tok-anna"]))


def test_a_members_save_is_refused_by_the_portal_and_changes_nothing(portal: Portal) -> None:
    store = TenantStore(portal.source("tok-alice"), tenant="team-a")
    store.refresh()
    assert not store.save(QuotaDraft("H100-80GB", guaranteed=8, limit=16, budget_gpu_hours=None))
    assert store.message.startswith("not saved: ")
    assert store.message == "not saved: your roles do not let you change quotas"
    q = next(q for q in portal.allocator.quotas("team-a") if q.flavor == "H100-80GB")
    assert (q.guaranteed, q.limit) == (4, 8)


def test_a_member_is_told_in_words_what_is_left_out_not_in_red(portal: Portal) -> None:
    bob = VIEWERS["tok-bob"]
    page = build_view("tenant", portal.source("tok-bob"), bob, {})
    (note,) = [
        a for a in pn.panel(page.view).select(pn.pane.Alert) if a.object.startswith("not shown")
    ]
    assert note.object == (
        "not shown: GPU-hours and efficiency (your roles do not let you read cost)"
    )
    assert note.alert_type == "info"  # nothing failed: the part is not theirs
    assert "custom:gpuportal" not in rendered(page.view)
