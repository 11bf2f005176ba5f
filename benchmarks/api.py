"""API overhead on allocation requests, and read throughput, at a realistic scale.

``python -m benchmarks.api --gpus 10000 [--requests 1000] [--read-seconds 5] [--clients 4]
[--json OUT.json]`` builds N GPUs as 8-GPU H100 nodes, 20 tenants with quotas, fills the
cluster to about 75 % with running workloads of 1, 2, 4 and 8 GPUs and queues 200 more behind
their tenants' limits. It then serves the portal API the way ``gpuportal serve`` does (uvicorn
on loopback, one process, the same middleware, metrics and JSON request log, the log written to
/dev/null) and measures:

1. ``Allocator.request`` called directly: a 1-GPU request that is allocated at once, then
   released (the release is not timed), ``--requests`` times;
2. the same over HTTP: ``POST /api/v1/workloads`` with an ``Idempotency-Key``, timed by the
   client from sending to the parsed answer, on one keep-alive connection; the overhead is the
   difference of the two distributions' percentiles. Direct and HTTP requests alternate, so
   both see the same load on a shared machine;
3. requests/s of ``GET /api/v1/queue`` (first page of 100, each with its ETA) and
   ``GET /api/v1/usage`` (every tenant and flavor), from one client and from ``--clients``
   concurrent clients, each for ``--read-seconds``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadRequest
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.api.metrics import ServiceMetrics
from portal.inventory.simulated import generate
from portal.service import logs
from portal.service.decisions import ReportingStore

TENANTS = 20
TOKEN = "benchmark-token-000000000001"
FLAVOR = "H100-80GB"


def gpu_request(tenant: str, n: int, name: str) -> WorkloadRequest:
    return WorkloadRequest(tenant, "bench", name, DeviceRequest(kind=FlavorKind.GPU, count=n))


def load(alloc: Allocator, gpus: int, rng: random.Random) -> tuple[int, int]:
    """Tenants, quotas, running work (~75 % of the GPUs) and 200 queued requests; returns
    (running, queued)."""
    share = gpus // TENANTS
    for i in range(TENANTS):
        alloc.set_tenant(f"t{i:02d}")
        alloc.set_quota(f"t{i:02d}", FLAVOR, guaranteed=share * 4 // 5, limit=share)
    running = 0
    for i in range(TENANTS):
        # Half the tenants run up to their limit (borrowing), half at about half of it.
        target = share if i < TENANTS // 2 else share // 2
        used = 0
        while used < target:
            n = min(rng.choice((1, 2, 4, 8)), target - used)
            status = alloc.request(gpu_request(f"t{i:02d}", n, f"run-{running}"))
            assert status.state.value == "running", status
            used += n
            running += 1
    queued = 0
    for i in range(TENANTS // 2):  # behind their limits
        for _ in range(20):
            status = alloc.request(gpu_request(f"t{i:02d}", rng.choice((1, 2, 4, 8)), "q"))
            assert status.state.value == "queued", status
            queued += 1
    return running, queued


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    ms = sorted(s / 1e6 for s in samples_ns)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"p50_ms": q[49], "p90_ms": q[89], "p99_ms": q[98], "max_ms": ms[-1]}


def time_pairs(
    alloc: Allocator, client: httpx.Client, tenant: str, n: int
) -> tuple[list[int], list[int]]:
    """``n`` direct requests and ``n`` over HTTP, alternating, so both see the same load on a
    shared machine; each is released (untimed) before the next."""
    direct, over_http = [], []
    body = {"tenant": tenant, "name": "http", "devices": {"kind": "gpu", "count": 1}}
    for i in range(n):
        req = gpu_request(tenant, 1, f"direct-{i}")
        began = time.perf_counter_ns()
        status = alloc.request(req, idempotency_key=uuid.uuid4().hex)
        direct.append(time.perf_counter_ns() - began)
        assert status.state.value == "running", status
        alloc.release(status.id)

        headers = {"Idempotency-Key": uuid.uuid4().hex}
        began = time.perf_counter_ns()
        r = client.post("/api/v1/workloads", json=body, headers=headers)
        answer = r.json()
        over_http.append(time.perf_counter_ns() - began)
        assert r.status_code == 201, r.text
        client.delete(f"/api/v1/workloads/{answer['id']}").raise_for_status()
    return direct, over_http


def rate(base_url: str, path: str, clients: int, seconds: float) -> float:
    """Requests/s answered 200 by ``clients`` threads, each on its own connection."""
    counts = [0] * clients
    stop = time.monotonic() + seconds

    def run(k: int) -> None:
        with httpx.Client(base_url=base_url, headers=auth()) as c:
            while time.monotonic() < stop:
                c.get(path).raise_for_status()
                counts[k] += 1

    began = time.monotonic()
    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - began)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


class Serving:
    """The app on uvicorn in a background thread, on a free loopback port."""

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.api", description=__doc__)
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=1_000)
    ap.add_argument("--read-seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    sink = io.TextIOWrapper(io.FileIO(os.devnull, "w"))
    logs.configure("json", "info", sink)
    say: Callable[[str], None] = lambda m: print(m, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        store = ReportingStore(f"sqlite:///{tmp}/portal.sqlite")
        try:
            alloc = Allocator(store)
            began = time.monotonic()
            alloc.start(generate({"hgx-h100-8": args.gpus // 8}))
            running, queued = load(alloc, args.gpus, random.Random(args.seed))
            say(f"loaded {running} running, {queued} queued in {time.monotonic() - began:.1f} s")
            metrics = ServiceMetrics(alloc)
            store.listeners.append(lambda outcome, _e: metrics.decided(outcome))
            caller = Caller("bench", CallerKind.SERVICE, frozenset({Scope.ADMIN.value}))
            app = create_app(alloc, StaticAuthenticator({TOKEN: caller}), metrics=metrics)
            tenant = f"t{TENANTS - 1:02d}"  # below its guarantee: allocated at once
            with Serving(app) as url, httpx.Client(base_url=url, headers=auth()) as client:
                direct, over_http = time_pairs(alloc, client, tenant, args.requests)
                reads = {
                    f"{path} x{n}": rate(url, path, n, args.read_seconds)
                    for path in ("/api/v1/queue", "/api/v1/usage", "/health")
                    for n in (1, args.clients)
                }
        finally:
            store.close()
    d, h = percentiles(direct), percentiles(over_http)
    result = {
        "gpus": args.gpus,
        "running": running,
        "queued": queued,
        "requests": args.requests,
        "direct": d,
        "http": h,
        "overhead_ms": {k: h[k] - d[k] for k in ("p50_ms", "p90_ms", "p99_ms")},
        "reads_per_s": reads,
        "machine": f"{platform.python_version()} {os.cpu_count()} cpus",
    }
    say("| measure | p50 ms | p90 ms | p99 ms | max ms |")
    say("|---|---:|---:|---:|---:|")
    for name, p in (("Allocator.request", d), ("POST /api/v1/workloads", h)):
        say(
            f"| {name} | {p['p50_ms']:.2f} | {p['p90_ms']:.2f} | {p['p99_ms']:.2f} | "
            f"{p['max_ms']:.1f} |"
        )
    o = result["overhead_ms"]
    say(f"| overhead | {o['p50_ms']:.2f} | {o['p90_ms']:.2f} | {o['p99_ms']:.2f} | |")
    say("\n| read | clients | requests/s |\n|---|---:|---:|")
    for key, value in reads.items():
        path, n = key.split(" x")
        say(f"| GET {path} | {n} | {value:,.0f} |")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
