"""The test engine as a real process: it reads the model at start, reports loading on its
health path, answers OpenAI-style completions (streamed and not, deterministic), counts
waiting and running requests under vLLM's metric names, and sleeps and wakes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from portal.inference.testengine import read_model, reply_words
from tests.support.ports import free_port


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tiny-llm"
    d.mkdir()
    (d / "config.json").write_text('{"layers": 2}')
    (d / "weights.bin").write_bytes(b"\x01" * 3_000_000)
    return d


def start(model_dir: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "portal.inference.testengine", "--model-dir", str(model_dir),
         "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def wait_health(url: str, timeout: float = 20) -> list[int]:
    """The health codes seen until it answered 200."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            code = httpx.get(f"{url}/health", timeout=2).status_code
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        seen.append(code)
        if code == 200:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"no healthy engine at {url}: {seen}")


@pytest.fixture
def engine(model_dir: Path) -> Iterator[str]:
    proc, url = start(model_dir, "--token-seconds", "0.002")
    wait_health(url)
    yield url
    proc.terminate()
    proc.wait(10)


def test_it_reads_the_model_and_is_unhealthy_while_loading(model_dir: Path) -> None:
    proc, url = start(model_dir, "--load-seconds", "1.5")
    try:
        started = time.monotonic()
        seen = wait_health(url)
        took = time.monotonic() - started
        assert 503 in seen and seen[-1] == 200
        assert took >= 1.4
        (card,) = httpx.get(f"{url}/v1/models").json()["data"]
        assert card["id"] == "tiny-llm"
        assert card["digest"] == read_model(model_dir)[1]
    finally:
        proc.terminate()
        out = proc.communicate(timeout=10)[0].decode()
    assert "3000013 bytes" in out  # both files were read


def test_completions_are_deterministic_streamed_or_not(engine: str) -> None:
    body = {"model": "tiny-llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    r = httpx.post(f"{engine}/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    assert text == " ".join(reply_words("user: hi", 5))
    assert r.json()["usage"]["completion_tokens"] == 5
    again = httpx.post(f"{engine}/v1/chat/completions", json=body).json()
    assert again["choices"][0]["message"]["content"] == text
    with httpx.stream("POST", f"{engine}/v1/chat/completions", json={**body, "stream": True}) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    pieces = [json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]]
    assert "".join(pieces) == text
    plain = httpx.post(f"{engine}/v1/completions", json={"prompt": "hi", "max_tokens": 3}).json()
    assert plain["choices"][0]["text"] == " ".join(reply_words("hi", 3))
    bad = httpx.post(f"{engine}/v1/completions", json={"prompt": "hi", "max_tokens": 0})
    assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]["message"]
    other = httpx.post(f"{engine}/v1/completions", json={"model": "gpt-9", "prompt": "x"})
    assert other.status_code == 404


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in {text}")


def test_metrics_count_waiting_and_running_requests_under_vllm_names(model_dir: Path) -> None:
    proc, url = start(model_dir, "--token-seconds", "0.05", "--max-running", "2")
    try:
        wait_health(url)
        body = {"prompt": "load", "max_tokens": 40}  # 2 s each
        threads = [
            threading.Thread(target=httpx.post, args=(f"{url}/v1/completions",),
                             kwargs={"json": body, "timeout": 30})
            for _ in range(5)
        ]  # fmt: skip
        for t in threads:
            t.start()
        time.sleep(0.7)
        text = httpx.get(f"{url}/metrics").text
        assert metric(text, "vllm:num_requests_running") == 2
        assert metric(text, "vllm:num_requests_waiting") == 3
        for t in threads:
            t.join()
        text = httpx.get(f"{url}/metrics").text
        assert metric(text, "vllm:num_requests_waiting") == 0
        assert metric(text, "vllm:time_to_first_token_seconds_count") == 5
        # The last ones waited for a slot: their first token came after two whole replies.
        assert metric(text, "vllm:time_to_first_token_seconds_sum") > 3 * 2.0
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_sleeping_engine_refuses_completions_until_woken(engine: str) -> None:
    assert httpx.post(f"{engine}/sleep").status_code == 200
    assert httpx.get(f"{engine}/is_sleeping").json() == {"is_sleeping": True}
    r = httpx.post(f"{engine}/v1/completions", json={"prompt": "x"})
    assert r.status_code == 503
    httpx.post(f"{engine}/wake_up")
    assert httpx.post(f"{engine}/v1/completions", json={"prompt": "x"}).status_code == 200
