"""``gpuportal serve`` as a real process: HTTP under the hub's prefix, SIGTERM with requests in
flight, restart, the tick loop, and bad settings."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.portal.service.conftest import ALICE, ServiceFactory, database_url, gpu

pytestmark = pytest.mark.slow


def test_under_the_hub_it_listens_where_the_hub_says_and_answers_under_its_prefix(
    service_factory: ServiceFactory,
) -> None:
    svc = service_factory(prefix="/services/gpuportal/")
    svc.extra_env = {
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{svc.port}",
        "JUPYTERHUB_SERVICE_PREFIX": "/services/gpuportal/",
    }
    assert "GPUPORTAL_SERVICE_PORT" not in svc.env()
    svc.start(seed=None)
    base = f"http://127.0.0.1:{svc.port}"
    assert httpx.get(f"{base}/services/gpuportal/health").json() == {"status": "ok"}
    assert httpx.get(f"{base}/health").status_code == 404  # only under the prefix
    doc = httpx.get(f"{base}/services/gpuportal/api/v1/openapi.json").json()
    assert doc["servers"] == [{"url": "/services/gpuportal"}]
    with svc.client() as c:
        assert c.put("/api/v1/tenants/team-a", json={}, headers={"If-None-Match": "*"}).is_success
        r = c.put(
            "/api/v1/tenants/team-a/quotas/H100-80GB",
            json={"guaranteed": 1, "limit": 2},
            headers={"If-None-Match": "*"},
        )
        assert r.status_code == 200, r.text
    with svc.client(ALICE) as c:
        r = c.post("/api/v1/workloads", json=gpu("team-a", 1, "nb"))
        assert r.status_code == 201, r.text
        assert c.get(f"/api/v1/workloads/{r.json()['id']}").json()["state"] == "running"
    assert svc.terminate() == 0
    log = svc.tail(200)
    assert '"route": "/api/v1/workloads", "path": "/services/gpuportal/api/v1/workloads"' in log
    assert '"caller": "alice"' in log
    assert '"outcome": "allocated"' in log


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_sigterm_finishes_requests_in_flight_and_a_restart_keeps_every_acknowledged_one(
    service_factory: ServiceFactory, request: pytest.FixtureRequest, tmp_path: Path, db: str
) -> None:
    url = database_url(db, request, tmp_path)
    svc = service_factory(database_url=url)
    svc.start()
    acknowledged: dict[str, dict[str, Any]] = {}
    answered_after_signal: list[float] = []
    signalled = threading.Event()
    stop = threading.Event()

    def hammer(tenant: str) -> None:
        with svc.client() as c:
            while not stop.is_set():
                try:
                    r = c.post(
                        "/api/v1/workloads",
                        json=gpu(tenant, 1, "job"),
                        headers={"Idempotency-Key": uuid.uuid4().hex},
                    )
                except httpx.HTTPError:
                    if signalled.is_set():
                        return  # the server stopped accepting
                    continue
                assert r.status_code in (201, 202), r.text
                body = r.json()
                acknowledged[body["id"]] = body
                if signalled.is_set():
                    answered_after_signal.append(time.monotonic())

    threads = [threading.Thread(target=hammer, args=(t,)) for t in ("team-a", "team-b") * 3]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while len(acknowledged) < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        pid = svc.process.pid if svc.process else -1
        signalled.set()
        code = svc.terminate()
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert code == 0, svc.tail()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert len(acknowledged) >= 20
    assert answered_after_signal, "no request was in flight at SIGTERM; the test proved nothing"

    svc.start(seed=None)
    with svc.client() as c:
        for wid, before in acknowledged.items():
            after = c.get(f"/api/v1/workloads/{wid}").json()
            assert after["state"] == before["state"], (wid, before, after)
            assert [(a["node"], a["gpus"]) for a in after["allocations"]] == [
                (a["node"], a["gpus"]) for a in before["allocations"]
            ]
    assert svc.terminate() == 0


def test_the_tick_admits_a_workload_that_the_release_cycle_left_in_the_queue(
    service_factory: ServiceFactory,
) -> None:
    # x and y lend to each other (one cohort). x holds its whole guarantee; y borrows the rest
    # of the cluster. 16 queued requests of x, each a different shape, come first in the
    # queue (x uses less) and still exceed x's limit after x releases one GPU: they use up
    # the release cycle's 16 tries, so y's 1-GPU request, which x's idle GPU would fit, waits
    # for the tick.
    seed = {
        "tenants": {
            "x": {"cohort": "c", "quotas": {"H100-80GB": {"guaranteed": 2, "limit": 2}}},
            "y": {"cohort": "c", "quotas": {"H100-80GB": {"guaranteed": 6, "limit": 16}}},
        }
    }
    svc = service_factory(extra_env={"GPUPORTAL_TICK_INTERVAL_S": "2"})
    svc.start(seed=seed)
    with svc.client() as c:

        def ask(tenant: str, n: int, name: str, memory_mib: int = 0) -> dict[str, object]:
            r = c.post("/api/v1/workloads", json=gpu(tenant, n, name, memory_mib=memory_mib))
            assert r.status_code in (201, 202), r.text
            body: dict[str, object] = r.json()
            return body

        first = ask("x", 1, "a1")
        for name, n in (("a2", 1), ("b1", 8), ("b2", 6)):
            assert ask("y" if name.startswith("b") else "x", n, name)["state"] == "running"
        for i in range(16):
            assert ask("x", 2, f"q{i}", memory_mib=1000 + i)["reason"] == "quota"
        last = ask("y", 1, "last")
        assert last["state"] == "queued"
        assert c.delete(f"/api/v1/workloads/{first['id']}").json()["state"] == "released"
        assert c.get(f"/api/v1/workloads/{last['id']}").json()["state"] == "queued"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if c.get(f"/api/v1/workloads/{last['id']}").json()["state"] == "running":
                break
            time.sleep(0.2)
        else:
            pytest.fail("the tick did not admit the workload")
    assert svc.terminate() == 0


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"GPUPORTAL_INVENTORY": "gpus-please"}, "GPUPORTAL_INVENTORY"),
        ({"GPUPORTAL_INVENTORY": "preset:hgx-h100-8=0"}, "GPUPORTAL_INVENTORY count"),
        ({"GPUPORTAL_SERVICE_PORT": "99999"}, "GPUPORTAL_SERVICE_PORT"),
        ({"GPUPORTAL_TOKENS_FILE": ""}, "GPUPORTAL_TOKENS_FILE"),
        ({"GPUPORTAL_LOG_FORMAT": "xml"}, "GPUPORTAL_LOG_FORMAT"),
        (
            {"GPUPORTAL_INVENTORY": "kubernetes", "KUBECONFIG": "/nonexistent/kubeconfig"},
            "inventory 'kubernetes' (GPUPORTAL_INVENTORY) could not be listed",
        ),
        ({"GPUPORTAL_DATABASE_URL": "postgresql+psycopg://u@127.0.0.1:1/x"}, "database"),
        ({"GPUPORTAL_ISOLATION_FILE": "/nonexistent/isolation.yaml"}, "isolation file"),
        ({"GPUPORTAL_ALERT_RULES": '{"idle": {"for_s": -5}}'}, "ALERT_RULES idle.for_s -5"),
        ({"GPUPORTAL_ALERT_RULES": '{"idel": {}}'}, 'GPUPORTAL_ALERT_RULES "idel"'),
        (
            {"GPUPORTAL_ALERT_TENANT_RULES": '{"team-a": {"idle": {"threshold_pct": 150}}}'},
            "GPUPORTAL_ALERT_TENANT_RULES team-a: idle.threshold_pct 150",
        ),
        ({"GPUPORTAL_ALERT_RULES": '{"idle": '}, "GPUPORTAL_ALERT_RULES"),
    ],
)
def test_bad_settings_give_one_clear_line_and_exit_2(
    service_factory: ServiceFactory, env: dict[str, str], names: str
) -> None:
    svc = service_factory()
    (svc.workdir / "tokens.yaml").write_text("tokens: {}\n")
    full = {**svc.env(), **env}
    if env.get("GPUPORTAL_TOKENS_FILE") == "":
        del full["GPUPORTAL_TOKENS_FILE"]
    done = subprocess.run(svc.command(), env=full, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("gpuportal serve: error: ")
    assert names in lines[0]
