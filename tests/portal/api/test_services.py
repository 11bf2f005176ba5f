"""``/api/v1/services`` over a real allocator and store, SQLite and PostgreSQL: bad input is a
422 naming the field with nothing created; every replica is a workload of kind inference
admitted against the tenant's quota (beyond it, queued with the reason); tenants cannot see
or touch each other's services."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.inference.controller import ServiceController
from portal.inference.spec import Backend
from portal.store import services as stored
from tests.portal.api.conftest import TOKENS, auth, service_body
from tests.portal.api.test_jobs import with_


@pytest.fixture
def store_url(db_url: str) -> str:
    return db_url


MIG = {"kind": "mig", "mig_profile": "3g.40gb", "models": ["H100-80GB"]}
BAD: list[tuple[str, object, str]] = [
    ("engine.preset", "llamacpp-9000", "engine.preset"),
    ("replicas", {"min": 3, "max": 2}, "replicas.max"),
    ("replicas", {"min": 1, "max": 2, "warm": 3}, "replicas.warm"),
    ("replicas", {"min": 0, "max": 0}, "replicas.max"),
    ("devices", MIG, "devices"),  # team-a has no quota for the MIG flavor
    ("devices", {"kind": "gpu", "count": 4}, "devices"),  # more than team-a's limit of 2
    ("devices", {"kind": "gpu", "count": 1, "models": ["X100-1GB"]}, "devices.models"),
    ("devices", {"kind": None}, "devices.kind"),
    ("model.uri", "ftp://host/model", "model.uri"),
    ("model.uri", "file://relative/dir", "model.uri"),
    ("model.uri", "s3://models/tiny", "model.uri"),  # the local backend fetches file or http(s)
    ("model.uri", "not a uri", "model.uri"),
    ("model.digest", "md5:0123", "model.digest"),
    ("model.digest", "sha256:" + "AB" * 32, "model.digest"),
    ("model.digest", "sha256:abc", "model.digest"),
    ("engine", {"preset": "custom"}, "engine.command"),
    ("engine", {"preset": "custom", "command": ["srv"]}, "engine.command"),
    ("engine", {"preset": "vllm", "command": ["x"]}, "engine.command"),
    ("engine", {"preset": "test", "env": {"PORT": "1"}}, "engine.env.PORT"),
    ("engine", {"preset": "test", "health_path": "health"}, "engine.health_path"),
    ("scaling", {"metric": "vibes"}, "scaling.metric"),
    ("scaling", {"target": 0}, "scaling.target"),
    ("scaling", {"idle_s": -1}, "scaling.idle_s"),
    ("scaling", {"warm_policy": "psychic"}, "scaling.warm_policy"),
    ("scaling", {"warm_policy": "forecast"}, "scaling.warm_policy"),  # replicas.warm 0: no budget
    ("hold", {"max_requests": -1}, "hold.max_requests"),
    ("name", "Bad_Name", "name"),
    ("priority", 10**9, "priority"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "value", "field"), BAD, ids=[f"{b[0]}={b[1]}" for b in BAD])
def test_bad_input_is_a_422_naming_the_field_and_creates_nothing(
    client: TestClient, allocator: Allocator, path: str, value: object, field: str
) -> None:
    r = client.post(
        "/api/v1/services", json=with_(service_body(), path, value), headers=auth("alice")
    )
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field, r.json()
    assert stored.services(allocator.store) == []
    assert allocator.workloads() == []
    assert not [e for e in allocator.store.events() if e.kind.startswith(("service.", "workload."))]


def test_no_service_id_can_be_cache_so_the_cache_listing_is_never_shadowed(
    client: TestClient, allocator: Allocator
) -> None:
    """Service ids are the 32 lowercase hex digits the portal makes: ``/services/cache`` is
    the weight cache's listing, and a segment of any other shape is a 422 naming the id,
    which changes nothing (a service named ``cache`` keeps an id of that shape)."""
    body = with_(service_body(), "name", "cache")
    made = client.post("/api/v1/services", json=body, headers=auth("alice")).json()
    assert re.fullmatch(r"[0-9a-f]{32}", made["id"]), made
    r = client.get("/api/v1/services/cache", headers=auth("alice"))
    assert r.status_code == 200, r.text
    assert r.json()["items"] == []  # no backend here keeps a weight cache
    before = stored.services(allocator.store)
    for method, path in [
        ("PATCH", "cache"),
        ("DELETE", "cache"),
        ("GET", "cache/replicas"),
        ("GET", "CACHE"),
        ("GET", made["id"].upper()),
        ("DELETE", made["id"] + "0"),
        ("DELETE", made["id"][:-1]),
    ]:
        r = client.request(
            method,
            f"/api/v1/services/{path}",
            json={"replicas": {"min": 0, "max": 1}} if method == "PATCH" else None,
            headers=auth("alice"),
        )
        assert (r.status_code, r.json()["field"]) == (422, "service_id"), (method, path, r.text)
        assert "32 lowercase hex digits" in r.json()["valid"], r.json()
    assert stored.services(allocator.store) == before
    r = client.get(f"/api/v1/services/{made['id']}", headers=auth("alice"))
    assert (r.status_code, r.json()["name"]) == (200, "cache")


def test_a_name_is_unique_in_the_tenant(client: TestClient, allocator: Allocator) -> None:
    assert (
        client.post("/api/v1/services", json=service_body(), headers=auth("alice")).status_code
        == 201
    )
    r = client.post("/api/v1/services", json=service_body(), headers=auth("alice"))
    assert (r.status_code, r.json()["field"]) == (422, "name")
    # Another tenant may use the same name.
    assert (
        client.post(
            "/api/v1/services", json=service_body("team-b"), headers=auth("bob")
        ).status_code
        == 201
    )
    assert len(stored.services(allocator.store)) == 2


def test_the_warm_policy_is_shown_and_a_bad_one_changes_nothing(client: TestClient) -> None:
    body = service_body()
    body["replicas"] = {"min": 0, "max": 2, "warm": 1}
    body["scaling"] = {"warm_policy": "forecast"}
    r = client.post("/api/v1/services", json=body, headers=auth("alice"))
    assert r.status_code == 201, r.text
    made = r.json()
    # Nothing planned yet (the prewarm loop has not run): no plan, the floor of 0 warm.
    assert made["spec"]["scaling"]["warm_policy"] == "forecast" and made["warm_plan"] is None
    assert made["replicas"] == []
    url = f"/api/v1/services/{made['id']}"
    r = client.patch(url, json={"scaling": {"warm_policy": "sometimes"}}, headers=auth("alice"))
    assert (r.status_code, r.json()["field"]) == (422, "scaling.warm_policy")
    assert client.get(url, headers=auth("alice")).json()["spec"] == made["spec"]


def test_each_replica_is_an_inference_workload_and_beyond_quota_waits_with_the_reason(
    client: TestClient, allocator: Allocator
) -> None:
    r = client.post("/api/v1/services", json=service_body(min_=1, max_=3), headers=auth("alice"))
    assert r.status_code == 201, r.text
    svc = r.json()
    assert (svc["state"], svc["desired"], svc["gateway"]) == ("active", 1, "gateway/team-a/llm/v1")
    (rep,) = svc["replicas"]
    assert rep["state"] == "queued"  # placed; no backend here launches it
    assert (rep["workload"]["kind"], rep["workload"]["state"]) == ("inference", "running")
    # Three replicas on team-a's limit of 2 GPUs: the third waits for quota, holding nothing.
    r = client.patch(
        f"/api/v1/services/{svc['id']}",
        json={"replicas": {"min": 3, "max": 3}},
        headers=auth("alice"),
    )
    assert r.status_code == 200, r.text
    reps = r.json()["replicas"]
    assert [x["workload"]["state"] for x in reps] == ["running", "running", "queued"]
    assert (reps[2]["workload"]["reason"], reps[2]["workload"]["allocations"]) == ("quota", [])
    assert r.json()["desired"] == 3
    used = [w for w in allocator.workloads("team-a") if w.allocations]
    assert len(used) == 2
    # Scaling down stops the queued one first.
    r = client.patch(
        f"/api/v1/services/{svc['id']}",
        json={"replicas": {"min": 1, "max": 2}},
        headers=auth("alice"),
    )
    assert [x["number"] for x in r.json()["replicas"]] == [1, 2]
    assert r.json()["desired"] == 2
    kinds = [
        e["kind"]
        for e in client.get(f"/api/v1/services/{svc['id']}/events", headers=auth("alice")).json()[
            "items"
        ]
    ]
    assert kinds[:2] == ["service.deployed", "service.replica_requested"]
    assert "service.scaled" in kinds and "service.replica_ended" in kinds
    gone = client.delete(f"/api/v1/services/{svc['id']}", headers=auth("alice")).json()
    assert (gone["state"], gone["replicas"]) == ("deleted", [])
    assert allocator.workloads("team-a") == []
    every = client.get(f"/api/v1/services/{svc['id']}/replicas", headers=auth("alice")).json()[
        "items"
    ]
    assert [x["state"] for x in every] == ["ended"] * 3


def test_another_tenant_gets_403_and_sees_nothing(client: TestClient, allocator: Allocator) -> None:
    sid = client.post("/api/v1/services", json=service_body(), headers=auth("alice")).json()["id"]
    for method, path, body in [
        ("GET", f"/api/v1/services/{sid}", None),
        ("PATCH", f"/api/v1/services/{sid}", {"replicas": {"min": 0, "max": 1}}),
        ("DELETE", f"/api/v1/services/{sid}", None),
        ("GET", f"/api/v1/services/{sid}/replicas", None),
        ("GET", f"/api/v1/services/{sid}/events", None),
        ("GET", f"/api/v1/services/{sid}/logs", None),
    ]:
        r = client.request(method, path, json=body, headers=auth("bob"))
        assert r.status_code == 403, (method, path, r.text)
    assert client.get("/api/v1/services", headers=auth("bob")).json()["items"] == []
    assert client.get("/api/v1/services?tenant=team-a", headers=auth("bob")).status_code == 403
    # Nothing changed: still one replica, active.
    (svc,) = stored.services(allocator.store)
    assert (svc.state.value, svc.desired) == ("active", 1)
    # A member deploying for a tenant they are not in is refused too.
    r = client.post("/api/v1/services", json=service_body("team-a", "other"), headers=auth("bob"))
    assert r.status_code == 403


def test_a_kubernetes_service_may_name_a_remote_model(allocator: Allocator) -> None:
    app = create_app(
        allocator,
        StaticAuthenticator(TOKENS),
        service_controller=ServiceController(allocator, kind=Backend.KUBERNETES),
    )
    body = with_(service_body(), "model.uri", "hf://org/tiny-llm")
    with TestClient(app) as client:
        assert client.post("/api/v1/services", json=body, headers=auth("alice")).status_code == 201
