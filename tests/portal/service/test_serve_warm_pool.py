"""``gpuportal serve`` keeps a service's warm pool with real test-engine processes: asleep
and not serving, woken by the first request without a second load, refilled, charged apart
in the cost route, and re-adopted with its state after a portal restart."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from portal.inference.testengine import reply_words
from tests.portal.service.conftest import ALICE, ROOT, ServiceFactory, bearer, database_url
from tests.portal.service.test_serve_services import (
    chat,
    model_dir,  # noqa: F401 (a fixture)
    pid_of,
    replicas_killed,  # noqa: F401 (a fixture)
    service,
)

pytestmark = pytest.mark.slow


def wait_for(c: httpx.Client, sid: str, ready: int, asleep: int) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while True:
        svc: dict[str, object] = c.get(f"/api/v1/services/{sid}").json()
        if (svc["ready"], svc["asleep"]) == (ready, asleep):
            return svc
        assert time.monotonic() < deadline, (svc["replicas"], svc["message"])
        time.sleep(0.1)


def loads(c: httpx.Client, sid: str, number: int) -> int:
    """How many times replica ``number``'s engine loaded the model, from its own log."""
    log = c.get(f"/api/v1/services/{sid}/logs", params={"replica": number}).json()["text"]
    return str(log).count("loaded llm")


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_warm_replica_answers_the_first_request_without_loading_again(
    service_factory: ServiceFactory,
    model_dir: Path,  # noqa: F811
    replicas_killed: None,  # noqa: F811
    db: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    svc = service_factory(database_url=database_url(db, request, tmp_path))
    svc.start()
    gateway = f"{svc.url}/gateway/team-a/llm/v1"
    body = service(model_dir, "--load-seconds", "1", replicas={"min": 0, "max": 1, "warm": 1})
    with svc.client(ALICE) as c:
        r = c.post("/api/v1/services", json=body)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        # One replica loaded and asleep, none serving.
        now = wait_for(c, sid, ready=0, asleep=1)
        (rep,) = now["replicas"]  # type: ignore[misc]
        assert rep["warm"] and rep["state"] == "asleep" and now["desired"] == 0
        assert loads(c, sid, 1) == 1
        pid = pid_of(svc, sid, 1)

        # The first request wakes it: answered by the same process, loaded once.
        r = httpx.post(f"{gateway}/chat/completions", json=chat("hi"), headers=bearer(ALICE),
                       timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == " ".join(reply_words("user: hi", 6))
        assert pid_of(svc, sid, 1) == pid and loads(c, sid, 1) == 1
        # The pool refills with a new replica, asleep beside the serving one.
        now = wait_for(c, sid, ready=1, asleep=1)
        states = {x["number"]: (x["state"], x["warm"]) for x in now["replicas"]}  # type: ignore[attr-defined]
        assert states == {1: ("ready", True), 2: ("asleep", True)}
        kinds = [e["kind"] for e in c.get(f"/api/v1/services/{sid}/events").json()["items"]]
        assert "service.replica_woken" in kinds

    # Cost: the warm pool's hours and the serving hours apart.
    with svc.client(ROOT) as c:
        (hours,) = c.get("/api/v1/cost/services", params={"tenant": "team-a"}).json()["services"]
        assert hours["service_id"] == sid
        assert hours["warm_gpu_hours"] > 0 and hours["serving_gpu_hours"] > 0

    # A portal restart re-adopts both with their state: the same processes, no new load.
    assert svc.terminate() == 0
    svc.start(seed=None)
    with svc.client(ALICE) as c:
        now = wait_for(c, sid, ready=1, asleep=1)
        assert pid_of(svc, sid, 1) == pid and loads(c, sid, 2) == 1
        r = httpx.post(f"{gateway}/chat/completions", json=chat("again"), headers=bearer(ALICE))
        assert r.status_code == 200, r.text
        c.delete(f"/api/v1/services/{sid}")
        deadline = time.monotonic() + 30
        while c.get("/api/v1/workloads").json()["items"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert svc.terminate() == 0
