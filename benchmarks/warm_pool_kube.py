"""Time to first token from zero on the Kubernetes backend, with and without a warm pool.

``python -m benchmarks.warm_pool_kube [--load-seconds 20] [--rounds 1] [--json OUT]``

A control plane with kwok (``tests.support.k8s``), one tenant reconciled and one kwok node of
8 H100s; the service controller over a real allocator (SQLite) with the Kubernetes backend,
and the portal's binder, stepped every ``SERVICES_INTERVAL_S`` as in ``gpuportal serve``.
kwok runs no container, so each replica pod's engine is a real test-engine process on this
host (``tests.support.pod_engines``, reached through the backend's ``reach``, its health
joined to the pod's readiness). Per round and per mode the service (``min: 0, max: 1``) is
brought to rest at zero serving replicas, then one request takes the gateway's path
(``benchmarks.warm_pool``'s: ``touch``, held until a replica is ready, streamed from the
engine); the time to its first token is taken from the request's arrival.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client

from benchmarks.warm_pool import _first_token_s, _wait, summary
from policies.flavors import FlavorKind
from policies.isolation import IsolationSettings, TenantSpec
from policies.requests import DeviceRequest
from policies.services import ModelRef, Replicas, ReplicaState
from portal.allocator import Allocator
from portal.inference.controller import ServiceController
from portal.inference.kube import kube_backend
from portal.inference.service import SERVICES_INTERVAL_S
from portal.inference.spec import Engine, Preset, ServiceSpec
from portal.inventory.kubernetes import to_node
from portal.isolation import reconcile
from portal.kube.binder import Binder
from portal.store import services as stored
from portal.store.writer import Store

SETTINGS = IsolationSettings()
TENANT = TenantSpec(
    name="benchwarm", gpu_limits={"H100-80GB": 8}, cpu_millis=32000, memory_mib=65536, pods=20
)
NODE = "bench-h100"
MODEL = ModelRef("hf://org/tiny-llm", "sha256:" + "ab" * 32)


def one_round(c: ServiceController, warm: int) -> dict[str, Any]:
    spec = ServiceSpec(
        tenant=TENANT.name,
        owner="bench",
        name="llm",
        engine=Engine(preset=Preset.TEST),
        model=MODEL,
        devices=DeviceRequest(kind=FlavorKind.GPU, count=1, models=frozenset({"H100-80GB"})),
        replicas=Replicas(min=0, max=1, warm=warm),
    )
    sid = c.deploy(spec).service.id

    def live() -> list[Any]:
        return stored.replicas(c.store, sid, live=True)

    if warm:
        _wait(lambda: [r.state for r in live()] == [ReplicaState.ASLEEP], "the pool", 180)
    else:  # deploy starts one replica: bring the service to zero first
        c.record_scaling(c.get(sid), 0, 0.0, None)
        _wait(lambda: not live(), "zero replicas", 180)
    with httpx.Client() as http:
        ttft = _first_token_s(c, sid, time.monotonic(), http)
    serving = next(r for r in live() if r.state is ReplicaState.READY)
    c.delete(sid)
    _wait(lambda: not live(), "the replicas to end", 60)
    return {"warm": warm, "ttft_s": round(ttft, 3), "woken_from_pool": serving.woken_at is not None}


def run(load_s: float, rounds: int, work: Path) -> dict[str, Any]:
    from tests.support import gpu_nodes
    from tests.support.k8s import running_cluster
    from tests.support.pod_engines import PodEngines

    model_dir = work / "tiny-llm"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"layers": 2}')
    engines = PodEngines(model_dir, "llm", load_s)
    results: list[dict[str, Any]] = []
    # On a loaded host kwok's node heartbeats come late; the node lifecycle controller then
    # marks every pod NotReady, which kwok never undoes (a cold start would wait forever).
    flags = {"kube-controller-manager": ["--node-monitor-grace-period=10m"]}
    with running_cluster(work / "k8s", flags) as cluster, cluster.api_client() as api:
        reconcile([TENANT], SETTINGS, api)
        cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node(NODE, rack="rack-bench"))
        core = client.CoreV1Api(api)

        def untainted() -> bool:
            spec = core.read_node(NODE).spec
            return spec is not None and not spec.taints

        _wait(untainted, "the not-ready taint leaving the node", 60)
        node = to_node(api.sanitize_for_serialization(core.read_node(NODE)))
        assert node is not None
        store = Store(f"sqlite:///{work / 'portal.db'}")
        alloc = Allocator(store)
        alloc.start([node])
        alloc.set_tenant(TENANT.name)
        alloc.set_quota(TENANT.name, "H100-80GB", guaranteed=2, limit=2)
        backend = engines.backend(kube_backend(api, SETTINGS, work, reach=engines.reach))
        c = ServiceController(alloc, backend=backend, stop_grace_s=0)
        c.start()
        binder = Binder(api, alloc, SETTINGS)
        stop = threading.Event()

        def loop() -> None:  # the allocator, services and binder loops of ``gpuportal serve``
            while not stop.wait(SERVICES_INTERVAL_S):
                alloc.tick()
                c.step()
                binder.bind_pending()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            for n in range(rounds):
                for warm in (1, 0):
                    results.append({"round": n + 1, **one_round(c, warm)})
                    print(json.dumps(results[-1]), flush=True)
        finally:
            stop.set()
            thread.join()
            engines.close()
            store.close()
    return {
        "backend": "kubernetes (kwok; test-engine processes per pod)",
        **summary(results, load_s, rounds),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.warm_pool_kube", description=__doc__)
    p.add_argument("--load-seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="warm-kube-") as tmp:
        out = run(args.load_seconds, args.rounds, Path(tmp))
    med = out["median_ttft_s"]
    print(
        f"Kubernetes: median time to first token from zero: warm 1 {med['warm_1']:.2f} s, "
        f"warm 0 {med['warm_0']:.2f} s (load {args.load_seconds:g} s, {args.rounds} rounds)"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
