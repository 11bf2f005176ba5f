"""One writer per database, a start that is never refused over what the database holds, and
outages of PostgreSQL under a running ``gpuportal serve`` (real processes, real servers)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import create_engine, text

from portal.store.guard import WriterTaken
from portal.store.records import ChangeSet, WorkloadState
from portal.store.writer import Store
from tests.portal.service.conftest import ROOT, TOKENS, Service, ServiceFactory, gpu
from tests.portal.store import builders as b
from tests.support.postgres import PostgresServer, start_server, stop_server

TAKEOVER_S = 10.0


def refused(svc: Service) -> subprocess.CompletedProcess[str]:
    """Run ``serve`` in the foreground; it must exit by itself."""
    svc.workdir.mkdir(parents=True, exist_ok=True)
    (svc.workdir / "tokens.yaml").write_text(yaml.safe_dump(TOKENS))
    return subprocess.run(
        svc.command(), env=svc.env(), capture_output=True, text=True, timeout=120, check=False
    )


def database_facts(url: str) -> tuple[list[tuple[str, str, int, int]], list[tuple[str, int, int]]]:
    """From the database itself: (tenant, flavor, held, limit) and (node, gpu, milli held) of
    the active allocations."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            held = conn.execute(
                text(
                    'SELECT w.tenant, a.flavor, SUM(a.amount), MAX(q."limit") FROM allocations a '
                    "JOIN workloads w ON w.id = a.workload_id LEFT JOIN quotas q ON "
                    "q.tenant = w.tenant AND q.flavor = a.flavor WHERE a.released_at IS NULL "
                    "GROUP BY w.tenant, a.flavor"
                )
            ).all()
            allocations = conn.execute(
                text("SELECT node, gpus, milli FROM allocations WHERE released_at IS NULL")
            ).all()
    finally:
        engine.dispose()
    per_gpu: dict[tuple[str, int], int] = {}
    for node, gpus, milli in allocations:
        for g in gpus if isinstance(gpus, list) else yaml.safe_load(gpus):
            per_gpu[(node, g)] = per_gpu.get((node, g), 0) + milli
    return (
        [(t, f, int(n), int(lim)) for t, f, n, lim in held],
        [(node, g, m) for (node, g), m in sorted(per_gpu.items())],
    )


def assert_nothing_twice_or_above_a_limit(url: str) -> None:
    held, per_gpu = database_facts(url)
    assert held, "the test placed nothing"
    for tenant, flavor, n, limit in held:
        assert n <= limit, f"{tenant}/{flavor} holds {n}, above its limit {limit}"
    for node, g, milli in per_gpu:
        assert milli <= 1000, f"GPU {g} on {node} is handed out {milli}/1000"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.sqlite'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def test_a_second_serve_cannot_write_and_takes_over_within_seconds_of_a_sigkill(
    service_factory: ServiceFactory, shared_url: str, tmp_path: Path
) -> None:
    first = service_factory(workdir=tmp_path / "first", database_url=shared_url)
    second = service_factory(workdir=tmp_path / "second", database_url=shared_url)
    (tmp_path / "first").mkdir()
    first.start()
    with first.client() as c:
        for i in range(3):  # 4 + 4 run (limit 8), the third waits
            assert c.post("/api/v1/workloads", json=gpu("team-a", 4, f"big-{i}")).status_code in (
                200,
                201,
                202,
            )

    result = refused(second)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, result.stderr
    assert "another gpuportal serve is the writer of this database" in lines[0]
    assert "since" in lines[0]
    with first.client() as c:  # the first is untouched by the attempt
        assert httpx.get(f"{first.url}/ready", timeout=5).status_code == 200
        queued = [w for w in c.get("/api/v1/workloads").json()["items"] if w["state"] == "queued"]
        assert [w["name"] for w in queued] == ["big-2"]

    assert first.process is not None
    first.process.kill()
    first.process.wait(15)
    killed = time.monotonic()
    # The guard itself, as the next serve takes it (a serve's own start, imports included,
    # takes longer than the guard on a loaded machine, so it is timed apart).
    while True:
        try:
            Store(shared_url, writer_guard=True).close()
            break
        except WriterTaken:
            assert time.monotonic() - killed < TAKEOVER_S, "the guard outlived its SIGKILLed holder"
            time.sleep(0.1)
    took = time.monotonic() - killed
    assert took < TAKEOVER_S, f"the guard was free {took:.1f} s after SIGKILL"
    second.start()
    with second.client() as c:
        names = {w["name"]: w["state"] for w in c.get("/api/v1/workloads").json()["items"]}
        assert names == {"big-0": "running", "big-1": "running", "big-2": "queued"}
        r = c.post("/api/v1/workloads", json=gpu("team-b", 8, "b-all"))
        assert r.status_code in (200, 201, 202), r.text
    assert_nothing_twice_or_above_a_limit(shared_url)


def contradicting_database(url: str) -> None:
    """Two shares of 600/1000 on one GPU (the newer contradicts the older), and a tenant whose
    limit is below what it holds."""
    shared = {"kind": "share", "count": 1, "milli": 600}
    whole = {"kind": "gpu", "count": 1}
    with Store(url) as store:
        changes = ChangeSet()
        changes.tenants += [b.tenant("team-a"), b.tenant("team-b")]
        changes.quotas += [
            b.quota("team-a", "T4/share", guaranteed=0, limit=2000),
            b.quota("team-b", "T4", guaranteed=0, limit=1),
        ]
        changes.workloads += [
            b.workload("older", tenant="team-a", request=shared, created_at=b.at(0)),
            b.workload("newer", tenant="team-a", request=shared, created_at=b.at(5)),
            b.workload("whole-1", tenant="team-b", request=whole, created_at=b.at(1)),
            b.workload("whole-2", tenant="team-b", request=whole, created_at=b.at(2)),
        ]

        def share(alloc_id: str, wid: str, minutes: float) -> object:
            return b.allocation(
                alloc_id, wid, (0,), node="t4-2-1", flavor="T4/share", amount=600,
                gpu_equivalent=0.6, milli=600, created_at=b.at(minutes),
            )  # fmt: skip

        changes.allocations += [
            share("a-older", "older", 0),
            share("a-newer", "newer", 5),
            b.allocation("a-w1", "whole-1", (0,), node="t4-2-2", flavor="T4", created_at=b.at(1)),
            b.allocation("a-w2", "whole-2", (1,), node="t4-2-2", flavor="T4", created_at=b.at(2)),
        ]
        store.commit(changes)  # type: ignore[arg-type]


def test_a_database_that_contradicts_itself_starts_reports_and_the_newest_loses(
    service_factory: ServiceFactory, shared_url: str, tmp_path: Path
) -> None:
    contradicting_database(shared_url)
    svc = service_factory(database_url=shared_url, inventory="preset:t4-2=2")
    svc.start(seed=None)
    with svc.client() as c:
        running = {w["id"] for w in c.get("/api/v1/workloads").json()["items"]}
        alerts = c.get("/api/v1/alerts").json()
        alerts = alerts["items"] if isinstance(alerts, dict) else alerts
    assert running == {"older", "whole-1", "whole-2"}
    assert sorted((a["rule"], a["tenant"], tuple(a["workloads"])) for a in alerts) == [
        ("quota_over_limit_at_start", "team-b", ()),
        ("store_contradiction", "team-a", ("newer",)),
    ]
    assert "contradicts the database" in svc.tail(200)
    with Store(shared_url) as store:
        active = {a.id for a in store.load().allocations}
        newer = store.workload("newer")
        events = store.events()
    contradiction = [e for e in events if e.kind == "store.contradiction"]
    assert len(contradiction) == 1
    assert contradiction[0].workload_id == "newer"
    assert "a-newer" in contradiction[0].message and "older" in contradiction[0].message
    over = [e for e in events if e.kind == "quota.over-limit-at-start"]
    assert [(e.tenant, e.data["used"], e.data["limit"]) for e in over] == [("team-b", 2, 1)]
    assert active == {"a-older", "a-w1", "a-w2"}  # above a limit: reported, kept running
    assert newer is not None and newer.state is WorkloadState.FAILED
    assert newer.reason == "conflict-at-start"
    assert svc.terminate() == 0
    svc.start(seed=None)  # and a restart finds nothing left to resolve
    assert "contradicts the database" not in svc.tail(20)


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own: it is stopped and started under a running portal."""
    server = start_server()
    try:
        yield server
    finally:
        stop_server(server)


def wait_for(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.2)
    pytest.fail(f"not {what} within {timeout_s} s")


def ready_status(svc: Service) -> int:
    try:
        return httpx.get(f"{svc.url}/ready", timeout=5).status_code
    except httpx.HTTPError:
        return 0


@pytest.mark.postgres
def test_postgres_stopped_and_started_under_a_running_serve(
    service_factory: ServiceFactory, private_postgres: PostgresServer
) -> None:
    url = private_postgres.url(private_postgres.create_database())
    svc = service_factory(database_url=url)
    svc.start()
    c = svc.client(ROOT)
    assert c.post("/api/v1/workloads", json=gpu("team-a", 2, "before")).status_code < 300

    private_postgres.stop()
    wait_for(lambda: ready_status(svc) == 503, 10, "unready while the database is down")
    r = c.post("/api/v1/workloads", json=gpu("team-a", 2, "during"))
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["code"] == "unavailable" and body["retry_after_s"] > 0, body
    assert r.headers["Retry-After"] == str(body["retry_after_s"])
    for path in ("/api/v1/cost", "/api/v1/workloads/not-in-memory"):
        r = c.get(path)
        assert r.headers["content-type"].startswith("application/json"), (path, r.text)
        assert r.status_code in (200, 404, 503), (path, r.status_code, r.text)
        if r.status_code == 503:
            assert r.json()["code"] == "unavailable"
    ready = httpx.get(f"{svc.url}/ready", timeout=5)
    assert ready.status_code == 503 and ready.json()["status"] == "unavailable"

    private_postgres.restart()
    wait_for(lambda: ready_status(svc) == 200, 20, "ready again after the database came back")
    r = c.post("/api/v1/workloads", json=gpu("team-a", 2, "after"))
    assert r.status_code < 300, r.text
    listed = {w["name"] for w in c.get("/api/v1/workloads").json()["items"]}
    c.close()
    with Store(url) as store:
        stored = {w.name for w in store.load().workloads}
    assert listed == stored == {"before", "after"}  # "during" was not half-applied
    assert_nothing_twice_or_above_a_limit(url)
    assert svc.terminate() == 0
    log = svc.log.read_text()
    assert "writer guard lost" in log and "writer guard regained" in log
