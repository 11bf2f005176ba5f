"""``/api/v1/ray`` over a real allocator and store, SQLite and PostgreSQL, with no process
started (the controller without a backend still holds and releases the slices): bad input is
a 422 naming the field with nothing created, growth is a charged slice of its own, and
tenants cannot see each other's clusters."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadRequest
from portal.accounting.service import Accounting
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.api.cost import use_accounting
from portal.ray.controller import RayController
from portal.ray.spec import installed_ray_version
from portal.ray.tokens import RayTokens
from portal.store import ray as stored
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import ManualClock
from tests.portal.api.conftest import TOKENS, auth, member_of, user
from tests.portal.api.test_jobs import with_


@pytest.fixture
def store_url(db_url: str) -> str:
    return db_url


def ray_body(tenant: str = "team-a", workers: int = 2, most: int = 4) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "name": "rl",
        "workers": {
            "devices": {"kind": "gpu", "count": 1, "models": ["H100-80GB"]},
            "min": workers,
            "max": most,
        },
    }


BAD: list[tuple[str, object, str]] = [
    ("workers.max", 1, "workers.max"),  # max < min (2)
    ("workers.min", -1, "workers.min"),
    ("workers.replicas", 5, "workers.replicas"),  # above max
    ("workers.max", 9, "workers.max"),  # 9 x 1 GPU: the whole cluster holds 8
    # A MIG flavor of the model: team-a has quota for whole GPUs only.
    (
        "workers.devices",
        {"kind": "mig", "mig_profile": "3g.40gb", "models": ["H100-80GB"]},
        "workers.devices.models",
    ),
    (
        "workers.devices",
        {"kind": "gpu", "count": 1, "models": ["X100-1GB"]},
        "workers.devices.models",
    ),
    ("workers.devices", {"kind": "gpu", "count": 0}, "workers.devices.count"),
    ("ray_version", "1.0.0", "ray_version"),
    ("head.cpus", 0, "head.cpus"),
    ("idle_s", -5, "idle_s"),
    ("nonsense", 1, "nonsense"),
]


@pytest.mark.parametrize(("path", "value", "field"), BAD, ids=[f"{b[0]}={b[1]}" for b in BAD])
def test_bad_input_is_a_422_naming_the_field_and_creates_nothing(
    client: TestClient, allocator: Allocator, path: str, value: object, field: str
) -> None:
    r = client.post("/api/v1/ray", json=with_(ray_body(), path, value), headers=auth("alice"))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field, r.json()
    assert stored.clusters(allocator.store) == []
    assert allocator.workloads() == []
    assert not [e for e in allocator.store.events() if e.kind.startswith(("ray.", "workload."))]


def test_autoscale_needs_room_to_grow(client: TestClient, allocator: Allocator) -> None:
    body = ray_body(most=2)
    body["workers"]["autoscale"] = True
    r = client.post("/api/v1/ray", json=body, headers=auth("alice"))
    assert (r.status_code, r.json()["field"]) == (422, "workers.autoscale"), r.text
    assert stored.clusters(allocator.store) == []
    body = ray_body(most=3)
    body["workers"]["autoscale"] = True
    r = client.post("/api/v1/ray", json=body, headers=auth("alice"))
    assert r.status_code == 201 and r.json()["spec"]["autoscale"] is True, r.text
    assert client.get(f"/api/v1/ray/{r.json()['id']}", headers=auth("alice")).json()["spec"][
        "autoscale"
    ]


def test_the_installed_version_is_the_default_and_valid(client: TestClient) -> None:
    body = with_(ray_body(), "ray_version", installed_ray_version())
    r = client.post("/api/v1/ray", json=body, headers=auth("alice"))
    assert r.status_code == 201, r.text
    assert r.json()["ray_version"] == installed_ray_version()


def test_the_first_workers_are_one_gang_and_growth_a_slice_that_waits_for_quota(
    client: TestClient, allocator: Allocator
) -> None:
    # team-a may hold 2 GPUs: the gang of 2 fits, the +2 does not.
    r = client.post("/api/v1/ray", json=ray_body(), headers=auth("alice"))
    assert r.status_code == 201, r.text
    cid = r.json()["id"]
    [gang] = r.json()["slices"]
    assert (gang["number"], gang["workers"], gang["state"]) == (1, 2, "running")
    first = allocator.status(gang["workload"]["id"])
    assert (first.kind, len(first.allocations)) == ("ray", 2)

    r = client.patch(f"/api/v1/ray/{cid}", json={"workers": 4}, headers=auth("alice"))
    assert r.status_code == 200, r.text
    gang, grown = r.json()["slices"]
    assert (grown["number"], grown["workers"], grown["state"]) == (2, 2, "queued")
    assert grown["workload"]["reason"] == "quota", grown["workload"]
    assert allocator.status(grown["workload"]["id"]).kind == "ray"
    # The running part is untouched.
    assert allocator.status(first.id).state is WorkloadState.RUNNING
    assert allocator.status(first.id).allocations == first.allocations

    # Back to 2: the waiting slice goes at once, the gang stays.
    r = client.patch(f"/api/v1/ray/{cid}", json={"workers": 2}, headers=auth("alice"))
    gang, grown = r.json()["slices"]
    assert (gang["state"], grown["state"], grown["reason"]) == (
        "running",
        "released",
        "scaled down",
    )
    assert [w.id for w in allocator.workloads()] == [first.id]

    r = client.delete(f"/api/v1/ray/{cid}", headers=auth("alice"))
    assert (r.status_code, r.json()["state"]) == (200, "stopped")
    assert allocator.workloads() == []
    assert [s["state"] for s in r.json()["slices"]] == ["released", "released"]


def test_a_shrink_releases_its_slice_in_the_same_call(
    client: TestClient, allocator: Allocator
) -> None:
    # team-b may hold 4: 2 + 2 both run; back to 2 gives the second slice back.
    r = client.post("/api/v1/ray", json=ray_body("team-b"), headers=auth("bob"))
    cid = r.json()["id"]
    r = client.patch(f"/api/v1/ray/{cid}", json={"workers": 4}, headers=auth("bob"))
    assert [s["state"] for s in r.json()["slices"]] == ["running", "running"]
    assert sum(len(w.allocations) for w in allocator.workloads("team-b")) == 4
    r = client.patch(f"/api/v1/ray/{cid}", json={"workers": 2}, headers=auth("bob"))
    assert [s["state"] for s in r.json()["slices"]] == ["running", "released"]
    assert sum(len(w.allocations) for w in allocator.workloads("team-b")) == 2


def test_scaling_outside_min_and_max_is_a_422(client: TestClient) -> None:
    cid = client.post("/api/v1/ray", json=ray_body(), headers=auth("alice")).json()["id"]
    for workers in (1, 5):
        r = client.patch(f"/api/v1/ray/{cid}", json={"workers": workers}, headers=auth("alice"))
        assert (r.status_code, r.json()["field"]) == (422, "workers"), r.text


def test_another_tenant_cannot_list_read_scale_or_delete(
    client: TestClient, allocator: Allocator
) -> None:
    cid = client.post("/api/v1/ray", json=ray_body(), headers=auth("alice")).json()["id"]
    for method, path, body in [
        ("GET", "/api/v1/ray?tenant=team-a", None),
        ("GET", "/api/v1/ray/costs?tenant=team-a", None),
        ("GET", f"/api/v1/ray/{cid}", None),
        ("GET", f"/api/v1/ray/{cid}/cost", None),
        ("GET", f"/api/v1/ray/{cid}/token", None),
        ("PATCH", f"/api/v1/ray/{cid}", {"workers": 3}),
        ("DELETE", f"/api/v1/ray/{cid}", None),
    ]:
        r = client.request(method, path, json=body, headers=auth("bob"))
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), (method, path, r.text)
    # Bob's own lists do not show it, and nothing changed.
    assert client.get("/api/v1/ray", headers=auth("bob")).json()["items"] == []
    assert client.get("/api/v1/ray/costs", headers=auth("bob")).json()["items"] == []
    [view] = client.get("/api/v1/ray", headers=auth("alice")).json()["items"]
    assert (view["id"], view["workers"], len(view["slices"])) == (cid, 2, 1)
    assert len(allocator.workloads("team-a")) == 1
    r = client.post("/api/v1/ray", json=ray_body(), headers=auth("bob"))
    assert r.status_code == 403, r.text


def test_the_token_goes_to_the_owner_and_the_tenants_admins_only(allocator: Allocator) -> None:
    keys = RayTokens("a key of the Ray token tests, 32 characters or more")
    callers = {**TOKENS, "carl": user("carl", {"team-a"}, *member_of("team-a"))}
    app = create_app(allocator, StaticAuthenticator(callers), ray_tokens=keys)
    with TestClient(app) as http:
        cid = http.post("/api/v1/ray", json=ray_body(), headers=auth("alice")).json()["id"]
        other = http.post("/api/v1/ray", json=ray_body(workers=0), headers=auth("alice"))
        # The owner, the tenant's admin (anna) and a platform admin get the same token,
        # the one the cluster's Secret holds; another cluster's is another.
        for who in ("alice", "anna", "root"):
            r = http.get(f"/api/v1/ray/{cid}/token", headers=auth(who))
            assert r.status_code == 200, (who, r.text)
            assert r.json() == {"cluster_id": cid, "auth_mode": "token", "token": keys.token(cid)}
        assert keys.token(cid) != keys.token(other.json()["id"])
        # Another member of the tenant may read the cluster but not take its token.
        assert http.get(f"/api/v1/ray/{cid}", headers=auth("carl")).status_code == 200
        r = http.get(f"/api/v1/ray/{cid}/token", headers=auth("carl"))
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), r.text
        assert "only its owner (alice)" in r.json()["message"], r.text
        r = http.get(f"/api/v1/ray/{'0' * 32}/token", headers=auth("alice"))
        assert r.status_code == 404, r.text


def test_heads_without_authentication_have_no_token(client: TestClient) -> None:
    cid = client.post("/api/v1/ray", json=ray_body(), headers=auth("alice")).json()["id"]
    r = client.get(f"/api/v1/ray/{cid}/token", headers=auth("alice"))
    assert r.json() == {"cluster_id": cid, "auth_mode": "none", "token": None}, r.text


def test_growth_the_limit_can_never_give_is_refused_and_the_count_kept(
    client: TestClient, allocator: Allocator
) -> None:
    body = with_(ray_body(workers=1), "workers.max", 4)
    cid = client.post("/api/v1/ray", json=body, headers=auth("alice")).json()["id"]
    # +3 in one slice: team-a's limit is 2.
    r = client.patch(f"/api/v1/ray/{cid}", json={"workers": 4}, headers=auth("alice"))
    assert r.status_code == 403, r.text
    view = client.get(f"/api/v1/ray/{cid}", headers=auth("alice")).json()
    assert (view["workers"], len(view["slices"])) == (1, 1)
    assert len(allocator.workloads("team-a")) == 1


def test_an_idle_cluster_gives_its_quota_back_and_resumes_through_the_queue(
    app: FastAPI, client: TestClient, allocator: Allocator
) -> None:
    rays: RayController = app.state.ray
    r = client.post("/api/v1/ray", json=ray_body(), headers=auth("alice"))
    cid = r.json()["id"]

    # Not idle: a resume is a 409 and changes nothing.
    r = client.post(f"/api/v1/ray/{cid}/resume", headers=auth("alice"))
    assert (r.status_code, r.json()["code"]) == (409, "conflict"), r.text
    assert [
        s["state"] for s in client.get(f"/api/v1/ray/{cid}", headers=auth("alice")).json()["slices"]
    ] == ["running"]

    # Released for idleness (the loop does this once the head reports every node idle):
    # every slice given back, team-a's quota free.
    rays.release_idle(cid, 60.0)
    view = client.get(f"/api/v1/ray/{cid}", headers=auth("alice")).json()
    assert (view["state"], view["workers"]) == ("idle", 2)
    assert [(s["state"], s["reason"]) for s in view["slices"]] == [("released", "idle")]
    assert allocator.workloads() == []
    assert [e.kind for e in allocator.store.events() if e.kind == "ray.idle"] == ["ray.idle"]

    # Another tenant may not resume it (403); nothing is requested.
    r = client.post(f"/api/v1/ray/{cid}/resume", headers=auth("bob"))
    assert (r.status_code, r.json()["code"]) == (403, "forbidden"), r.text
    assert allocator.workloads() == []

    # Meanwhile a notebook takes team-a's 2 GPUs: the resume waits in the queue with its reason.
    nb = allocator.request(
        WorkloadRequest(
            tenant="team-a",
            owner="alice",
            name="nb",
            devices=DeviceRequest(FlavorKind.GPU, count=2),
        )
    )
    r = client.post(f"/api/v1/ray/{cid}/resume", headers=auth("alice"))
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "queued"
    first, again = r.json()["slices"]
    assert first["state"] == "released"
    assert (again["number"], again["workers"], again["state"]) == (2, 2, "queued")
    assert again["workload"]["reason"] == "quota", again["workload"]
    # A second resume while it waits: 409, no second request.
    r = client.post(f"/api/v1/ray/{cid}/resume", headers=auth("alice"))
    assert r.status_code == 409, r.text
    assert len(allocator.workloads("team-a")) == 2

    # The notebook ends: the resumed gang is admitted.
    allocator.release(nb.id)
    rays.step()
    view = client.get(f"/api/v1/ray/{cid}", headers=auth("alice")).json()
    assert [s["state"] for s in view["slices"]] == ["released", "running"]
    assert len(allocator.status(view["slices"][1]["workload"]["id"]).allocations) == 2


def test_scaling_an_idle_cluster_sets_the_size_resume_asks_for(
    app: FastAPI, client: TestClient, allocator: Allocator
) -> None:
    rays: RayController = app.state.ray
    r = client.post("/api/v1/ray", json=ray_body("team-b"), headers=auth("bob"))
    cid = r.json()["id"]
    rays.release_idle(cid, 60.0)
    r = client.patch(f"/api/v1/ray/{cid}", json={"workers": 3}, headers=auth("bob"))
    assert (r.status_code, r.json()["state"], r.json()["workers"]) == (200, "idle", 3), r.text
    assert allocator.workloads() == []  # nothing held until resumed
    r = client.post(f"/api/v1/ray/{cid}/resume", headers=auth("bob"))
    assert [(s["workers"], s["state"]) for s in r.json()["slices"][1:]] == [
        (2, "running"),
        (1, "running"),
    ]
    assert sum(len(w.allocations) for w in allocator.workloads("team-b")) == 3


def test_the_costs_list_answers_each_clusters_cost_in_one_read(
    app: FastAPI, client: TestClient, allocator: Allocator
) -> None:
    # Held allocations are priced up to the accounting's clock: the allocator's manual one
    # here, so the list and each single read a moment later count the same hours.
    use_accounting(app, Accounting(allocator.store, clock=allocator.clock))
    clock = allocator.clock
    assert isinstance(clock, ManualClock)
    ids = [
        client.post("/api/v1/ray", json=ray_body(workers=w), headers=auth("alice")).json()["id"]
        for w in (1, 2)
    ]
    clock.advance(hours=1)
    client.delete(f"/api/v1/ray/{ids[0]}", headers=auth("alice"))
    clock.advance(hours=1)
    listed = client.get("/api/v1/ray/costs", headers=auth("alice")).json()
    assert [c["cluster_id"] for c in listed["items"]] == ids
    assert all(c["gpu_hours"] > 0 for c in listed["items"]), listed
    for item in listed["items"]:
        one = client.get(f"/api/v1/ray/{item['cluster_id']}/cost", headers=auth("alice"))
        assert item == one.json()
    # A stopped cluster only if it ended at or after ended_since (its end is in the past
    # of a time far ahead); a bad time is a 422 naming the parameter.
    later = client.get(
        "/api/v1/ray/costs", params={"ended_since": "2999-01-01T00:00:00Z"}, headers=auth("alice")
    )
    assert [c["cluster_id"] for c in later.json()["items"]] == ids[1:]
    bad = client.get(
        "/api/v1/ray/costs", params={"ended_since": "0001-01-01T00:00:00Z"}, headers=auth("alice")
    )
    assert bad.status_code == 422 and "ended_since" in bad.text, bad.text
