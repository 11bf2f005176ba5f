"""Every list route pages and filters the same way — generated from the OpenAPI document, so
a new list route is held to the contract without a test of its own.

A list route answers a ``Page_*`` schema (``items``, ``total``, ``limit``, ``offset``,
``next_offset``); routes answering a bare JSON array must be named in ``UNPAGED`` with why.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadRequest
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.api.schemas import MAX_PAGE
from portal.jobs.controller import JobController
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx
from tests.portal.api.conftest import service_body
from tests.portal.api.test_auth_coverage import RAY_BODY, fill
from tests.portal.jobs.conftest import FakeRunner, job, make_backend

UNPAGED = {
    "/api/v1/capacity": "one entry per flavor in the inventory: a handful",
    "/api/v1/tenants/{tenant}/offers": "one entry per flavor a tenant may ask for",
}

ROOT = Caller("ops", CallerKind.SERVICE, frozenset({Scope.ADMIN.value}))
MEMBER = Caller(
    "alice",
    CallerKind.USER,
    frozenset(f"{s.value}!group=team-a" for s in Scope if s is not Scope.ADMIN),
    frozenset({"team-a"}),
)
ROOT_H = {"Authorization": "token root"}


@pytest.fixture
def app(tmp_path: Path) -> Iterator[FastAPI]:
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([hgx("n1"), hgx("n2")])
    for tenant in ("team-a", "team-b"):
        alloc.set_tenant(tenant)
        alloc.set_quota(tenant, "H100-80GB", guaranteed=4, limit=8)
        alloc.set_quota(tenant, "H100-80GB/3g.40gb", guaranteed=0, limit=2)
    for i, (tenant, n) in enumerate((("team-a", 2), ("team-a", 4), ("team-b", 8), ("team-b", 8))):
        dev = DeviceRequest(kind=FlavorKind.GPU, count=n)
        alloc.request(WorkloadRequest(tenant, "u", f"w{i}", dev))  # the last one queues
    # A job with one attempt, so that its attempts are listed too (a stand-in runner).
    jobs = JobController(alloc, backend=make_backend(FakeRunner(tmp_path)))
    jobs.start()
    jobs.submit(job(members=1, gpus=1))
    app = create_app(
        alloc, StaticAuthenticator({"root": ROOT, "alice": MEMBER}), job_controller=jobs
    )
    # A service with two replicas, so that its replicas and events are listed too.
    body = service_body(min_=2, max_=2)
    assert TestClient(app).post("/api/v1/services", json=body, headers=ROOT_H).status_code == 201
    # A Ray cluster with one job on it, so that a cluster's jobs are listed too.
    client = TestClient(app)
    cluster = client.post("/api/v1/ray", json=RAY_BODY, headers=ROOT_H)
    assert cluster.status_code == 201, cluster.text
    job_on = client.post(
        f"/api/v1/ray/{cluster.json()['id']}/jobs", json={"entrypoint": "true"}, headers=ROOT_H
    )
    assert job_on.status_code == 201, job_on.text
    yield app
    store.close()


def paged_routes(app: FastAPI) -> list[tuple[str, list[str]]]:
    out = []
    for path, ops in app.openapi()["paths"].items():
        op = ops.get("get")
        if op is None:
            continue
        schema = op["responses"]["200"]["content"].get("application/json", {}).get("schema", {})
        if schema.get("type") == "array":
            assert path in UNPAGED, f"GET {path} answers a bare array: page it or say why"
        if schema.get("$ref", "").startswith("#/components/schemas/Page_"):
            out.append((path, [p["name"] for p in op.get("parameters", []) if p["in"] == "query"]))
    return out


def get(client: TestClient, path: str, token: str = "root", **params: object) -> Any:
    return client.get(path, params=params, headers={"Authorization": f"token {token}"})


def test_every_list_route_pages_the_same_way(app: FastAPI) -> None:
    routes = paged_routes(app)
    assert len(routes) >= 6
    client = TestClient(app)
    ids = {
        "workload_id": get(client, "/api/v1/workloads").json()["items"][0]["id"],
        "job_id": get(client, "/api/v1/jobs").json()["items"][0]["id"],
        "service_id": get(client, "/api/v1/services").json()["items"][0]["id"],
        "cluster_id": get(client, "/api/v1/ray").json()["items"][0]["id"],
    }
    for template, params in routes:
        path = fill(template, ids)
        assert {"limit", "offset"} <= set(params), f"{path}: {params}"
        full = get(client, path, limit=MAX_PAGE)
        assert full.status_code == 200, f"{path}: {full.text}"
        everything = full.json()
        total = everything["total"]
        assert len(everything["items"]) == total and everything["next_offset"] is None, path
        # Walking pages of one item gives every item once, in the same order.
        walked: list[Any] = []
        offset: int | None = 0
        while offset is not None:
            page = get(client, path, limit=1, offset=offset).json()
            assert len(page["items"]) <= 1 and page["total"] == total, (path, page)
            walked += page["items"]
            offset = page["next_offset"]
        assert [json.dumps(i, sort_keys=True) for i in walked] == [
            json.dumps(i, sort_keys=True) for i in everything["items"]
        ], path
        past = get(client, path, offset=total).json()
        assert (past["items"], past["next_offset"], past["total"]) == ([], None, total), path
        bads: tuple[tuple[dict[str, object], str], ...] = (
            ({"limit": 0}, "limit"),
            ({"limit": MAX_PAGE + 1}, "limit"),
            ({"offset": -1}, "offset"),
        )
        for bad, field in bads:
            r = client.get(path, params=bad, headers=ROOT_H)
            assert (r.status_code, r.json()["field"]) == (422, field), (path, bad, r.text)


def test_every_tenant_filter_keeps_to_its_tenant_and_to_what_the_caller_may_see(
    app: FastAPI,
) -> None:
    client = TestClient(app)
    filtered = [(p, q) for p, q in paged_routes(app) if "tenant" in q]
    assert {"/api/v1/quotas", "/api/v1/workloads", "/api/v1/queue", "/api/v1/usage"} <= {
        p for p, _ in filtered
    }
    for path, _ in filtered:
        for tenant in ("team-a", "team-b"):
            items = get(client, path, tenant=tenant).json()["items"]
            assert all(i.get("tenant", tenant) == tenant for i in items), (path, tenant, items)
        # A member of team-a sees team-a's items only, and may not ask for team-b's.
        mine = get(client, path, "alice")
        assert mine.status_code == 200, (path, mine.text)
        assert all(i.get("tenant", "team-a") == "team-a" for i in mine.json()["items"]), path
        theirs = get(client, path, "alice", tenant="team-b")
        assert theirs.status_code == 403, (path, theirs.text)
