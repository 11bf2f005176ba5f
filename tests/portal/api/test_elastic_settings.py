"""Per-tenant elastic-job settings through the API: stored, versioned, bounded by the
platform admin's limits, tenant-scoped, and kept across a restart (a new app and job
controller over the same database)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from policies.elastic import DEFAULT_IDLE_S, DEFAULT_THRESHOLD, ElasticSettings
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.jobs.controller import JobController
from tests.portal.api.conftest import TOKENS, auth

URL = "/api/v1/tenants/team-a/elastic"


def test_defaults_until_set_then_a_platform_admin_sets_limits_and_settings(
    client: TestClient, allocator: Allocator
) -> None:
    r = client.get(URL, headers=auth("alice"))
    assert r.status_code == 200 and r.headers["ETag"] == '"0"'
    assert (r.json()["threshold"], r.json()["idle_s"]) == (DEFAULT_THRESHOLD, DEFAULT_IDLE_S)
    body = {"threshold": 0.7, "window_s": 120, "limits": {"min_threshold": 0.6, "max_idle_s": 900}}
    r = client.put(URL, json=body, headers={**auth("root"), "If-None-Match": "*"})
    assert r.status_code == 200, r.text
    assert r.headers["ETag"] == '"1"'
    assert r.json()["limits"]["min_threshold"] == 0.6
    # A restart: a new controller and app over the same database read what was stored.
    restarted = TestClient(create_app(allocator, StaticAuthenticator(TOKENS)))
    again = restarted.get(URL, headers=auth("anna")).json()
    assert (again["threshold"], again["window_s"], again["version"]) == (0.7, 120.0, 1)
    assert JobController(allocator).elastic.settings("team-a") == ElasticSettings(
        threshold=0.7, window_s=120
    )


def test_a_tenant_admin_edits_within_the_limits_only(
    client: TestClient, allocator: Allocator
) -> None:
    limits = {"min_threshold": 0.6, "max_idle_s": 900}
    root = {**auth("root"), "If-None-Match": "*"}
    assert client.put(URL, json={"limits": limits, "idle_s": 600}, headers=root).status_code == 200
    anna = {**auth("anna"), "If-Match": '"1"'}
    low = client.put(URL, json={"threshold": 0.5, "idle_s": 600}, headers=anna)
    assert low.status_code == 403 and "0.6" in low.json()["message"]
    long = client.put(URL, json={"idle_s": 1800}, headers=anna)
    assert long.status_code == 403 and "elastic.idle_s" in long.json()["message"]
    own = client.put(URL, json={"idle_s": 600, "limits": {}}, headers=anna)
    assert own.status_code == 403 and "platform admin" in own.json()["message"]
    ok = client.put(URL, json={"threshold": 0.65, "idle_s": 300}, headers=anna)
    assert ok.status_code == 200 and ok.json()["limits"]["max_idle_s"] == 900  # kept
    stale = client.put(
        URL, json={"threshold": 0.9, "idle_s": 600}, headers=anna
    )  # still If-Match "1"
    assert stale.status_code == 412
    stored = client.get(URL, headers=auth("alice")).json()
    assert (stored["threshold"], stored["idle_s"], stored["version"]) == (0.65, 300.0, 2)


def test_another_tenants_admin_and_members_are_refused(client: TestClient) -> None:
    other = "/api/v1/tenants/team-b/elastic"
    assert client.get(other, headers=auth("anna")).status_code == 403
    put = client.put(other, json={}, headers={**auth("anna"), "If-None-Match": "*"})
    assert put.status_code == 403
    member = client.put(URL, json={}, headers={**auth("alice"), "If-None-Match": "*"})
    assert member.status_code == 403
    assert client.get(other, headers=auth("root")).json()["version"] == 0


def test_bad_values_are_422_naming_the_field_and_change_nothing(client: TestClient) -> None:
    root = {**auth("root"), "If-None-Match": "*"}
    for body, field in (
        ({"threshold": 1.5}, "threshold"),
        ({"window_s": -1}, "window_s"),
        ({"idle_s": "600"}, "idle_s"),
        ({"limits": {"max_idle_s": 1e12}}, "max_idle_s"),
        ({"threshold": 0.5, "idle_below": 0.6}, "elastic.idle_below"),
        ({"grow": True}, "grow"),
    ):
        r = client.put(URL, json=body, headers=root)
        assert r.status_code == 422, body
        assert field in r.json()["field"], (body, r.json())
    assert client.get(URL, headers=auth("root")).json()["version"] == 0
    missing = client.get("/api/v1/tenants/team-z/elastic", headers=auth("root"))
    assert missing.status_code == 404
