"""Replays traces against services of a real portal, one tenant per cell (trace × engine load
time × strategy), every cell at once on one event loop, through the gateway with each
tenant's user token.

A request is a streamed completion; its time to first token is taken from its scheduled
arrival (the client's own lag included) to the first token's event. Whether it met a cold
start is the gateway's count of requests it held (no ready replica: scale from zero, a wake
from the warm pool, or every replica still starting), per service. GPU-seconds come from the
portal's cost route over the replay's window; quota use is sampled from the allocator's state
(``/api/v1/usage``) every ``SAMPLE_S`` during the replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from benchmarks.inference.serve import ADMIN, FLAVOR, Portal, bearer, user_token
from benchmarks.inference.strategies import STEP_S, Bounds, Strategy
from benchmarks.inference.traces import Trace

SAMPLE_S = 0.5
SAMPLE_TIMEOUT_S = 10.0
SETTLE_POLL_S = 0.5
NAME = "llm"


@dataclass(frozen=True, slots=True)
class Engine:
    """The test engine's knobs and the services' scaling rule, the same for every cell."""

    token_seconds: float = 0.05
    max_tokens: int = 4
    max_running: int = 2
    max_replicas: int = 2
    target: float = 2.0  # concurrency per replica
    down_window_s: float = 10.0
    idle_s: float = 20.0


@dataclass(frozen=True, slots=True)
class Cell:
    trace: Trace
    load_s: float
    strategy: Strategy

    @property
    def tenant(self) -> str:
        return f"{self.trace.kind}-{self.load_s:g}".replace(".", "p") + f"-{self.strategy.name}"

    def bounds(self, engine: Engine) -> Bounds:
        return self.strategy.bounds(engine.max_replicas)


@dataclass
class Tally:
    """What the client saw of one cell's requests."""

    ttft_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    # Per request: (scheduled arrival, s into the trace; its TTFT, None if unanswered).
    requests: list[tuple[float, float | None]] = field(default_factory=list)
    # Every ``STEP_S``: (s into the trace, desired, ready, asleep) of the service.
    states: list[tuple[float, int, int, int]] = field(default_factory=list)

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def service_body(cell: Cell, engine: Engine, model_uri: str, digest: str) -> dict[str, Any]:
    args = ["--load-seconds", f"{cell.load_s:g}", "--token-seconds", f"{engine.token_seconds:g}"]
    return {
        "tenant": cell.tenant,
        "name": NAME,
        "engine": {"preset": "test", "args": [*args, "--max-running", str(engine.max_running)]},
        "model": {"uri": model_uri, "digest": digest},
        "devices": {"kind": "gpu", "count": 1},
        "replicas": cell.bounds(engine).spec(),
        "scaling": {
            "metric": "concurrency",
            "target": engine.target,
            "up_window_s": 2,
            "down_window_s": engine.down_window_s,
            "idle_s": engine.idle_s,
        },
    }


class _Scaler:
    def __init__(self, client: httpx.AsyncClient, sid: str, tenant: str) -> None:
        self._client, self._sid, self._tenant = client, sid, tenant

    async def set_bounds(self, bounds: Bounds) -> None:
        r = await self._client.patch(
            f"/api/v1/services/{self._sid}",
            json={"replicas": bounds.spec()},
            headers=bearer(user_token(self._tenant)),
        )
        r.raise_for_status()

    async def serving(self) -> int:
        r = await self._client.get(
            f"/api/v1/services/{self._sid}", headers=bearer(user_token(self._tenant))
        )
        r.raise_for_status()
        return int(r.json()["desired"])


def deploy(
    portal: Portal, cells: Sequence[Cell], engine: Engine, uri: str, digest: str
) -> list[str]:
    ids = []
    for cell in cells:
        with httpx.Client(base_url=portal.url, headers=bearer(user_token(cell.tenant))) as c:
            r = c.post("/api/v1/services", json=service_body(cell, engine, uri, digest), timeout=60)
            if r.status_code != 201:
                raise RuntimeError(f"deploy {cell.tenant}: {r.status_code} {r.text}")
            ids.append(r.json()["id"])
    return ids


def settle(
    portal: Portal, cells: Sequence[Cell], ids: Sequence[str], engine: Engine, timeout_s: float
) -> None:
    """Wait until every service is at rest: its ``min`` replicas ready, its warm pool asleep,
    nothing else live (a reactive service has gone back to zero after its first replica)."""
    deadline = time.monotonic() + timeout_s
    with portal.admin() as c:
        while True:
            pending = []
            for cell, sid in zip(cells, ids, strict=True):
                s = c.get(f"/api/v1/services/{sid}").json()
                b = cell.bounds(engine)
                rest = (s["ready"], s["asleep"], len(s["replicas"])) == (
                    b.minimum,
                    b.warm,
                    b.minimum + b.warm,
                )
                if not rest:
                    pending.append(
                        f"{cell.tenant}: ready {s['ready']} asleep {s['asleep']} "
                        f"live {len(s['replicas'])} ({s['state']} {s['message']})"
                    )
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not at rest after {timeout_s:.0f} s: " + "; ".join(pending))
            time.sleep(SETTLE_POLL_S)


async def _request(
    client: httpx.AsyncClient, cell: Cell, engine: Engine, due: float, n: int, tally: Tally
) -> None:
    at = cell.trace.arrivals[n]
    before = len(tally.ttft_s)
    try:
        await _ask(client, cell, engine, due, n, tally)
    finally:
        answered = len(tally.ttft_s) > before
        tally.requests.append((at, tally.ttft_s[-1] if answered else None))


async def _ask(
    client: httpx.AsyncClient, cell: Cell, engine: Engine, due: float, n: int, tally: Tally
) -> None:
    body = {
        "model": NAME,
        "prompt": f"request {n} of {cell.tenant}",
        "max_tokens": engine.max_tokens,
        "stream": True,
    }
    url = f"/gateway/{cell.tenant}/{NAME}/v1/completions"
    first: float | None = None
    try:
        async with client.stream(
            "POST", url, json=body, headers=bearer(user_token(cell.tenant))
        ) as r:
            if r.status_code != 200:
                await r.aread()
                tally.error(str(r.status_code))
                return
            async for line in r.aiter_lines():
                if first is None and line.startswith("data: ") and line != "data: [DONE]":
                    first = time.monotonic() - due
    except httpx.HTTPError as exc:
        tally.error(type(exc).__name__)
        return
    if first is None:
        tally.error("no token")
    else:
        tally.ttft_s.append(first)


async def _play(
    client: httpx.AsyncClient, cell: Cell, engine: Engine, t0: float, tally: Tally
) -> None:
    tasks = []
    for n, at in enumerate(cell.trace.arrivals):
        due = t0 + at
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        tasks.append(asyncio.create_task(_request(client, cell, engine, due, n, tally)))
    await asyncio.gather(*tasks)


async def _plan(client: httpx.AsyncClient, cell: Cell, sid: str, t0: float, end: float) -> None:
    scaler = _Scaler(client, sid, cell.tenant)
    while (now := time.monotonic()) < end:
        # A step the portal did not answer (a loaded machine) is skipped: the next one tries.
        with contextlib.suppress(httpx.HTTPError):
            await cell.strategy.step(scaler, now - t0, cell.trace.seen_by(now - t0))
        await asyncio.sleep(STEP_S)


async def _watch(
    client: httpx.AsyncClient, cell: Cell, sid: str, t0: float, end: float, tally: Tally
) -> None:
    """The service's replicas every ``STEP_S``: what a request arriving then found."""
    headers = bearer(user_token(cell.tenant))
    while (now := time.monotonic()) < end:
        try:
            r = await client.get(
                f"/api/v1/services/{sid}", headers=headers, timeout=SAMPLE_TIMEOUT_S
            )
            s = r.json()
            tally.states.append((now - t0, s["desired"], s["ready"], s["asleep"]))
        except (httpx.HTTPError, ValueError, KeyError):
            pass  # a missed sample: the breakdown reads the one before
        await asyncio.sleep(STEP_S)


@dataclass
class QuotaWatch:
    """Every sample of the allocator's quota use: violations are rows above their limit."""

    samples: int = 0
    missed: int = 0  # samples the portal did not answer within SAMPLE_TIMEOUT_S
    violations: dict[str, int] = field(default_factory=dict)
    most_used: dict[str, int] = field(default_factory=dict)

    async def run(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                r = await client.get(
                    "/api/v1/usage",
                    params={"limit": 500},
                    headers=bearer(ADMIN),
                    timeout=SAMPLE_TIMEOUT_S,
                )
            except httpx.TimeoutException:
                self.missed += 1
                continue
            r.raise_for_status()
            self.samples += 1
            for row in r.json()["items"]:
                if row["flavor"] != FLAVOR:
                    continue
                t = row["tenant"]
                self.most_used[t] = max(self.most_used.get(t, 0), row["used"])
                if row["used"] > row["limit"]:
                    self.violations[t] = self.violations.get(t, 0) + 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE_S)


async def replay(
    portal: Portal, cells: Sequence[Cell], ids: Sequence[str], engine: Engine
) -> tuple[list[Tally], QuotaWatch, datetime, datetime]:
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=portal.url, timeout=900, limits=limits) as client:
        tallies = [Tally() for _ in cells]
        watch = QuotaWatch()
        stop = asyncio.Event()
        started = datetime.now(UTC)
        t0 = time.monotonic() + 0.5
        end = t0 + max(c.trace.duration_s for c in cells)
        sampler = asyncio.create_task(watch.run(client, stop))
        plans = [
            asyncio.create_task(_plan(client, c, s, t0, end))
            for c, s in zip(cells, ids, strict=True)
        ] + [
            asyncio.create_task(_watch(client, c, s, t0, end, t))
            for c, s, t in zip(cells, ids, tallies, strict=True)
        ]
        try:
            await asyncio.gather(
                *(_play(client, c, engine, t0, t) for c, t in zip(cells, tallies, strict=True))
            )
            await asyncio.gather(*plans)
        finally:
            stop.set()
            for p in plans:
                p.cancel()
            await sampler
        return tallies, watch, started, datetime.now(UTC)


def report(
    portal: Portal,
    cells: Sequence[Cell],
    ids: Sequence[str],
    tallies: Sequence[Tally],
    watch: QuotaWatch,
    window: tuple[datetime, datetime],
    engine: Engine,
) -> list[dict[str, Any]]:
    with portal.admin() as c:
        params = {"start": window[0].isoformat(), "end": window[1].isoformat()}
        cost = c.get("/api/v1/cost/services", params=params)
        cost.raise_for_status()
        hours = {s["service_id"]: s for s in cost.json()["services"]}
        rows = []
        for cell, sid, tally in zip(cells, ids, tallies, strict=True):
            traffic = c.get(f"/api/v1/services/{sid}").json()["traffic"]
            requests = len(cell.trace.arrivals)
            p50, p99 = quantile(tally.ttft_s, 0.5), quantile(tally.ttft_s, 0.99)
            rows.append(
                {
                    "trace": cell.trace.kind.value,
                    "load_s": cell.load_s,
                    "strategy": cell.strategy.name,
                    "requests": requests,
                    "answered": len(tally.ttft_s),
                    "errors": dict(tally.errors),
                    "cold": traffic["held_total"],
                    "cold_share": round(traffic["held_total"] / requests, 4) if requests else 0.0,
                    "gateway_served": traffic["served"],
                    "gateway_refused": traffic["refused"],
                    "ttft_p50_s": None if p50 is None else round(p50, 3),
                    "ttft_p99_s": None if p99 is None else round(p99, 3),
                    "gpu_s_serving": round(hours[sid]["serving_gpu_hours"] * 3600, 1),
                    "gpu_s_warm": round(hours[sid]["warm_gpu_hours"] * 3600, 1),
                    "quota_limit": cell.bounds(engine).gpus,
                    "most_gpus_used": watch.most_used.get(cell.tenant, 0),
                    "quota_violations": watch.violations.get(cell.tenant, 0),
                }
            )
    return rows
