"""``/api/v1/jobs`` over a real allocator and store, SQLite and PostgreSQL: bad input is a 422
naming the field with nothing created, and tenants cannot see each other's jobs."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.jobs.controller import JobController
from portal.jobs.spec import Backend
from portal.store import jobs as stored
from tests.portal.api.conftest import TOKENS, auth, job_body


@pytest.fixture
def store_url(db_url: str) -> str:
    return db_url


def with_(body: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """``body`` with ``value`` at the dotted ``path`` (nested objects created)."""
    out = {**body}
    keys = path.split(".")
    node = out
    for k in keys[:-1]:
        node[k] = {**node.get(k, {})}
        node = node[k]
    node[keys[-1]] = value
    return out


BAD: list[tuple[str, object, str]] = [
    ("devices.models", ["X100-1GB"], "devices.models"),
    ("devices.kind", "tpu", "devices.kind"),
    ("members", 0, "members"),
    ("members", -2, "members"),
    ("devices.count", 0, "devices.count"),
    ("devices.count", -1, "devices.count"),
    ("members", 2, "members"),  # 2 x 8 GPUs: the whole cluster holds 8
    ("topology", {"level": "galaxy"}, "topology.level"),
    ("topology", {"level": "same-rack", "mode": "maybe"}, "topology.mode"),
    ("devices.topology", "same-rack", "devices.topology"),
    ("command", [], "command"),
    ("cwd", "relative/dir", "cwd"),
    ("env", {"RANK": "3"}, "env.RANK"),
    ("env", {"GPUPORTAL_RESUME_FROM": "/x"}, "env.GPUPORTAL_RESUME_FROM"),
    ("restart", {"max_restarts": -1}, "restart.max_restarts"),
    ("restart", {"backoff_s": 30, "backoff_cap_s": 10}, "restart.backoff_cap_s"),
    ("restart", {"fail_on_exit_codes": [0]}, "restart.fail_on_exit_codes.0"),
    ("priority", 10**9, "priority"),
    ("members", {"min": 2, "max": 1}, "members.max"),
    ("members", {"min": 0, "max": 1}, "members.min"),
    ("members", {"min": 1}, "members.max"),
    ("nonsense", 1, "nonsense"),
]


@pytest.mark.parametrize(("path", "value", "field"), BAD, ids=[f"{b[0]}={b[1]}" for b in BAD])
def test_bad_input_is_a_422_naming_the_field_and_creates_nothing(
    client: TestClient, allocator: Allocator, path: str, value: object, field: str
) -> None:
    body = with_(job_body(members=1, n=8), path, value)
    if path == "devices.count" or path == "devices.kind":
        body = with_(body, "members", 1)
    r = client.post("/api/v1/jobs", json=body, headers=auth("alice"))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field, r.json()
    assert stored.jobs(allocator.store) == []
    assert allocator.workloads() == []
    assert not [e for e in allocator.store.events() if e.kind.startswith(("job.", "workload."))]


def test_a_job_for_kubernetes_needs_an_image(allocator: Allocator) -> None:
    app = create_app(
        allocator,
        StaticAuthenticator(TOKENS),
        job_controller=JobController(allocator, kind=Backend.KUBERNETES),
    )
    with TestClient(app) as client:
        r = client.post("/api/v1/jobs", json=job_body(), headers=auth("alice"))
        assert (r.status_code, r.json()["field"]) == (422, "image")
        ok = {**job_body(), "command": [], "image": "registry.example/train:1"}
        # The checkpoint volume is mounted at checkpoint_dir: the root cannot be one.
        r = client.post("/api/v1/jobs", json={**ok, "checkpoint_dir": "/"}, headers=auth("alice"))
        assert (r.status_code, r.json()["field"]) == (422, "checkpoint_dir")
        assert client.post("/api/v1/jobs", json=ok, headers=auth("alice")).status_code == 201
    assert len(stored.jobs(allocator.store)) == 1


def test_a_submitted_job_shows_its_attempt_and_queue_state(client: TestClient) -> None:
    r = client.post("/api/v1/jobs", json=job_body(members=2, n=1), headers=auth("alice"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["state"], job["attempt"], job["members"]) == ("queued", 1, 2)
    assert job["workload"]["kind"] == "job"
    assert job["workload"]["state"] == "running"  # placed at once; the loop launches it
    assert len(job["workload"]["allocations"]) == 2
    # A second one waits for team-a's quota (limit 2), holding nothing, and says why.
    r = client.post("/api/v1/jobs", json=job_body(members=2, n=1), headers=auth("alice"))
    waiting = r.json()["workload"]
    assert (waiting["state"], waiting["reason"], waiting["allocations"]) == ("queued", "quota", [])
    assert waiting["position"] == 1
    listed = client.get("/api/v1/jobs", headers=auth("alice")).json()
    assert [j["id"] for j in listed["items"]] == [job["id"], r.json()["id"]]
    (attempt,) = client.get(f"/api/v1/jobs/{job['id']}/attempts", headers=auth("alice")).json()[
        "items"
    ]
    assert (attempt["number"], attempt["exit_reason"]) == (1, "")
    logs = client.get(f"/api/v1/jobs/{job['id']}/logs", headers=auth("alice")).json()
    assert (logs["text"], logs["next_offset"], logs["done"]) == ("", 0, False)
    gone = client.delete(f"/api/v1/jobs/{job['id']}", headers=auth("alice")).json()
    assert gone["state"] == "cancelled" and gone["workload"]["state"] == "released"


def test_another_tenant_cannot_see_cancel_or_read_logs(
    client: TestClient, allocator: Allocator
) -> None:
    jid = client.post("/api/v1/jobs", json=job_body(), headers=auth("alice")).json()["id"]
    for method, path in [
        ("GET", f"/api/v1/jobs/{jid}"),
        ("DELETE", f"/api/v1/jobs/{jid}"),
        ("GET", f"/api/v1/jobs/{jid}/logs"),
        ("GET", f"/api/v1/jobs/{jid}/attempts"),
        ("GET", "/api/v1/jobs?tenant=team-a"),
    ]:
        r = client.request(method, path, headers=auth("bob"))
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), (method, path, r.text)
    assert client.get("/api/v1/jobs", headers=auth("bob")).json()["items"] == []
    # Nor charge team-a, nor submit to it.
    r = client.post("/api/v1/jobs", json=job_body(), headers=auth("bob"))
    assert r.status_code == 403
    assert stored.job(allocator.store, jid).state.value == "queued"  # type: ignore[union-attr]
    assert client.get(f"/api/v1/jobs/{jid}", headers=auth("alice")).status_code == 200


def test_an_unknown_job_is_a_404(client: TestClient) -> None:
    r = client.get("/api/v1/jobs/nope", headers=auth("alice"))
    assert (r.status_code, r.json()["code"]) == (404, "not_found")


def test_the_app_without_a_controller_builds_one(app: FastAPI) -> None:
    assert isinstance(app.state.jobs, JobController)


def test_an_elastic_job_shows_its_bounds_and_current_members(client: TestClient) -> None:
    body = {**job_body(n=1), "members": {"min": 1, "max": 2}}
    r = client.post("/api/v1/jobs", json=body, headers=auth("alice"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["members"], job["max_members"], job["members_now"]) == (1, 2, 1)
    assert job["spec"]["max_members"] == 2
    fixed = client.post("/api/v1/jobs", json=job_body(members=1, n=1), headers=auth("alice"))
    assert (fixed.json()["max_members"], fixed.json()["members_now"]) == (None, 1)
