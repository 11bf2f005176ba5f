"""The test engine: a small OpenAI-compatible server standing in for vLLM in tests and the demo.

``python -m portal.inference.testengine --model-dir DIR --port N [--load-seconds S]``

It is a test double of the engine process only, so it behaves as an engine does where the
portal can see it:

- **loading**: at start it reads every file under ``--model-dir`` (so a bigger model takes
  longer, and the bytes it read and their digest are reported), then waits out what is left
  of ``--load-seconds``; ``/health`` answers 503 until then, 200 after (vLLM's health path);
- ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions``, streamed as server-sent
  events (``"stream": true``) or not; the text is deterministic (a function of the prompt),
  ``max_tokens`` words, one every ``--token-seconds``;
- at most ``--max-running`` requests generate at once; the others wait, as in an engine's
  scheduler, and ``/metrics`` reports both under vLLM's names:
  ``vllm:num_requests_waiting``, ``vllm:num_requests_running`` and the
  ``vllm:time_to_first_token_seconds`` histogram (arrival to first token);
- ``POST /sleep`` and ``POST /wake_up`` like vLLM's sleep mode (``GET /is_sleeping``): a
  sleeping engine answers completions with 503 until woken.

Only the standard library, uvicorn and prometheus_client (both already dependencies).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from portal.inference.digest import folder_digest

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu")  # fmt: skip
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
MAX_TOKENS = 4096


def reply_words(prompt: str, n: int) -> list[str]:
    """``n`` words that depend only on ``prompt``: the same question gets the same answer on
    every replica, so a test can check an answer without knowing which replica gave it."""
    seed = hashlib.sha256(prompt.encode()).digest()
    out = []
    for i in range(n):
        h = hashlib.sha256(seed + i.to_bytes(4, "big")).digest()
        out.append(WORDS[h[0] % len(WORDS)])
    return out


def read_model(model_dir: Path) -> tuple[int, str]:
    """Read every file under ``model_dir`` (the load); return the bytes read and the model's
    digest as ``portal.inference.digest`` defines it."""
    total = 0

    def seen(n: int) -> None:
        nonlocal total
        total += n

    digest = folder_digest(model_dir, seen)
    return total, digest


@dataclass
class Engine:
    """The engine's state; one per process."""

    model: str
    model_dir: Path
    load_seconds: float = 0.0
    token_seconds: float = 0.01
    max_running: int = 4
    ready: bool = False
    sleeping: bool = False
    bytes_read: int = 0
    digest: str = ""
    load_took_s: float = 0.0
    waiting: int = 0
    running: int = 0
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        labels = ["model_name"]
        self._waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting to run.", labels, registry=self.registry
        )
        self._running = Gauge(
            "vllm:num_requests_running", "Requests generating.", labels, registry=self.registry
        )
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Arrival to first token, seconds.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self._slots = asyncio.Semaphore(self.max_running)

    async def load(self) -> None:
        """Read the model, then wait out the rest of ``load_seconds``."""
        started = time.monotonic()
        self.bytes_read, self.digest = await asyncio.to_thread(read_model, self.model_dir)
        rest = self.load_seconds - (time.monotonic() - started)
        if rest > 0:
            await asyncio.sleep(rest)
        self.load_took_s = time.monotonic() - started
        self.ready = True
        print(
            f"loaded {self.model} from {self.model_dir}: {self.bytes_read} bytes, "
            f"{self.digest}, {self.load_took_s:.2f} s",
            flush=True,
        )

    def metrics(self) -> bytes:
        self._waiting.labels(self.model).set(self.waiting)
        self._running.labels(self.model).set(self.running)
        return generate_latest(self.registry)

    async def generate(self, prompt: str, n: int, arrived: float) -> Any:
        """The reply's words, one per ``token_seconds``, once a slot is free."""
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            for i, word in enumerate(reply_words(prompt, n)):
                await asyncio.sleep(self.token_seconds)
                if i == 0:
                    self._ttft.labels(self.model).observe(time.monotonic() - arrived)
                yield word
        finally:
            self.running -= 1
            self._slots.release()


class BadRequest(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def _prompt_of(body: dict[str, Any], chat: bool) -> str:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest(400, "messages: expected a non-empty list of {role, content}")
        parts = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str):
                raise BadRequest(400, "messages: each needs a string content")
            parts.append(f"{m.get('role', 'user')}: {m['content']}")
        return "\n".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest(400, "prompt: expected a string")
    return prompt


class App:
    """The ASGI application over one ``Engine``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        arrived = time.monotonic()
        method, path = scope["method"], scope["path"]
        try:
            if (method, path) == ("GET", "/health"):
                if self.engine.ready:
                    await _json(send, 200, {"status": "ok"})
                else:
                    await _json(send, 503, {"status": "loading"})
            elif (method, path) == ("GET", "/metrics"):
                await _respond(send, 200, self.engine.metrics(), CONTENT_TYPE_LATEST)
            elif (method, path) == ("GET", "/v1/models"):
                await _json(send, 200, self._models())
            elif (method, path) == ("GET", "/is_sleeping"):
                await _json(send, 200, {"is_sleeping": self.engine.sleeping})
            elif (method, path) == ("POST", "/sleep"):
                self.engine.sleeping = True
                await _json(send, 200, {"is_sleeping": True})
            elif (method, path) == ("POST", "/wake_up"):
                self.engine.sleeping = False
                await _json(send, 200, {"is_sleeping": False})
            elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
                body = await _body(receive)
                await self._complete(send, body, path.endswith("chat/completions"), arrived)
            else:
                raise BadRequest(404, f"no route {method} {path}", "not_found_error")
        except BadRequest as e:
            await _json(send, e.status, {"error": {"message": str(e), "type": e.kind}})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._loading = asyncio.create_task(self.engine.load())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _models(self) -> dict[str, Any]:
        e = self.engine
        card = {"id": e.model, "object": "model", "owned_by": "gpuportal-testengine"}
        return {"object": "list", "data": [{**card, "root": str(e.model_dir), "digest": e.digest}]}

    async def _complete(self, send: Send, raw: bytes, chat: bool, arrived: float) -> None:
        e = self.engine
        if not e.ready:
            raise BadRequest(503, "the model is still loading", "service_unavailable")
        if e.sleeping:
            raise BadRequest(503, "the engine is asleep: POST /wake_up", "service_unavailable")
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            raise BadRequest(400, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest(400, "the body must be a JSON object")
        if body.get("model", e.model) != e.model:
            raise BadRequest(404, f"model {body.get('model')!r} not served: {e.model}", "NotFound")
        n = body.get("max_tokens", 16)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TOKENS:
            raise BadRequest(400, f"max_tokens: expected 1 to {MAX_TOKENS}, got {n!r}")
        prompt = _prompt_of(body, chat)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{hashlib.sha256(os.urandom(8)).hexdigest()[:16]}"
        base = {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": e.model,
        }
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": n}
        usage["total_tokens"] = usage["prompt_tokens"] + n
        if not body.get("stream"):
            words = [w async for w in e.generate(prompt, n, arrived)]
            text = " ".join(words)
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            await _json(send, 200, {**base, "choices": [choice], "usage": usage})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        chunk = {**base, "object": "chat.completion.chunk" if chat else "text_completion"}
        first = True
        async for word in e.generate(prompt, n, arrived):
            piece = word if first else f" {word}"
            first = False
            delta: dict[str, Any] = (
                {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                if chat
                else {"index": 0, "text": piece, "finish_reason": None}
            )
            await _sse(send, {**chunk, "choices": [delta]})
        end: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            end["delta"] = {}
        else:
            end["text"] = ""
        await _sse(send, {**chunk, "choices": [end], "usage": usage})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def _body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def _respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _json(send: Send, status: int, data: object) -> None:
    await _respond(send, status, json.dumps(data).encode(), "application/json")


async def _sse(send: Send, data: object) -> None:
    body = f"data: {json.dumps(data)}\n\n".encode()
    await send({"type": "http.response.body", "body": body, "more_body": True})


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m portal.inference.testengine", description=__doc__)
    p.add_argument("--model-dir", type=Path, required=True, help="the model's files, read at start")
    p.add_argument(
        "--served-model-name", default=None, help="the model's id (default: the folder's name)"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--load-seconds", type=float, default=0.0, help="load time at least this long")
    p.add_argument("--token-seconds", type=float, default=0.01, help="seconds per generated word")
    p.add_argument("--max-running", type=int, default=4, help="requests generating at once")
    args = p.parse_args(argv)
    if not args.model_dir.is_dir():
        p.error(f"--model-dir {args.model_dir}: no such folder")
    if args.load_seconds < 0 or args.token_seconds < 0 or args.max_running < 1:
        p.error("--load-seconds and --token-seconds must be >= 0, --max-running >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    args = parse_args(sys.argv[1:] if argv is None else argv)
    name = args.served_model_name or args.model_dir.name
    engine = Engine(name, args.model_dir, args.load_seconds, args.token_seconds, args.max_running)
    uvicorn.run(App(engine), host=args.host, port=args.port, log_level="warning", lifespan="on")
    return 0


if __name__ == "__main__":
    sys.exit(main())
