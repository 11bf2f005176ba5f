"""The gateway's overhead: the same requests at a fixed rate sent straight to a replica and
through the gateway (with a user token), latency compared percentile by percentile.

The replica is fast (no load time, no time per token, one token, many at once), so what
differs is the gateway's path: authentication, the route lookup, the forwarded request and
the relayed answer. Direct and gateway blocks of ``BLOCK_S`` alternate, so both see the same
load on a shared machine. Each request is timed from its send to the end of its answer (the
whole body, or the whole event stream).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import httpx

from benchmarks.inference.replay import NAME, quantile
from benchmarks.inference.serve import Portal, bearer, user_token

TENANT = "gw-overhead"
BLOCK_S = 1.0
WARMUP = 50
IDLE_S = 3.0
"""How long (at most; no longer than a mode's blocks) the portal's CPU is measured with no
requests (its loops' own work), to tell the gateway's CPU per request apart from it."""


def service_body(uri: str, digest: str) -> dict[str, Any]:
    return {
        "tenant": TENANT,
        "name": NAME,
        "engine": {
            "preset": "test",
            "args": ["--token-seconds", "0", "--max-running", "1000"],
        },
        "model": {"uri": uri, "digest": digest},
        "devices": {"kind": "gpu", "count": 1},
        "replicas": {"min": 1, "max": 1},
    }


def deploy_ready(portal: Portal, uri: str, digest: str, timeout_s: float) -> str:
    """Deploy the fast service; its replica's base URL once it is ready."""
    with httpx.Client(base_url=portal.url, headers=bearer(user_token(TENANT)), timeout=30) as c:
        r = c.post("/api/v1/services", json=service_body(uri, digest))
        if r.status_code != 201:
            raise RuntimeError(f"deploy {TENANT}: {r.status_code} {r.text}")
        sid = r.json()["id"]
        deadline = time.monotonic() + timeout_s
        while True:
            s = c.get(f"/api/v1/services/{sid}").json()
            ports = [x["port"] for x in s["replicas"] if x["state"] == "ready"]
            if ports:
                return f"http://127.0.0.1:{ports[0]}"
            if time.monotonic() > deadline:
                raise TimeoutError(f"the overhead service is not ready: {s['message']}")
            time.sleep(0.2)


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str],
               out: list[float], errors: list[str]) -> None:  # fmt: skip
    began = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            await r.aread()
            if r.status_code != 200:
                errors.append(str(r.status_code))
                return
    except httpx.HTTPError as exc:
        errors.append(type(exc).__name__)
        return
    out.append(time.perf_counter() - began)


async def _block(client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str],
                 rate: float, n: int, out: list[float], errors: list[str]) -> None:  # fmt: skip
    """``n`` requests at ``rate`` per second, open loop (each sent on time, not after the last
    answer)."""
    start = time.perf_counter()
    tasks = []
    for i in range(n):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(_one(client, url, body, headers, out, errors)))
    await asyncio.gather(*tasks)


async def measure(
    portal: Portal,
    replica: str,
    rate: float,
    seconds: float,
    others: Sequence[tuple[str, Portal]] = (),
) -> list[dict[str, Any]]:
    """Direct and through ``portal``'s gateway; with ``others`` (label, a portal of another
    tree with its own ready service), through theirs too, in the same alternating blocks:
    the variants compared side by side under the same load."""
    token = bearer(user_token(TENANT))
    gateways = {"": portal, **dict(others)}
    rows = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for stream in (False, True):
            body = {"model": NAME, "prompt": "hi", "max_tokens": 1, "stream": stream}
            paths: dict[str, tuple[str, dict[str, str]]] = {
                "direct": (f"{replica}/v1/completions", {})
            } | {
                label: (f"{p.url}/gateway/{TENANT}/{NAME}/v1/completions", token)
                for label, p in gateways.items()
            }
            times: dict[str, list[float]] = {mode: [] for mode in paths}
            errors: dict[str, list[str]] = {mode: [] for mode in paths}
            for url, headers in paths.values():  # open the connections, untimed
                await _block(client, url, body, headers, rate, WARMUP, [], [])
            per_block = max(1, round(rate * BLOCK_S))
            idle_began = time.monotonic()
            idle_before = {label: p.cpu_s() for label, p in gateways.items()}
            await asyncio.sleep(min(IDLE_S, seconds))  # short runs (the smoke test) stay short
            idle_s = time.monotonic() - idle_began
            idle_rate = {k: (gateways[k].cpu_s() - v) / idle_s for k, v in idle_before.items()}
            cpu = dict.fromkeys(gateways, 0.0)
            busy_s = dict.fromkeys(gateways, 0.0)
            for _ in range(max(1, round(seconds / BLOCK_S))):
                for mode, (url, headers) in paths.items():
                    gw = gateways.get(mode)
                    before, began = (0.0 if gw is None else gw.cpu_s()), time.monotonic()
                    await _block(client, url, body, headers, rate, per_block, times[mode],
                                 errors[mode])  # fmt: skip
                    if gw is not None:
                        cpu[mode] += gw.cpu_s() - before
                        busy_s[mode] += time.monotonic() - began
            for label in gateways:
                row = _row(stream, rate, times["direct"], times[label], errors["direct"],
                           errors[label])  # fmt: skip
                if others:
                    row["variant"] = label or "this tree"
                # The portal's CPU during its gateway blocks per request: its loops' own work
                # (services, autoscaler) is in it too, a small part at this rate.
                served = max(1, len(times[label]))
                row["portal_cpu_ms_per_request"] = round(1000 * cpu[label] / served, 2)
                # The same without the loops' work, at the rate measured idle just before.
                row["portal_idle_cpu_ms_per_s"] = round(1000 * idle_rate[label], 1)
                net = cpu[label] - idle_rate[label] * busy_s[label]
                row["portal_cpu_ms_per_request_net"] = round(1000 * net / served, 2)
                rows.append(row)
    return rows


def _ms(values: Sequence[float], q: float) -> float | None:
    v = quantile(values, q)
    return None if v is None else round(v * 1000, 3)


def _row(
    stream: bool,
    rate: float,
    direct: list[float],
    gateway: list[float],
    direct_errors: list[str],
    gateway_errors: list[str],
) -> dict[str, Any]:
    row: dict[str, Any] = {"route": "completions, stream" if stream else "completions",
                           "rate_per_s": rate}  # fmt: skip
    for mode, times, errors in (("direct", direct, direct_errors),
                                ("gateway", gateway, gateway_errors)):  # fmt: skip
        row[f"{mode}_requests"] = len(times) + len(errors)
        row[f"{mode}_errors"] = len(errors)
        row[f"{mode}_p50_ms"] = _ms(times, 0.5)
        row[f"{mode}_p99_ms"] = _ms(times, 0.99)
    for q in ("p50", "p99"):
        gw, d = row[f"gateway_{q}_ms"], row[f"direct_{q}_ms"]
        row[f"added_{q}_ms"] = None if gw is None or d is None else round(gw - d, 3)
    return row
