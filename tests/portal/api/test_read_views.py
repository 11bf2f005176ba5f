"""Usage and inventory views."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.portal.api.conftest import auth, gpu_request


def test_usage_shows_what_a_tenant_holds(client: TestClient) -> None:
    client.post("/api/v1/workloads", json=gpu_request(n=2), headers=auth("alice"))
    usage = client.get("/api/v1/usage", headers=auth("alice")).json()["items"]
    assert usage == [
        {
            "tenant": "team-a",
            "flavor": "H100-80GB",
            "guaranteed": 2,
            "limit": 2,
            "used": 2,
            "borrowed": 0,
            "lent": 0,
        }
    ]
    every = client.get("/api/v1/usage", headers=auth("root")).json()
    assert {u["tenant"] for u in every["items"]} == {"team-a", "team-b"}
    assert client.get("/api/v1/usage?tenant=team-b", headers=auth("alice")).status_code == 403
    assert client.get("/api/v1/usage?tenant=team-z", headers=auth("root")).status_code == 404


def test_inventory_shows_nodes_gpus_topology_and_capacity(client: TestClient) -> None:
    client.post("/api/v1/workloads", json=gpu_request(n=2), headers=auth("alice"))
    nodes = client.get("/api/v1/nodes", headers=auth("root")).json()
    (n1,) = nodes["items"]
    assert n1["name"] == "n1" and len(n1["gpus"]) == 8
    assert sum(g["free_milli"] == 1000 for g in n1["gpus"]) == 6
    assert n1["links"][0][1] == "nvswitch"
    assert client.get("/api/v1/nodes/n1", headers=auth("root")).json() == n1
    assert client.get("/api/v1/nodes/n9", headers=auth("root")).status_code == 404
    cap = client.get("/api/v1/capacity", headers=auth("root")).json()
    assert {"flavor": "H100-80GB", "capacity": 8} in cap
    assert client.get("/api/v1/nodes", headers=auth("alice")).status_code == 403


def test_unknown_paths_and_methods_get_the_error_body(client: TestClient) -> None:
    r = client.get("/api/v1/nope", headers=auth("root"))
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = client.patch("/api/v1/queue", headers=auth("root"))
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"


def test_nodes_without_topology_are_the_same_nodes_without_links_and_numa(
    client: TestClient,
) -> None:
    full = client.get("/api/v1/nodes", headers=auth("root")).json()
    lean = client.get("/api/v1/nodes?topology=false&limit=1", headers=auth("root")).json()
    (n1,) = full["items"]
    assert n1["links"] is not None and n1["numa"] is not None
    assert lean == {**full, "limit": 1, "items": [{**n1, "links": None, "numa": None}]}
    # One node's read keeps its topology: that is where an overview gets it.
    assert client.get("/api/v1/nodes/n1", headers=auth("root")).json()["links"] == n1["links"]
    bad = client.get("/api/v1/nodes?topology=maybe", headers=auth("root"))
    assert bad.status_code == 422
    assert (bad.json()["code"], bad.json()["field"]) == ("invalid", "topology")


@pytest.mark.parametrize("path", ["/usage", "/quotas", "/queue", "/workloads", "/alerts"])
def test_a_list_narrowed_to_an_unknown_tenant_is_a_404_after_the_scope_check(
    client: TestClient, path: str
) -> None:
    r = client.get(f"/api/v1{path}?tenant=team-z", headers=auth("root"))
    assert r.status_code == 404
    assert r.json() == {"status": 404, "code": "not_found", "message": "unknown tenant 'team-z'"}
    # A member of team-a learns nothing of other names: 403 whether the tenant exists or not.
    assert client.get(f"/api/v1{path}?tenant=team-z", headers=auth("alice")).status_code == 403
    assert client.get(f"/api/v1{path}?tenant=team-b", headers=auth("alice")).status_code == 403
    assert client.get(f"/api/v1{path}?tenant=team-a", headers=auth("alice")).status_code == 200
