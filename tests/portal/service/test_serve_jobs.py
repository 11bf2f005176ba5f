"""``gpuportal serve`` runs training jobs end to end: submitted over HTTP, run by the local
runner as real processes, logs and attempts read back over HTTP."""

from __future__ import annotations

import sys
import time

import pytest

from tests.portal.service.conftest import ALICE, ServiceFactory

pytestmark = pytest.mark.slow


def job(**extra: object) -> dict[str, object]:
    return {
        "tenant": "team-a",
        "name": "hello",
        "members": 2,
        "devices": {"kind": "gpu", "count": 1},
        "command": [
            sys.executable,
            "-c",
            "import os; print('hello from rank', os.environ['RANK'])",
        ],
        **extra,
    }


def test_the_service_runs_a_job_and_serves_its_logs(service_factory: ServiceFactory) -> None:
    svc = service_factory()
    svc.start()
    with svc.client(ALICE) as c:
        assert c.get("/api/v1/jobs").json()["items"] == []
        bad = c.post("/api/v1/jobs", json=job(members=0))
        assert (bad.status_code, bad.json()["field"]) == (422, "members")
        r = c.post("/api/v1/jobs", json=job())
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        assert r.json()["workload"]["kind"] == "job"
        deadline = time.monotonic() + 30
        while (state := c.get(f"/api/v1/jobs/{jid}").json()["state"]) not in (
            "succeeded",
            "failed",
        ):
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
        assert state == "succeeded"
        for rank in (0, 1):
            log = c.get(f"/api/v1/jobs/{jid}/logs", params={"rank": rank}).json()
            assert log["text"] == f"hello from rank {rank}\n" and log["done"]
        (attempt,) = c.get(f"/api/v1/jobs/{jid}/attempts").json()["items"]
        assert attempt["exit_reason"] == "completed"
        assert c.get("/api/v1/workloads").json()["items"] == []  # its devices are back
    assert svc.terminate() == 0
