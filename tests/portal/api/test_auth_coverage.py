"""Every route checks a token and a scope: generated from the app's route table, so a new
endpoint without a check fails here."""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from portal.api.app import PUBLIC_PATHS
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from tests.portal.api.conftest import TOKENS, auth, gpu_request, job_body, service_body

# A real value for every path parameter any route uses; a new one must be added here.
PATH_VALUES = {
    "tenant": "team-a",
    "flavor": "H100-80GB",
    "node": "n1",
    "workload_id": None,
    "job_id": None,
    "service_id": None,
    "service": "called",
    "cluster_id": None,
    "ray_job_id": None,
}
RAY_BODY: dict[str, object] = {
    "tenant": "team-a",
    "name": "rl",
    "workers": {"devices": {"kind": "gpu", "count": 1}, "min": 1, "max": 2},
}
BODIES: dict[tuple[str, str], dict[str, object]] = {
    ("PUT", "/api/v1/tenants/{tenant}"): {"weight": 1.0},
    ("PUT", "/api/v1/tenants/{tenant}/quotas/{flavor}"): {"guaranteed": 1, "limit": 2},
    ("PUT", "/api/v1/tenants/{tenant}/elastic"): {"threshold": 0.9},
    ("POST", "/api/v1/workloads"): gpu_request(),
    ("POST", "/api/v1/jobs"): job_body(),
    ("POST", "/api/v1/services"): service_body(),
    ("PATCH", "/api/v1/services/{service_id}"): {"replicas": {"min": 1, "max": 1}},
    ("POST", "/gateway/{tenant}/{service}/v1/chat/completions"): {"messages": []},
    ("POST", "/gateway/{tenant}/{service}/v1/completions"): {"prompt": "x"},
    ("POST", "/api/v1/ray"): RAY_BODY,
    ("PATCH", "/api/v1/ray/{cluster_id}"): {"workers": 1},
    ("POST", "/api/v1/ray/{cluster_id}/jobs"): {"entrypoint": "true"},
    ("POST", "/api/v1/ray/jobs"): {"entrypoint": "true", "cluster": RAY_BODY},
    ("POST", "/api/v1/telemetry/samples"): {"node": "n1", "source": "nvml", "samples": []},
}
PORTAL_SCOPES = {s.value for s in Scope}


def operations(app: FastAPI) -> list[tuple[str, str, list[str]]]:
    """(method, path, scopes) of every operation the app serves, from its generated OpenAPI
    (which FastAPI builds from the route table, included routers and all)."""
    out = []
    for path, ops in app.openapi()["paths"].items():
        for method, op in ops.items():
            scopes = [s for req in op.get("security", []) for names in req.values() for s in names]
            out.append((method.upper(), path, scopes))
    return out


def fill(path: str, ids: dict[str, str]) -> str:
    """``path`` with real values: fixed ones, and the ids of things the test created."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        assert name in PATH_VALUES, f"add a real value for path parameter {name!r}"
        return PATH_VALUES[name] or ids[name]

    return re.sub(r"\{([^}]+)\}", value, path)


def test_every_operation_but_health_declares_exactly_one_portal_scope(app: FastAPI) -> None:
    ops = operations(app)
    assert len(ops) >= 15
    undeclared = [
        f"{m} {p}: {scopes}"
        for m, p, scopes in ops
        if p not in PUBLIC_PATHS and (len(scopes) != 1 or scopes[0] not in PORTAL_SCOPES)
    ]
    assert undeclared == []


def test_every_route_answers_401_without_a_valid_token_and_403_without_its_scope(
    app: FastAPI, client: TestClient
) -> None:
    wid = client.post("/api/v1/workloads", json=gpu_request(), headers=auth("alice")).json()["id"]
    jid = client.post("/api/v1/jobs", json=job_body(), headers=auth("alice")).json()["id"]
    # Held requests are refused at once (no backend runs its replicas here).
    called = {**service_body(name="called"), "hold": {"max_requests": 0}}
    client.post("/api/v1/services", json=called, headers=auth("alice"))
    first = service_body(name="first")
    sid = client.post("/api/v1/services", json=first, headers=auth("alice")).json()["id"]
    cid = client.post("/api/v1/ray", json=RAY_BODY, headers=auth("alice")).json()["id"]
    # Only an idle cluster can be resumed: one released for idleness, as the loop would.
    idle = client.post("/api/v1/ray", json=RAY_BODY, headers=auth("alice")).json()["id"]
    app.state.ray.release_idle(idle, 60.0)
    one_off = {"entrypoint": "true", "cluster": RAY_BODY}
    rjid = client.post("/api/v1/ray/jobs", json=one_off, headers=auth("alice")).json()["id"]
    # Stored elastic settings at version 1, as the admin's If-Match below expects.
    create = {**auth("root"), "If-None-Match": "*"}
    assert client.put("/api/v1/tenants/team-a/elastic", json={}, headers=create).status_code == 200
    # Required query values, real ones.
    version = client.get("/api/v1/nodes", headers=auth("root")).headers["Inventory-Version"]
    queries = {("GET", "/api/v1/inventory/changes"): {"since": version}}
    bad: list[str] = []
    checked = 0
    for method, path, scopes in operations(app):
        if path in PUBLIC_PATHS:
            continue
        checked += 1
        # Every portal scope except the route's (and admin, which implies it).
        others = frozenset(PORTAL_SCOPES - {*scopes, Scope.ADMIN.value})
        lacking = Caller("mallory", CallerKind.USER, others, frozenset({"team-a"}))
        app.state.authenticator = StaticAuthenticator({**TOKENS, "lacking": lacking})
        ray_id = idle if path.endswith("/resume") else cid
        url = fill(
            path,
            {
                "workload_id": wid,
                "job_id": jid,
                "service_id": sid,
                "cluster_id": ray_id,
                "ray_job_id": rjid,
            },
        )
        body = BODIES.get((method, path))
        query = queries.get((method, path), {})
        tries = {
            "no token": ({}, 401),
            "unknown token": (auth("expired-or-unknown"), 401),
            "bearer unknown": ({"Authorization": "Bearer nope"}, 401),
            "malformed header": ({"Authorization": "Basic abc"}, 401),
            "lacking scope": (auth("lacking"), 403),
        }
        for label, (headers, expected) in tries.items():
            r = client.request(method, url, headers=headers, json=body, params=query)
            if r.status_code != expected or r.json().get("status") != expected:
                bad.append(f"{method} {url} {label}: {r.status_code} {r.text[:120]}")
        # The same call with the right token succeeds, so the refusals above were about auth.
        r = client.request(
            method, url, headers={**auth("root"), "If-Match": '"1"'}, json=body, params=query
        )
        # Past auth, a gateway call to a service without a ready replica is a 503 (not held).
        unserved = path.startswith("/gateway/") and method == "POST" and r.status_code == 503
        if r.status_code >= 400 and not unserved:
            bad.append(f"{method} {url} with admin: {r.status_code} {r.text[:120]}")
    assert checked >= 15
    assert bad == []


def test_health_and_ready_need_no_token(client: TestClient) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {"status": "ready"}


@pytest.mark.parametrize(
    ("scopes", "tenant", "allowed"),
    [
        ({Scope.QUOTAS_WRITE.value}, "team-b", True),
        ({f"{Scope.QUOTAS_WRITE}!group=team-a"}, "team-a", True),
        ({f"{Scope.QUOTAS_WRITE}!group=team-a"}, "team-b", False),
        ({f"{Scope.QUOTAS_WRITE}!group=team-a"}, "team-ab", False),
        ({f"{Scope.QUOTAS_WRITE}!user=team-a"}, "team-a", False),
        ({f"{Scope.ADMIN}!group=team-a"}, "team-a", True),
        ({f"{Scope.ADMIN}!group=team-a"}, "team-b", False),
        ({Scope.ADMIN.value}, "team-b", True),
        ({Scope.QUOTAS_READ.value}, "team-a", False),
        ({"custom:gpuportal:quotas:write:more"}, "team-a", False),
    ],
)
def test_a_scope_counts_for_a_tenant_unfiltered_or_filtered_to_its_group(
    scopes: set[str], tenant: str, allowed: bool
) -> None:
    caller = Caller("x", CallerKind.SERVICE, frozenset(scopes))
    assert caller.can(Scope.QUOTAS_WRITE, tenant) is allowed
