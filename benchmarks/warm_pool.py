"""Time to first token from zero, with and without a warm pool.

``python -m benchmarks.warm_pool [--load-seconds 20] [--rounds 3] [--json OUT]``

A service controller over a real allocator (SQLite) with the local backend: each replica a
real test-engine process (``portal.inference.testengine --load-seconds S``), its loop stepped
every ``SERVICES_INTERVAL_S`` as in ``gpuportal serve``. Per round and per mode, a service of
``min: 0, max: 1`` is brought to rest at zero serving replicas — with ``warm: 1`` its pool
replica loaded and asleep, with ``warm: 0`` nothing running — then one request comes the
gateway's way (``touch``, then held until a replica is ready, polled every ``HOLD_POLL_S``)
and is streamed from the engine; the time to its first token is taken from the request's
arrival. The woken replica's log is read to show it loaded once (no cold load on wake).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.requests import DeviceRequest
from policies.services import ModelRef, Replicas, ReplicaState
from policies.topology import LinkClass, Topology
from portal.allocator import Allocator
from portal.inference.backend import local_backend
from portal.inference.controller import ServiceController
from portal.inference.gateway import HOLD_POLL_S
from portal.inference.service import SERVICES_INTERVAL_S
from portal.inference.spec import Engine, Preset, ServiceSpec
from portal.inference.testengine import read_model
from portal.store import services as stored
from portal.store.writer import Store

FLAVOR = "H100-80GB"


def _node() -> Node:
    gpus = tuple(GPU(i, FLAVOR, 81920, uuid=f"GPU-bench-{i}") for i in range(2))
    return Node("bench", gpus, 32_000, 131_072, topology=Topology.uniform(2, LinkClass.NVSWITCH))


def _model(folder: Path) -> ModelRef:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_bytes(b"\0" * (1 << 20))
    return ModelRef(folder.as_uri(), read_model(folder)[1])


def _wait(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.05)


def _first_token_s(c: ServiceController, sid: str, arrived: float, http: httpx.Client) -> float:
    """The gateway's path: wake the service, hold until a replica is ready, then stream."""
    c.touch(sid)
    while not (urls := c.ready_urls(sid)):
        time.sleep(HOLD_POLL_S)
    body = {"model": "llm", "prompt": "hello", "max_tokens": 4, "stream": True}
    with http.stream("POST", urls[0] + "/v1/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                return time.monotonic() - arrived
    raise RuntimeError("the engine streamed no token")


def one_round(
    c: ServiceController, model: ModelRef, warm: int, load_s: float, http: httpx.Client
) -> dict[str, Any]:
    spec = ServiceSpec(
        tenant="bench",
        owner="bench",
        name="llm",
        engine=Engine(
            preset=Preset.TEST,
            args=("--load-seconds", str(load_s), "--token-seconds", "0.001"),
        ),
        model=model,
        devices=DeviceRequest(kind=FlavorKind.GPU, count=1),
        replicas=Replicas(min=0, max=1, warm=warm),
    )
    sid = c.deploy(spec).service.id
    settle = load_s * 3 + 60

    def live() -> list[Any]:
        return stored.replicas(c.store, sid, live=True)

    if warm:
        _wait(lambda: [r.state for r in live()] == [ReplicaState.ASLEEP], "the pool", settle)
    else:  # deploy starts one replica: bring the service to zero first
        c.record_scaling(c.get(sid), 0, 0.0, None)
        _wait(lambda: not live(), "zero replicas", settle)
    ttft = _first_token_s(c, sid, time.monotonic(), http)
    serving = next(r for r in live() if r.state is ReplicaState.READY)
    log = c.log_path(sid, serving.number)
    loads = log.read_text().count("loaded llm") if log is not None else -1
    c.delete(sid)
    _wait(lambda: not live(), "the replicas to end", 60)
    return {"warm": warm, "ttft_s": round(ttft, 3), "loads_of_serving_replica": loads}


def run(load_s: float, rounds: int, folder: Path) -> dict[str, Any]:
    store = Store(f"sqlite:///{folder / 'portal.db'}")
    alloc = Allocator(store)
    alloc.start([_node()])
    alloc.set_tenant("bench")
    alloc.set_quota("bench", FLAVOR, guaranteed=2, limit=2)
    c = ServiceController(alloc, backend=local_backend(folder / "services"))
    c.start()
    stop = threading.Event()

    def loop() -> None:  # the services loop of ``gpuportal serve``
        while not stop.wait(SERVICES_INTERVAL_S):
            c.step()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    model = _model(folder / "model")
    results: list[dict[str, Any]] = []
    http = httpx.Client()  # the gateway's client lives as long as the portal
    try:
        for n in range(rounds):
            for warm in (1, 0):
                results.append({"round": n + 1, **one_round(c, model, warm, load_s, http)})
                print(json.dumps(results[-1]), flush=True)
    finally:
        stop.set()
        thread.join()
        http.close()
        for svc in stored.active_services(store):
            c.delete(svc.id)
        store.close()
    return summary(results, load_s, rounds)


def summary(results: list[dict[str, Any]], load_s: float, rounds: int) -> dict[str, Any]:
    """The rounds' results with the median time to first token with and without a warm pool."""
    by = {w: [r["ttft_s"] for r in results if r["warm"] == w] for w in (1, 0)}
    return {
        "load_seconds": load_s,
        "rounds": rounds,
        "median_ttft_s": {"warm_1": statistics.median(by[1]), "warm_0": statistics.median(by[0])},
        "results": results,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.warm_pool", description=__doc__)
    p.add_argument("--load-seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = run(args.load_seconds, args.rounds, Path(tmp))
    med = out["median_ttft_s"]
    print(
        f"median time to first token from zero: warm 1 {med['warm_1']:.2f} s, "
        f"warm 0 {med['warm_0']:.2f} s (load {args.load_seconds:g} s, {args.rounds} rounds)"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
