"""``Portal().services`` and ``gpuportal services`` against the real API over real HTTP, with
the service controller's loop in a background thread and real test-engine replicas (the local
backend), called through the gateway with the client's own token as the OpenAI API key."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from policies.errors import Forbidden, InvalidRequest
from policies.services import MAX_START_FAILURES
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.cli import run
from portal.client import AsyncPortal, Portal
from portal.errors import Unavailable
from portal.inference.backend import local_backend
from portal.inference.controller import ServiceController
from portal.inference.testengine import read_model, reply_words
from portal.inference.weights import WeightCache
from tests.portal.api.conftest import TOKENS
from tests.portal.client.conftest import PREFIX, serving

pytestmark = pytest.mark.slow


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "weights.bin").write_bytes(b"\x02" * 4096)
    return d


@pytest.fixture
def url(allocator: Allocator, tmp_path: Path) -> Iterator[str]:
    weights = WeightCache(tmp_path / "weights", node_bytes=1 << 20, tenant_bytes=1 << 20)
    backend = local_backend(tmp_path / "services", weights)
    controller = ServiceController(allocator, backend=backend)
    controller.start()
    app = create_app(allocator, StaticAuthenticator(TOKENS), service_controller=controller)
    stop = threading.Event()

    def loop() -> None:  # the service's services loop, faster
        while not stop.wait(0.05):
            allocator.tick()
            controller.step()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        with serving(Starlette(routes=[Mount(PREFIX, app=app)])) as port:
            yield f"http://127.0.0.1:{port}{PREFIX}/"
    finally:
        stop.set()
        thread.join(5)
        for member in (tmp_path / "services").glob("*/attempt-*/rank-0/member.json"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(json.loads(member.read_text())["pid"], signal.SIGKILL)


def test_deploy_call_scale_and_delete_from_python(url: str, model_dir: Path) -> None:
    digest = read_model(model_dir)[1]
    with Portal(url, token="alice") as p:
        llm = p.services.deploy(
            "team-a", "llm", model_uri=model_dir.as_uri(), digest=digest,
            flavor="H100-80GB", preset="test", args=["--token-seconds", "0.001"],
            max_replicas=2,
        )  # fmt: skip
        assert llm.wait_ready(timeout_s=60).ready == 1
        assert llm.base_url == f"{url}gateway/team-a/llm/v1" and llm.api_key == "alice"
        body = {"model": "llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        r = httpx.post(f"{llm.base_url}/chat/completions", json=body,
                       headers={"Authorization": f"Bearer {llm.api_key}"})  # fmt: skip
        assert r.json()["choices"][0]["message"]["content"] == " ".join(reply_words("user: hi", 4))
        assert "loaded llm" in llm.logs()
        # The replica serves its read-only copy in the weight cache, which it uses.
        (entry,) = p.services.cache()
        assert (entry.tenant, entry.digest, entry.size_bytes) == ("team-a", digest, 4096)
        assert entry.in_use
        assert [s.id for s in p.services.list()] == [llm.id]
        assert p.services.scale(llm.id, min_replicas=2).desired == 2
        assert llm.wait_ready(2, timeout_s=60).ready == 2
        with pytest.raises(InvalidRequest) as e:
            p.services.scale(llm.id, max_replicas=1)  # below min 2
        assert e.value.field == "replicas.max"
        with pytest.raises(InvalidRequest) as e:
            p.services.deploy("team-a", "bad", model_uri="ftp://x/y", digest=digest,
                              flavor="H100-80GB", preset="test")  # fmt: skip
        assert e.value.field == "model.uri"
        assert llm.delete().state.value == "deleted"
    with Portal(url, token="bob") as p:
        with pytest.raises(Forbidden):
            p.services.get(llm.id)
        with pytest.raises(Forbidden):
            p.services.cache(tenant="team-a")
        assert p.services.cache() == []


def test_the_cli_deploys_shows_scales_and_deletes(
    url: str, model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPORTAL_URL", url)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "alice")

    def gp(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = run(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    digest = read_model(model_dir)[1]
    where = ("--model-uri", model_dir.as_uri())
    code, out, err = gp("services", "deploy", "team-a", "llm", "H100-80GB", "--preset", "test",
                        *where, "--digest", digest, "--json")  # fmt: skip
    assert code == 0, err
    sid = json.loads(out)["id"]
    code, out, _ = gp("services")
    assert sid in out and "gateway/team-a/llm/v1" in out
    code, out, _ = gp("services", "cache", "--tenant", "team-a")
    assert code == 0 and "team-a" in out and digest[:19] in out
    code, out, _ = gp("services", "scale", sid, "--max", "2")
    assert code == 0 and "wanted" in out
    with pytest.raises(SystemExit):  # argparse knows the presets
        gp("services", "deploy", "team-a", "x", "H100-80GB", "--preset", "nope", *where,
           "--digest", digest)  # fmt: skip
    code, out, err = gp("services", "deploy", "team-a", "x", "H100-80GB", "--preset", "test",
                        *where, "--digest", "sha256:abc")  # fmt: skip
    assert code != 0 and "model.digest" in err
    code, out, _ = gp("services", "delete", sid)
    assert code == 0 and "deleted" in out


def test_an_engine_that_never_starts_fails_the_service_after_a_few_tries(
    url: str, model_dir: Path, allocator: Allocator
) -> None:
    digest = read_model(model_dir)[1]
    with Portal(url, token="alice") as p:
        broken = p.services.deploy(
            "team-a", "broken", model_uri=model_dir.as_uri(), digest=digest, flavor="H100-80GB",
            preset="custom", command=[sys.executable, "-c", "import sys; sys.exit(3)", "{port}"],
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while (info := broken.refresh()).state.value == "active":
            assert time.monotonic() < deadline, info
            time.sleep(0.1)
        assert info.state.value == "failed" and "engine exited with code 3" in info.message
        every = p.services.replicas(broken.id)
        assert [r.state.value for r in every] == ["ended"] * MAX_START_FAILURES
        assert allocator.workloads("team-a") == []  # nothing left holding devices


async def test_the_async_client_deploys_reads_scales_and_deletes(url: str, model_dir: Path) -> None:
    digest = read_model(model_dir)[1]
    async with AsyncPortal(url, token="alice") as p:
        llm = await p.services.deploy(
            "team-a", "llm", model_uri=model_dir.as_uri(), digest=digest,
            flavor="H100-80GB", preset="test", args=["--token-seconds", "0.001"],
            max_replicas=2,
        )  # fmt: skip
        assert llm.spec["replicas"] == {"min": 1, "max": 2, "warm": 0}
        assert (await p.services.wait_ready(llm.id, timeout_s=60)).ready == 1
        assert "loaded llm" in await p.services.logs(llm.id)
        assert [r.state.value for r in await p.services.replicas(llm.id)] == ["ready"]
        assert [s.id for s in await p.services.list()] == [llm.id]
        assert [e.tenant for e in await p.services.cache()] == ["team-a"]
        # Only the bound given changes; the others are kept from the service as read.
        scaled = await p.services.scale(llm.id, warm=1)
        assert scaled.spec["replicas"] == {"min": 1, "max": 2, "warm": 1}
        with pytest.raises(InvalidRequest) as e:
            await p.services.scale(llm.id, max_replicas=0)
        assert e.value.field == "replicas.max"
        assert (await p.services.get(llm.id)).spec["replicas"]["max"] == 2  # nothing changed
        with pytest.raises(Unavailable):
            await p.services.wait_ready(llm.id, 5, timeout_s=0.2, poll_s=0.05)
        assert (await p.services.events(llm.id))[0].at <= scaled.updated_at
    async with AsyncPortal(url, token="bob") as bob:
        for refused in (bob.services.get(llm.id), bob.services.scale(llm.id, min_replicas=0),
                        bob.services.delete(llm.id), bob.services.logs(llm.id),
                        bob.services.cache(tenant="team-a")):  # fmt: skip
            with pytest.raises(Forbidden):
                await refused
        assert await bob.services.list() == []
    async with AsyncPortal(url, token="alice") as p:
        assert (await p.services.get(llm.id)).state.value == "active"  # bob changed nothing
        assert (await p.services.delete(llm.id)).state.value == "deleted"
