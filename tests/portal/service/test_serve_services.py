"""``gpuportal serve`` runs inference services end to end: deployed over HTTP, each replica a
real test-engine process pinned to its allocation's devices on a loopback port of its own,
called through the portal's OpenAI-compatible gateway with hub tokens, held while a replica
starts, re-adopted after a portal restart."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from portal.inference.testengine import read_model, reply_words
from tests.portal.service.conftest import (
    ALICE,
    BOB,
    Service,
    ServiceFactory,
    bearer,
    database_url,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "models" / "tiny"
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"layers": 2}')
    (d / "weights.bin").write_bytes(os.urandom(1 << 20))
    return d


@pytest.fixture
def replicas_killed(tmp_path: Path) -> Iterator[None]:
    """Engine processes outlive the portal by design: kill what a failed test left."""
    yield
    for member in (tmp_path / "state" / "services").glob("*/attempt-*/rank-0/member.json"):
        with contextlib.suppress(ProcessLookupError, ValueError, KeyError):
            os.killpg(json.loads(member.read_text())["pid"], signal.SIGKILL)


def service(model_dir: Path, *args: str, **extra: object) -> dict[str, object]:
    return {
        "tenant": "team-a",
        "name": "llm",
        "engine": {"preset": "test", "args": ["--token-seconds", "0.001", *args]},
        "model": {"uri": model_dir.as_uri(), "digest": read_model(model_dir)[1]},
        "devices": {"kind": "gpu", "count": 1},
        "replicas": {"min": 1, "max": 2},
        **extra,
    }


def wait_ready(c: httpx.Client, sid: str, n: int = 1, timeout: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        svc: dict[str, object] = c.get(f"/api/v1/services/{sid}").json()
        if svc["ready"] == n:
            return svc
        assert time.monotonic() < deadline, svc
        time.sleep(0.1)


def pid_of(svc: Service, sid: str, number: int) -> int:
    member = (
        svc.workdir / "state" / "services" / sid / f"attempt-{number}" / "rank-0" / "member.json"
    )
    return int(json.loads(member.read_text())["pid"])


def chat(text: str, **extra: object) -> dict[str, object]:
    return {
        "model": "llm",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 6,
        **extra,
    }


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_service_is_served_through_the_gateway_and_survives_a_portal_restart(
    service_factory: ServiceFactory,
    model_dir: Path,
    replicas_killed: None,
    db: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    svc = service_factory(database_url=database_url(db, request, tmp_path))
    svc.start()
    gateway = f"{svc.url}/gateway/team-a/llm/v1"
    with svc.client(ALICE) as c:
        r = c.post("/api/v1/services", json=service(model_dir))
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        ready = wait_ready(c, sid)
        (rep,) = ready["replicas"]  # type: ignore[misc]
        assert rep["workload"]["kind"] == "inference" and rep["devices"]
        pid = pid_of(svc, sid, 1)
        # Pinned to its allocation's devices.
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"CUDA_VISIBLE_DEVICES={','.join(rep['devices'])}".encode() in environ
        log = c.get(f"/api/v1/services/{sid}/logs", params={"replica": 1}).json()["text"]
        assert "loaded llm" in log and "1048589 bytes" in log

        # The OpenAI routes, with the hub token as the API key.
        models = httpx.get(f"{gateway}/models", headers=bearer(ALICE)).json()
        assert [m["id"] for m in models["data"]] == ["llm"]
        r = httpx.post(f"{gateway}/chat/completions", json=chat("hi"), headers=bearer(ALICE))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == " ".join(reply_words("user: hi", 6))
        with httpx.stream("POST", f"{gateway}/chat/completions", json=chat("hi", stream=True),
                          headers=bearer(ALICE)) as s:  # fmt: skip
            assert s.headers["content-type"].startswith("text/event-stream")
            events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and len(events) == 6 + 2
        r = httpx.post(f"{gateway}/completions", json={"prompt": "x", "max_tokens": 2},
                       headers=bearer(ALICE))  # fmt: skip
        assert r.json()["choices"][0]["text"] == " ".join(reply_words("x", 2))
        # Another tenant's token, no token, and a service that does not exist.
        r = httpx.post(f"{gateway}/chat/completions", json=chat("hi"), headers=bearer(BOB))
        assert r.status_code == 403, r.text
        assert httpx.get(f"{gateway}/models", headers=bearer(BOB)).status_code == 403
        assert httpx.post(f"{gateway}/chat/completions", json=chat("hi")).status_code == 401
        other = f"{svc.url}/gateway/team-a/nope/v1/chat/completions"
        assert httpx.post(other, json=chat("hi"), headers=bearer(ALICE)).status_code == 404
        assert c.get(f"/api/v1/services/{sid}").json()["traffic"]["served"] == 3

    # A portal restart re-adopts the running engine: same process, still served.
    assert svc.terminate() == 0
    assert Path(f"/proc/{pid}").exists()
    svc.start(seed=None)
    with svc.client(ALICE) as c:
        ready = wait_ready(c, sid)
        assert pid_of(svc, sid, 1) == pid
        assert [x["state"] for x in c.get(f"/api/v1/services/{sid}/replicas").json()["items"]] == [
            "ready"
        ]
        r = httpx.post(f"{gateway}/chat/completions", json=chat("again"), headers=bearer(ALICE))
        assert r.status_code == 200, r.text
        gone = c.delete(f"/api/v1/services/{sid}").json()
        assert gone["state"] == "deleted"
        deadline = time.monotonic() + 30
        while c.get("/api/v1/workloads").json()["items"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert (
        not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    )
    assert svc.terminate() == 0


def test_requests_are_held_while_a_replica_starts_and_beyond_the_bound_get_503(
    service_factory: ServiceFactory, model_dir: Path, replicas_killed: None
) -> None:
    svc = service_factory()
    svc.start()
    gateway = f"{svc.url}/gateway/team-a/llm/v1"
    body = service(model_dir, "--load-seconds", "4", hold={"max_requests": 1, "timeout_s": 60})
    with svc.client(ALICE) as c:
        sid = c.post("/api/v1/services", json=body).json()["id"]
        answers: list[httpx.Response] = []
        started = time.monotonic()
        url = f"{gateway}/chat/completions"

        def call() -> None:
            answers.append(httpx.post(url, json=chat("held"), headers=bearer(ALICE), timeout=60))

        held = threading.Thread(target=call)
        held.start()
        deadline = time.monotonic() + 10
        while c.get(f"/api/v1/services/{sid}").json()["traffic"]["held"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # The bound is 1: the next one is refused at once, and told when to retry.
        r = httpx.post(f"{gateway}/chat/completions", json=chat("more"), headers=bearer(ALICE))
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "5" and r.json()["retry_after_s"] == 5
        held.join(60)
        (answer,) = answers
        assert answer.status_code == 200, answer.text
        assert time.monotonic() - started >= 3.5  # it waited for the engine's load
        traffic = c.get(f"/api/v1/services/{sid}").json()["traffic"]
        # The refused one was never held: only the first counts in held_total.
        assert (traffic["held"], traffic["held_total"], traffic["refused"], traffic["served"]) == (
            0,
            1,
            1,
            1,
        )
        c.delete(f"/api/v1/services/{sid}")
    assert svc.terminate() == 0


def test_after_the_idle_time_a_service_goes_to_zero_and_the_next_request_is_held_not_failed(
    service_factory: ServiceFactory, model_dir: Path, replicas_killed: None
) -> None:
    svc = service_factory()
    svc.start()
    gateway = f"{svc.url}/gateway/team-a/llm/v1"
    body = service(
        model_dir,
        "--load-seconds",
        "3",
        replicas={"min": 0, "max": 1},
        scaling={"idle_s": 1.5, "down_window_s": 1},
    )
    with svc.client(ALICE) as c:
        sid = c.post("/api/v1/services", json=body).json()["id"]
        # Loading takes longer than the idle time: the idle timer leaves a starting replica.
        wait_ready(c, sid)
        deadline = time.monotonic() + 30
        while (now := c.get(f"/api/v1/services/{sid}").json())["desired"] != 0:
            assert time.monotonic() < deadline, now
            time.sleep(0.1)
        while c.get("/api/v1/workloads").json()["items"]:  # its quota is released
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert c.get(f"/api/v1/services/{sid}").json()["replicas"] == []
        # From zero: the request is held while a replica starts, then answered.
        started = time.monotonic()
        r = httpx.post(f"{gateway}/chat/completions", json=chat("wake"), headers=bearer(ALICE),
                       timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == " ".join(
            reply_words("user: wake", 6)
        )
        assert time.monotonic() - started >= 2.5
        kinds = [e["kind"] for e in c.get(f"/api/v1/services/{sid}/events").json()["items"]]
        assert "service.scaled_down" in kinds and "service.woken" in kinds
        c.delete(f"/api/v1/services/{sid}")
    assert svc.terminate() == 0


def test_under_load_replicas_follow_the_waiting_requests_up_to_the_tenants_limit(
    service_factory: ServiceFactory, model_dir: Path, replicas_killed: None
) -> None:
    svc = service_factory()
    svc.start()
    gateway = f"{svc.url}/gateway/team-a/llm/v1"
    # 4 GPUs a replica on team-a's limit of 8: at most 2 replicas, whatever max says.
    body = service(
        model_dir,
        "--max-running",
        "1",
        "--token-seconds",
        "0.05",
        devices={"kind": "gpu", "count": 4},
        replicas={"min": 1, "max": 3},
        scaling={"target": 1, "up_window_s": 1, "down_window_s": 600},
    )
    with svc.client(ALICE) as c:
        sid = c.post("/api/v1/services", json=body).json()["id"]
        wait_ready(c, sid)
        url = f"{gateway}/completions"
        codes: list[int] = []

        def call() -> None:
            r = httpx.post(url, json={"prompt": "p", "max_tokens": 40}, headers=bearer(ALICE),
                           timeout=120)  # fmt: skip
            codes.append(r.status_code)

        load = [threading.Thread(target=call) for _ in range(12)]  # 2 s each, one at a time
        for t in load:
            t.start()
        seen: set[int] = set()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = c.get(f"/api/v1/services/{sid}").json()
            seen.add(now["desired"])
            gpus = sum(len(a["gpus"]) for w in c.get("/api/v1/workloads").json()["items"]
                       for a in w["allocations"])  # fmt: skip
            assert gpus <= 8
            if now["ready"] == 2:
                break
            time.sleep(0.2)
        assert now["ready"] == 2, now
        for t in load:
            t.join(120)
        assert codes == [200] * 12
        assert max(seen) == 2  # never above the tenant's limit
        events = c.get(f"/api/v1/services/{sid}/events").json()["items"]
        (up,) = [e for e in events if e["kind"] == "service.scaled_up"]
        assert "1 -> 2 replicas" in up["message"] and "waiting_requests" in up["message"]
        c.delete(f"/api/v1/services/{sid}")
    assert svc.terminate() == 0


def test_streams_in_flight_survive_a_scale_to_zero_and_a_request_meanwhile_is_served(
    service_factory: ServiceFactory, model_dir: Path, replicas_killed: None
) -> None:
    svc = service_factory()
    svc.start()
    gateway = f"{svc.url}/gateway/team-a/llm/v1"
    # Four answers of 3.6 s one after another (14 s, beyond the 10 s stop grace) against an
    # idle time of 1 s: the service goes to zero while they stream.
    body = service(
        model_dir,
        *("--token-seconds", "0.06", "--max-running", "1"),
        replicas={"min": 0, "max": 1},
        scaling={"idle_s": 1, "down_window_s": 1},
    )
    with svc.client(ALICE) as c:
        sid = c.post("/api/v1/services", json=body).json()["id"]
        wait_ready(c, sid)
        streamed: list[list[str]] = []

        def stream(i: int) -> None:
            ask = chat(f"s{i}", stream=True, max_tokens=60)
            url = f"{gateway}/chat/completions"
            with httpx.stream("POST", url, json=ask, headers=bearer(ALICE), timeout=60) as s:
                streamed.append([line[6:] for line in s.iter_lines() if line.startswith("data: ")])

        load = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        for t in load:
            t.start()
        deadline = time.monotonic() + 20
        while c.get(f"/api/v1/services/{sid}").json()["desired"] != 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Its replica drains: a request now puts it back in rotation, no cold start.
        r = httpx.post(f"{gateway}/chat/completions", json=chat("late"), headers=bearer(ALICE),
                       timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text
        for t in load:
            t.join(60)
        assert len(streamed) == 4
        assert all(s[-1] == "[DONE]" and len(s) == 60 + 2 for s in streamed), streamed
        # Idle again: it goes to zero, and once drained its devices are free.
        while c.get("/api/v1/workloads").json()["items"]:
            assert time.monotonic() < deadline + 20
            time.sleep(0.1)
        events = c.get(f"/api/v1/services/{sid}/events").json()["items"]
        kinds = [e["kind"] for e in events]
        assert "service.replica_draining" in kinds, kinds
        traffic = c.get(f"/api/v1/services/{sid}").json()["traffic"]
        assert traffic["failed"] == 0, (traffic, events)
        c.delete(f"/api/v1/services/{sid}")
    assert svc.terminate() == 0


def test_an_engine_that_dies_cuts_its_stream_at_once_and_the_next_request_is_held(
    service_factory: ServiceFactory, model_dir: Path, replicas_killed: None
) -> None:
    svc = service_factory()
    svc.start()
    gateway = f"{svc.url}/gateway/team-a/llm/v1"
    with svc.client(ALICE) as c:
        body = service(model_dir, "--token-seconds", "0.2")
        sid = c.post("/api/v1/services", json=body).json()["id"]
        wait_ready(c, sid)
        # Killed mid-answer: the client's stream breaks at once (not at a read timeout).
        ask = chat("long", stream=True, max_tokens=100)
        lines = 0
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream("POST", f"{gateway}/chat/completions", json=ask,
                         headers=bearer(ALICE), timeout=60) as s,
        ):  # fmt: skip
            for _ in s.iter_lines():
                lines += 1
                if lines == 4:
                    os.killpg(pid_of(svc, sid, 1), signal.SIGKILL)
                    killed = time.monotonic()
        assert time.monotonic() - killed < 5 and lines < 100
        assert c.get(f"/api/v1/services/{sid}").json()["traffic"]["failed"] == 1  # the cut
        # Gone before the service loop notices: the gateway still has it as ready, and the
        # request is held for its replacement.
        r = httpx.post(f"{gateway}/chat/completions", json=chat("again"), headers=bearer(ALICE),
                       timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text
        # Plus one refused connection, unless the service loop saw the death first.
        assert c.get(f"/api/v1/services/{sid}").json()["traffic"]["failed"] in (1, 2)
        c.delete(f"/api/v1/services/{sid}")
    assert svc.terminate() == 0
