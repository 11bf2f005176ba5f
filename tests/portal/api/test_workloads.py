"""Requesting, queueing, reading and releasing workloads through the API."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from fastapi.testclient import TestClient

from portal.allocator import Allocator
from tests.portal.api.conftest import auth, gpu_request


def test_a_request_within_quota_runs_with_devices(client: TestClient) -> None:
    r = client.post("/api/v1/workloads", json=gpu_request(n=2), headers=auth("alice"))
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["state"] == "running" and body["owner"] == "alice"
    (alloc,) = body["allocations"]
    assert alloc["node"] == "n1" and len(set(alloc["gpus"])) == 2
    assert alloc["gpu_uuids"] == [f"GPU-n1-{g}" for g in alloc["gpus"]]
    assert client.get(f"/api/v1/workloads/{body['id']}", headers=auth("alice")).json() == body


def test_a_request_over_quota_is_accepted_queued_with_reason_and_position(
    client: TestClient,
) -> None:
    client.post("/api/v1/workloads", json=gpu_request(n=2), headers=auth("alice"))
    r = client.post("/api/v1/workloads", json=gpu_request(name="more"), headers=auth("alice"))
    assert r.status_code == 202, r.text
    body = r.json()
    assert (body["state"], body["reason"]) == ("queued", "quota")
    assert (body["position"], body["tenant_position"]) == (1, 1)
    assert "team-a" in body["message"] and body["allocations"] == []
    queue = client.get("/api/v1/queue", headers=auth("alice")).json()
    assert [e["workload_id"] for e in queue["items"]] == [body["id"]]
    assert queue["items"][0]["reason"] == "quota"


def test_a_retried_idempotency_key_allocates_once(client: TestClient, allocator: Allocator) -> None:
    headers = {**auth("alice"), "Idempotency-Key": "spawn-42"}
    first = client.post("/api/v1/workloads", json=gpu_request(), headers=headers)
    again = client.post("/api/v1/workloads", json=gpu_request(), headers=headers)
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    assert len(allocator.allocations()) == 1
    other = client.post(
        "/api/v1/workloads", json=gpu_request(), headers={**auth("alice"), "Idempotency-Key": "x"}
    )
    assert other.json()["id"] != first.json()["id"]
    assert len(allocator.allocations()) == 2


def test_concurrent_retries_with_one_key_allocate_once(
    client: TestClient, allocator: Allocator
) -> None:
    headers = {**auth("alice"), "Idempotency-Key": "double-click"}
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(
                lambda _: client.post("/api/v1/workloads", json=gpu_request(), headers=headers),
                range(8),
            )
        )
    assert {a.status_code for a in answers} == {201}
    assert len({a.json()["id"] for a in answers}) == 1
    assert len(allocator.allocations()) == 1


def test_a_member_cannot_charge_a_tenant_they_are_not_in(
    client: TestClient, allocator: Allocator
) -> None:
    r = client.post("/api/v1/workloads", json=gpu_request("team-b"), headers=auth("alice"))
    assert r.status_code == 403
    assert r.json()["code"] == "forbidden" and "team-b" in r.json()["message"]
    assert allocator.workloads() == []


def test_members_see_only_their_tenants_workloads_and_cannot_release_others(
    client: TestClient,
) -> None:
    a = client.post("/api/v1/workloads", json=gpu_request("team-a"), headers=auth("alice"))
    b = client.post("/api/v1/workloads", json=gpu_request("team-b"), headers=auth("bob"))
    listed = client.get("/api/v1/workloads", headers=auth("alice")).json()
    assert [w["id"] for w in listed["items"]] == [a.json()["id"]]
    assert client.get("/api/v1/workloads?tenant=team-b", headers=auth("alice")).status_code == 403
    bid = b.json()["id"]
    assert client.get(f"/api/v1/workloads/{bid}", headers=auth("alice")).status_code == 403
    assert client.delete(f"/api/v1/workloads/{bid}", headers=auth("alice")).status_code == 403
    assert client.get(f"/api/v1/workloads/{bid}", headers=auth("bob")).json()["state"] == "running"


def test_releasing_starts_the_queued_one_and_is_idempotent(client: TestClient) -> None:
    first = client.post("/api/v1/workloads", json=gpu_request(n=2), headers=auth("alice")).json()
    queued = client.post("/api/v1/workloads", json=gpu_request(), headers=auth("alice")).json()
    for _ in range(2):
        r = client.delete(f"/api/v1/workloads/{first['id']}", headers=auth("alice"))
        assert r.status_code == 200 and r.json()["state"] == "released"
    now = client.get(f"/api/v1/workloads/{queued['id']}", headers=auth("alice")).json()
    assert now["state"] == "running"


def test_lists_filter_by_state_and_page(client: TestClient) -> None:
    for i in range(3):
        client.post("/api/v1/workloads", json=gpu_request(name=f"w{i}"), headers=auth("alice"))
    running = client.get("/api/v1/workloads?state=running&limit=1", headers=auth("alice")).json()
    assert (running["total"], len(running["items"]), running["next_offset"]) == (2, 1, 1)
    last = client.get("/api/v1/workloads?state=running&offset=1", headers=auth("alice")).json()
    assert last["next_offset"] is None and last["items"][0]["id"] != running["items"][0]["id"]
    queued = client.get("/api/v1/workloads?state=queued", headers=auth("alice")).json()
    assert [w["name"] for w in queued["items"]] == ["w2"]


def test_bad_input_gets_the_error_body_and_changes_nothing(
    client: TestClient, allocator: Allocator
) -> None:
    cases = [
        {"tenant": "team-a", "name": "x", "devices": {"kind": "gpu", "count": 99}},
        {"tenant": "team-a", "name": "x", "devices": {"kind": "gpu", "count": 0}},
        {"tenant": "team-a", "name": "x", "devices": {"kind": "mig", "mig_profile": "9g.1gb"}},
        {"tenant": "team-a", "name": "", "devices": {}},
        {"tenant": "team-a"},
    ]
    for body in cases:
        r = client.post("/api/v1/workloads", json=body, headers=auth("alice"))
        assert r.status_code == 422, (body, r.text)
        err = r.json()
        assert err["status"] == 422 and err["code"] == "invalid" and err["message"]
    r = client.post("/api/v1/workloads", content=b"{not json", headers=auth("alice"))
    assert r.status_code == 422 and r.json()["code"] == "invalid"
    r = client.post("/api/v1/workloads", json=gpu_request("team-z"), headers=auth("root"))
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    assert allocator.workloads() == []


def test_an_unknown_workload_is_404_with_the_error_body(client: TestClient) -> None:
    r = client.get("/api/v1/workloads/nope", headers=auth("alice"))
    assert r.status_code == 404
    assert r.json() == {"status": 404, "code": "not_found", "message": "unknown workload 'nope'"}
