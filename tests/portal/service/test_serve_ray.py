"""``gpuportal serve`` takes Ray clusters over HTTP with the local backend wired in: bad input
is a 422, a created cluster holds its gang, delete gives everything back (the real Ray
processes are exercised in ``tests/portal/ray``)."""

from __future__ import annotations

import pytest

from tests.portal.service.conftest import ALICE, ServiceFactory

pytestmark = pytest.mark.slow

BODY = {
    "tenant": "team-a",
    "name": "rl",
    "workers": {"devices": {"kind": "gpu", "count": 1}, "min": 1, "max": 1},
}


def test_the_service_takes_and_deletes_a_ray_cluster(service_factory: ServiceFactory) -> None:
    svc = service_factory()
    svc.start()
    with svc.client(ALICE) as c:
        assert c.get("/api/v1/ray").json()["items"] == []
        bad = c.post("/api/v1/ray", json={**BODY, "ray_version": "0.0.1"})
        assert (bad.status_code, bad.json()["field"]) == (422, "ray_version"), bad.text
        r = c.post("/api/v1/ray", json=BODY)
        assert r.status_code == 201, r.text
        [gang] = r.json()["slices"]
        assert (gang["state"], gang["workload"]["kind"]) == ("running", "ray")
        done = c.delete(f"/api/v1/ray/{r.json()['id']}").json()
        assert done["state"] == "stopped"
        assert c.get("/api/v1/workloads").json()["items"] == []
    assert svc.terminate() == 0
