"""The quota editor: a valid edit round-trips through the portal (with the ETag) and shows in
the Tenant view; an invalid one says why and sends nothing."""

from __future__ import annotations

from dashboards.stores import TenantStore
from dashboards.tenant import QuotaEditor
from tests.dashboards.conftest import Portal


def editor_for(portal: Portal, token: str = "tok-anna") -> QuotaEditor:
    store = TenantStore(portal.source(token), tenant="team-a")
    store.refresh()
    editor = QuotaEditor(store)
    editor.flavor.value = "H100-80GB"
    return editor


def h100(portal: Portal) -> tuple[int, int, float | None]:
    q = next(q for q in portal.allocator.quotas("team-a") if q.flavor == "H100-80GB")
    return q.guaranteed, q.limit, q.budget_gpu_hours


def puts(portal: Portal) -> list[str]:
    return [e.path for e in portal.seen("tok-anna") if e.method == "PUT"]


def test_the_editor_starts_from_the_current_quota(portal: Portal) -> None:
    e = editor_for(portal)
    assert (e.guaranteed.value, e.limit.value, e.budget.value) == (4, 8, "")
    e.flavor.value = "T4/share"
    assert (e.guaranteed.value, e.limit.value) == (500, 1000)


def test_a_valid_edit_round_trips_through_the_portal(portal: Portal) -> None:
    e = editor_for(portal)
    e.guaranteed.value, e.limit.value, e.budget.value = 3, 6, "1200"
    assert e.save()
    assert h100(portal) == (3, 6, 1200.0)
    assert puts(portal) == ["/api/v1/tenants/team-a/quotas/H100-80GB"]
    assert e.store.message == "saved H100-80GB: guaranteed 3, limit 6 (version 2)"
    # The store re-read the tenant: bars and the editor show the new quota.
    assert ("H100-80GB", "limit", 6) in e.store.bars()
    assert ("H100-80GB", "borrowed", 2) in e.store.bars()  # 5 in use, 3 guaranteed
    q = e.store.quota("H100-80GB")
    assert q is not None
    assert (q.tenant, q.flavor, q.guaranteed, q.limit, q.budget_gpu_hours, q.version) == (
        "team-a",
        "H100-80GB",
        3,
        6,
        1200.0,
        2,
    )


def test_the_preview_tells_what_would_be_reclaimed(portal: Portal) -> None:
    e = editor_for(portal)
    e.guaranteed.value, e.limit.value = 2, 4
    text = e.preview()
    assert "1 of 5 units in use are over the new limit 4" in text
    assert "2 units now within guaranteed become borrowed" in text
    e.limit.value = 7
    assert "2 units left under the new limit (5 in use)" in e.preview()


def test_limit_below_guaranteed_is_refused_here(portal: Portal) -> None:
    e = editor_for(portal)
    e.guaranteed.value, e.limit.value = 6, 5
    assert "invalid limit 5: expected at least guaranteed (6)" in e.preview()
    assert not e.save()
    assert e.store.message == "invalid limit 5: expected at least guaranteed (6)"
    assert h100(portal) == (4, 8, None)
    assert puts(portal) == []


def test_a_negative_guaranteed_is_refused_here(portal: Portal) -> None:
    e = editor_for(portal)
    e.guaranteed.value = -1
    assert not e.save()
    assert e.store.message == "invalid guaranteed -1: expected a whole number 0..10,000,000"
    assert h100(portal) == (4, 8, None)
    assert puts(portal) == []


def test_a_budget_that_is_not_a_number_is_refused_here(portal: Portal) -> None:
    e = editor_for(portal)
    e.budget.value = "lots"
    assert not e.save()
    assert e.store.message == (
        "invalid budget_gpu_hours 'lots': expected a number of GPU-hours, or empty"
    )
    assert puts(portal) == []


def test_a_stale_etag_is_refused_by_the_portal_and_changes_nothing(portal: Portal) -> None:
    e = editor_for(portal)
    # Someone else changes the quota after the editor read it.
    portal.allocator.set_quota("team-a", "H100-80GB", guaranteed=4, limit=7)
    e.limit.value = 6
    assert not e.save()
    assert e.store.message.startswith("not saved: ")
    assert h100(portal) == (4, 7, None)
