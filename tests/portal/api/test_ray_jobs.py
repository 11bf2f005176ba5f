"""``/api/v1/ray/.../jobs`` over a real allocator and store, SQLite and PostgreSQL, with no
process started (without drivers the controller takes, lists and stops jobs and creates and
deletes one-off clusters): bad input is a 422 naming the field with nothing created, a
stopped one-off job gives its cluster's quota back, and tenants cannot see or stop each
other's jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from policies.jobs import JobState
from portal.allocator import Allocator
from portal.ray.jobs import RayJobs
from portal.store import ray as stored
from tests.portal.api.conftest import auth
from tests.portal.api.test_jobs import with_
from tests.portal.api.test_ray import ray_body


@pytest.fixture
def store_url(db_url: str) -> str:
    return db_url


def job_body(tmp: Path) -> dict[str, Any]:
    return {
        "entrypoint": "python job.py",
        "runtime_env": {"working_dir": str(tmp), "env_vars": {"GREETING": "hi"}},
        "metadata": {"purpose": "test"},
    }


def one_off_body(tmp: Path, tenant: str = "team-a") -> dict[str, Any]:
    return {**job_body(tmp), "cluster": ray_body(tenant, workers=2, most=2)}


BAD: list[tuple[str, object, str]] = [
    ("entrypoint", "", "entrypoint"),
    ("entrypoint", "   ", "entrypoint"),
    ("runtime_env.pip", ["requests"], "runtime_env.pip"),
    ("runtime_env.conda", {"name": "x"}, "runtime_env.conda"),
    ("runtime_env.working_dir", "/no/such/dir", "runtime_env.working_dir"),
    ("runtime_env.working_dir", "relative", "runtime_env.working_dir"),
    ("runtime_env.env_vars", {"RAY_ADDRESS": "elsewhere:1"}, "runtime_env.env_vars.RAY_ADDRESS"),
    ("runtime_env.env_vars", {"1BAD": "x"}, "runtime_env.env_vars.1BAD"),
    ("cluster.workers.max", 1, "cluster.workers.max"),  # below min (2)
    ("cluster.workers.max", 9, "cluster.workers.max"),  # more than the inventory holds
    ("cluster.ray_version", "1.0.0", "cluster.ray_version"),
]


@pytest.mark.parametrize(("path", "value", "field"), BAD, ids=[f"{b[0]}={b[1]}" for b in BAD])
def test_bad_one_off_input_is_a_422_naming_the_field_and_creates_nothing(
    client: TestClient, allocator: Allocator, tmp_path: Path, path: str, value: object, field: str
) -> None:
    body = with_(one_off_body(tmp_path), path, value)
    r = client.post("/api/v1/ray/jobs", json=body, headers=auth("alice"))
    assert r.status_code == 422, r.text
    assert r.json()["field"].startswith(field), r.json()
    assert stored.clusters(allocator.store) == []
    assert stored.jobs(allocator.store) == []
    assert allocator.workloads() == []


def test_bad_input_to_a_cluster_is_a_422_and_queues_nothing(
    client: TestClient, allocator: Allocator, tmp_path: Path
) -> None:
    cid = client.post("/api/v1/ray", json=ray_body(), headers=auth("alice")).json()["id"]
    body = with_(job_body(tmp_path), "runtime_env.pip", ["torch"])
    r = client.post(f"/api/v1/ray/{cid}/jobs", json=body, headers=auth("alice"))
    assert (r.status_code, r.json()["field"]) == (422, "runtime_env.pip"), r.text
    assert stored.jobs(allocator.store) == []


def test_a_one_off_job_holds_its_cluster_and_stopping_it_gives_the_quota_back(
    client: TestClient, allocator: Allocator, tmp_path: Path
) -> None:
    r = client.post("/api/v1/ray/jobs", json=one_off_body(tmp_path), headers=auth("alice"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["state"], job["one_off"], job["attempt"]) == ("queued", True, 0)
    assert job["runtime_env"] == {"working_dir": str(tmp_path), "env_vars": {"GREETING": "hi"}}
    assert job["metadata"] == {"purpose": "test"}
    # The cluster was admitted like any Ray cluster: its gang holds team-a's 2 GPUs.
    [held] = allocator.workloads("team-a")
    assert (held.kind, len(held.allocations)) == ("ray", 2)
    assert job["cluster_id"] in {c.id for c in stored.clusters(allocator.store)}

    # Listed under /ray/jobs (not read as a cluster id) and under its cluster.
    listed = client.get("/api/v1/ray/jobs", headers=auth("alice")).json()["items"]
    assert [j["id"] for j in listed] == [job["id"]]
    of_cluster = client.get(f"/api/v1/ray/{job['cluster_id']}/jobs", headers=auth("alice"))
    assert [j["id"] for j in of_cluster.json()["items"]] == [job["id"]]

    r = client.delete(f"/api/v1/ray/jobs/{job['id']}", headers=auth("alice"))
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["cluster_state"]) == ("cancelled", "stopped")
    assert allocator.workloads() == []
    # Idempotent.
    r = client.delete(f"/api/v1/ray/jobs/{job['id']}", headers=auth("alice"))
    assert (r.status_code, r.json()["state"]) == (200, "cancelled")

    # Its cost is its cluster's slices, priced as any workload.
    r = client.get(f"/api/v1/ray/jobs/{job['id']}/cost", headers=auth("alice"))
    assert r.status_code == 200, r.text
    cost = r.json()
    assert [(a["number"], a["workload_id"]) for a in cost["attempts"]] == [(1, held.id)]


def test_a_job_on_a_tenants_cluster_leaves_the_cluster_and_its_cost_is_the_clusters(
    client: TestClient, allocator: Allocator, tmp_path: Path
) -> None:
    cid = client.post("/api/v1/ray", json=ray_body(), headers=auth("alice")).json()["id"]
    r = client.post(f"/api/v1/ray/{cid}/jobs", json=job_body(tmp_path), headers=auth("alice"))
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    assert (r.json()["one_off"], r.json()["cluster_id"]) == (False, cid)
    r = client.get(f"/api/v1/ray/jobs/{jid}/cost", headers=auth("alice"))
    assert (r.status_code, r.json()["code"]) == (409, "conflict"), r.text
    r = client.delete(f"/api/v1/ray/jobs/{jid}", headers=auth("alice"))
    assert r.json()["state"] == "cancelled"
    # The cluster is the tenant's: it keeps running and holding its slices.
    assert client.get(f"/api/v1/ray/{cid}", headers=auth("alice")).json()["state"] != "stopped"
    assert len(allocator.workloads("team-a")) == 1

    # A stopped cluster takes no job.
    client.delete(f"/api/v1/ray/{cid}", headers=auth("alice"))
    r = client.post(f"/api/v1/ray/{cid}/jobs", json=job_body(tmp_path), headers=auth("alice"))
    assert (r.status_code, r.json()["code"]) == (409, "conflict"), r.text
    assert len(stored.jobs(allocator.store)) == 1


def test_a_job_whose_cluster_is_deleted_fails(
    app: FastAPI, client: TestClient, allocator: Allocator, tmp_path: Path
) -> None:
    cid = client.post("/api/v1/ray", json=ray_body(), headers=auth("alice")).json()["id"]
    jid = client.post(
        f"/api/v1/ray/{cid}/jobs", json=job_body(tmp_path), headers=auth("alice")
    ).json()["id"]
    client.delete(f"/api/v1/ray/{cid}", headers=auth("alice"))
    jobs: RayJobs = app.state.ray_jobs
    jobs.step()
    view = jobs.view(jid)
    assert (view.job.state, view.job.message) == (JobState.FAILED, "its Ray cluster was deleted")


def test_another_tenant_gets_403_on_every_route_and_changes_nothing(
    client: TestClient, allocator: Allocator, tmp_path: Path
) -> None:
    r = client.post("/api/v1/ray/jobs", json=one_off_body(tmp_path), headers=auth("alice"))
    jid, cid = r.json()["id"], r.json()["cluster_id"]
    for method, path, body in [
        ("GET", "/api/v1/ray/jobs?tenant=team-a", None),
        ("GET", f"/api/v1/ray/jobs/{jid}", None),
        ("GET", f"/api/v1/ray/jobs/{jid}/logs", None),
        ("GET", f"/api/v1/ray/jobs/{jid}/cost", None),
        ("DELETE", f"/api/v1/ray/jobs/{jid}", None),
        ("GET", f"/api/v1/ray/{cid}/jobs", None),
        ("POST", f"/api/v1/ray/{cid}/jobs", job_body(tmp_path)),
        ("POST", "/api/v1/ray/jobs", one_off_body(tmp_path, "team-a")),
    ]:
        r = client.request(method, path, json=body, headers=auth("bob"))
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), (method, path, r.text)
    assert client.get("/api/v1/ray/jobs", headers=auth("bob")).json()["items"] == []
    [job] = stored.jobs(allocator.store)
    assert (job.id, job.state) == (jid, JobState.QUEUED)
    assert len(allocator.workloads("team-a")) == 1


def test_a_job_submitted_to_an_idle_cluster_resumes_it_through_admission(
    app: FastAPI, client: TestClient, allocator: Allocator, tmp_path: Path
) -> None:
    cid = client.post("/api/v1/ray", json=ray_body(), headers=auth("alice")).json()["id"]
    app.state.ray.release_idle(cid, 60.0)
    assert allocator.workloads() == []
    r = client.post(f"/api/v1/ray/{cid}/jobs", json=job_body(tmp_path), headers=auth("alice"))
    assert (r.status_code, r.json()["state"]) == (201, "queued"), r.text
    assert r.json()["cluster_state"] in {"queued", "starting", "running"}
    [held] = allocator.workloads("team-a")
    assert (held.kind, len(held.allocations)) == ("ray", 2)
