"""``gpuportal serve`` runs the job controller: ``/api/v1/jobs`` answers in the real process,
and a job either runs on the local runner or, where this build has none, is refused with 503
and why (nothing queued that nothing would start)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.portal.service.conftest import ALICE, ServiceFactory

pytestmark = pytest.mark.slow

HAS_RUNNER = importlib.util.find_spec("portal.jobs.runner") is not None


def job(**extra: object) -> dict[str, object]:
    return {
        "tenant": "team-a",
        "name": "train",
        "members": 2,
        "devices": {"kind": "gpu", "count": 1},
        "command": ["python", "-c", "print('hello')"],
        **extra,
    }


def test_the_service_serves_jobs(service_factory: ServiceFactory) -> None:
    svc = service_factory()
    svc.start()
    with svc.client(ALICE) as c:
        assert c.get("/api/v1/jobs").json()["items"] == []
        bad = c.post("/api/v1/jobs", json=job(members=0))
        assert (bad.status_code, bad.json()["field"]) == (422, "members")
        r = c.post("/api/v1/jobs", json=job())
        if not HAS_RUNNER:
            # Until the runner branch is merged: refused, and nothing holds devices.
            assert r.status_code == 503, r.text
            assert "no local job runner" in r.json()["message"]
            assert c.get("/api/v1/workloads").json()["items"] == []
        else:
            assert r.status_code == 201, r.text
            assert r.json()["workload"]["kind"] == "job"
    assert svc.terminate() == 0
