"""Tenants and quotas: ETags, If-Match, and tenant-filtered scopes."""

from __future__ import annotations

from fastapi.testclient import TestClient

from portal.allocator import Allocator
from tests.portal.allocator.conftest import t4 as t4_node
from tests.portal.api.conftest import auth

QUOTA = "/api/v1/tenants/team-a/quotas/H100-80GB"


def test_reading_a_quota_gives_its_version_as_etag(client: TestClient) -> None:
    r = client.get(QUOTA, headers=auth("anna"))
    assert r.status_code == 200
    assert r.headers["ETag"] == '"1"' and r.json()["version"] == 1
    assert (r.json()["guaranteed"], r.json()["limit"]) == (2, 2)


def test_concurrent_quota_edits_one_wins_the_other_conflicts_and_nothing_is_lost(
    client: TestClient, allocator: Allocator
) -> None:
    etag_a = client.get(QUOTA, headers=auth("anna")).headers["ETag"]
    etag_b = client.get(QUOTA, headers=auth("root")).headers["ETag"]
    assert etag_a == etag_b == '"1"'
    win = client.put(
        QUOTA, json={"guaranteed": 2, "limit": 6}, headers={**auth("anna"), "If-Match": etag_a}
    )
    assert win.status_code == 200 and win.headers["ETag"] == '"2"'
    lose = client.put(
        QUOTA, json={"guaranteed": 1, "limit": 3}, headers={**auth("root"), "If-Match": etag_b}
    )
    assert lose.status_code == 412
    err = lose.json()
    assert err["code"] == "precondition_failed" and "version 1" in err["message"]
    # The winner's change stands; the loser re-reads and applies on top.
    (q,) = [q for q in allocator.quotas("team-a") if q.flavor == "H100-80GB"]
    assert (q.limit, q.version) == (6, 2)
    fresh = client.get(QUOTA, headers=auth("root"))
    again = client.put(
        QUOTA,
        json={"guaranteed": 1, "limit": 3},
        headers={**auth("root"), "If-Match": fresh.headers["ETag"]},
    )
    assert again.status_code == 200 and again.json()["version"] == 3


def test_an_edit_without_if_match_is_refused_and_changes_nothing(
    client: TestClient, allocator: Allocator
) -> None:
    r = client.put(QUOTA, json={"guaranteed": 0, "limit": 0}, headers=auth("anna"))
    assert r.status_code == 428 and r.json()["code"] == "precondition_required"
    bad = client.put(
        QUOTA, json={"guaranteed": 0, "limit": 0}, headers={**auth("anna"), "If-Match": "v1"}
    )
    assert bad.status_code == 422 and bad.json()["field"] == "If-Match"
    assert [q.version for q in allocator.quotas("team-a")] == [1]


def test_if_none_match_star_creates_but_never_overwrites(
    client: TestClient, allocator: Allocator
) -> None:
    allocator.set_tenant("team-c")
    url = "/api/v1/tenants/team-c/quotas/H100-80GB"
    new = {**auth("root"), "If-None-Match": "*"}
    assert client.put(url, json={"guaranteed": 0, "limit": 1}, headers=new).status_code == 200
    again = client.put(url, json={"guaranteed": 0, "limit": 2}, headers=new)
    assert again.status_code == 412
    assert again.json()["message"] == (
        "quota team-c/H100-80GB exists already (version 1): If-None-Match: * only creates; "
        'to change it, send If-Match: "1" (its ETag)'
    )
    assert [q.limit for q in allocator.quotas("team-c")] == [1]


def test_a_tenant_admin_cannot_read_or_change_another_tenants_quota(
    client: TestClient, allocator: Allocator
) -> None:
    url = "/api/v1/tenants/team-b/quotas/H100-80GB"
    assert client.get(url, headers=auth("anna")).status_code == 403
    r = client.put(
        url, json={"guaranteed": 0, "limit": 0}, headers={**auth("anna"), "If-Match": '"1"'}
    )
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    assert "team-b" in r.json()["message"]
    assert [(q.limit, q.version) for q in allocator.quotas("team-b")] == [(4, 1)]
    listed = client.get("/api/v1/quotas", headers=auth("anna")).json()
    assert {q["tenant"] for q in listed["items"]} == {"team-a"}
    assert client.get("/api/v1/quotas?tenant=team-b", headers=auth("anna")).status_code == 403


def test_a_member_reads_but_cannot_change_their_quota(client: TestClient) -> None:
    assert client.get(QUOTA, headers=auth("alice")).status_code == 200
    r = client.put(
        QUOTA, json={"guaranteed": 8, "limit": 8}, headers={**auth("alice"), "If-Match": '"1"'}
    )
    assert r.status_code == 403


def test_bad_quota_values_are_422_with_the_field(client: TestClient) -> None:
    h = {**auth("root"), "If-Match": '"1"'}
    r = client.put(QUOTA, json={"guaranteed": 3, "limit": 2}, headers=h)
    assert r.status_code == 422 and r.json()["code"] == "invalid"
    r = client.put(QUOTA, json={"guaranteed": -1, "limit": 2}, headers=h)
    assert r.status_code == 422 and r.json()["field"] == "guaranteed"


def test_tenants_are_created_and_changed_by_platform_admins_only(client: TestClient) -> None:
    create = {**auth("root"), "If-None-Match": "*"}
    r = client.put("/api/v1/tenants/team-c", json={"cohort": "c", "weight": 2}, headers=create)
    assert r.status_code == 200 and r.headers["ETag"] == '"1"'
    assert client.get("/api/v1/tenants/team-c", headers=auth("root")).json()["cohort"] == "c"
    r = client.put(
        "/api/v1/tenants/team-a", json={"weight": 5}, headers={**auth("anna"), "If-Match": '"1"'}
    )
    assert r.status_code == 403
    names = [t["name"] for t in client.get("/api/v1/tenants", headers=auth("anna")).json()["items"]]
    assert names == ["team-a"]
    bad = client.put("/api/v1/tenants/Team_C", json={}, headers=create)
    assert bad.status_code == 422 and bad.json()["code"] == "invalid"


def test_a_tenant_admin_edits_within_the_platforms_ceiling_only(
    client: TestClient, allocator: Allocator
) -> None:
    h = {**auth("anna"), "If-Match": '"1"'}
    r = client.put(QUOTA, json={"guaranteed": 5, "limit": 6}, headers=h)
    assert r.status_code == 403, r.text
    assert "ceiling for H100-80GB guaranteed is 4" in r.json()["message"]
    r = client.put(QUOTA, json={"guaranteed": 2, "limit": 7}, headers=h)
    assert r.status_code == 403 and "limit is 6" in r.json()["message"]
    for body in ({"ceiling_limit": 8}, {"overcommit": True}):
        r = client.put(QUOTA, json={"guaranteed": 2, "limit": 2, **body}, headers=h)
        assert r.status_code == 403 and "platform admin" in r.json()["message"]
    # Nothing changed; within the ceiling the edit goes through.
    assert [q.version for q in allocator.quotas("team-a")] == [1]
    ok = client.put(QUOTA, json={"guaranteed": 4, "limit": 6}, headers=h)
    assert ok.status_code == 200, ok.text
    assert (ok.json()["ceiling_guaranteed"], ok.json()["ceiling_limit"]) == (4, 6)
    # A flavor the platform gave team-a nothing of cannot be created by its admin.
    allocator.node_added(t4_node("s1"))
    t4 = client.put(
        "/api/v1/tenants/team-a/quotas/T4",
        json={"guaranteed": 0, "limit": 1},
        headers={**auth("anna"), "If-None-Match": "*"},
    )
    assert t4.status_code == 403 and "ceiling for T4 limit is 0" in t4.json()["message"]


def test_guarantees_beyond_capacity_need_the_platforms_explicit_overcommit(
    client: TestClient, allocator: Allocator
) -> None:
    # n1 has 8 H100s; team-b guarantees 2, so team-a may guarantee at most 6.
    h = {**auth("root"), "If-Match": '"1"'}
    r = client.put(QUOTA, json={"guaranteed": 7, "limit": 8}, headers=h)
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["field"] == "guaranteed"
    assert "add up to 9 on a capacity of 8" in err["message"] and "at most 6" in err["message"]
    assert [q.version for q in allocator.quotas("team-a")] == [1]
    r = client.put(QUOTA, json={"guaranteed": 7, "limit": 8, "overcommit": True}, headers=h)
    assert r.status_code == 200, r.text
    # The ceilings follow the platform's values when not given.
    assert (r.json()["ceiling_guaranteed"], r.json()["ceiling_limit"]) == (7, 8)
    # Lowering a guarantee of an over-committed flavor needs no flag.
    lower = client.put(
        QUOTA, json={"guaranteed": 6, "limit": 8}, headers={**auth("anna"), "If-Match": '"2"'}
    )
    assert lower.status_code == 200, lower.text
