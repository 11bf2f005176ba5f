"""Latency the portal adds to a JupyterHub spawn: the options form, and the allocation.

``python -m benchmarks.spawn --gpus 10000 [--spawns 500] [--json OUT.json]`` builds an
inventory of about N GPUs (88 % H100-80GB in 8-GPU NVSwitch nodes, 8 % A100-80GB in 4-GPU
NVLink-pair nodes, 4 % shareable T4s), 20 tenants with quotas on every flavor, fills it to about
75 % with running workloads and queues 200 more, then serves the portal API as ``gpuportal
serve`` does (uvicorn on loopback, the same app, middleware and metrics, the JSON request log
to /dev/null) and times, from the spawner's side and with its own code (``SpawnerPortal``,
``spawner.options``):

1. **form**: what ``get_options_form`` does for a user in one tenant: ``GET
   /tenants/{t}/offers`` (every option decided on the allocator's state) and ``render_form``;
2. **allocation**: what ``start()`` does before the server starts: ``GET
   /tenants/{t}/offers?option=<key>`` (the chosen option only) and ``choose`` (server-side
   validation of ``user_options``), then ``POST /workloads`` on the user's behalf with an
   idempotency key, answered ``201`` with the devices. Each allocation
   is released (untimed) before the next spawn.

Both are timed around the awaited calls, client included, one keep-alive connection; the
server's first decision per request shape builds placement indexes, so one warm-up spawn runs
before timing.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import random
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.api import Serving, percentiles
from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadRequest
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.api.metrics import ServiceMetrics
from portal.inventory.simulated import generate
from portal.service import logs
from portal.service.decisions import ReportingStore
from spawner import options as forms
from spawner.portal_api import SpawnerPortal

TENANTS = 20
TOKEN = "spawn-benchmark-token-0000000001"
OPTION = "gpu:H100-80GB:1"
H100 = frozenset({"H100-80GB"})


def inventory(gpus: int) -> dict[str, int]:
    """Node counts per preset for about ``gpus`` GPUs in the mix the module docstring gives."""
    return {
        "hgx-h100-8": max(1, gpus * 88 // 100 // 8),
        "a100-pcie-4-nvlink-pairs": max(1, gpus * 8 // 100 // 4),
        "t4-2": max(1, gpus * 4 // 100 // 2),
    }


def load(alloc: Allocator, rng: random.Random) -> tuple[int, int]:
    """Tenants with quotas on every flavor, ~75 % of the H100s running, 200 queued."""
    capacity = alloc.capacity
    for i in range(TENANTS):
        tenant = f"t{i:02d}"
        alloc.set_tenant(tenant)
        for flavor, amount in capacity.items():
            share = max(1, amount // TENANTS)
            alloc.set_quota(tenant, flavor, guaranteed=share * 4 // 5, limit=share)
    h100 = capacity["H100-80GB"] // TENANTS
    running = queued = 0
    for i in range(TENANTS - 1):  # the last tenant stays below its guarantee: spawns run at once
        used = 0
        target = h100 if i % 2 == 0 else h100 // 2
        while used < target:
            n = min(rng.choice((1, 2, 4, 8)), target - used)
            req = WorkloadRequest(
                f"t{i:02d}", "load", f"run-{running}", DeviceRequest(FlavorKind.GPU, n, H100)
            )
            assert alloc.request(req).state.value == "running"
            used += n
            running += 1
    for i in range(0, TENANTS - 1, 2):  # tenants at their limit queue more
        for _ in range(200 // ((TENANTS - 1) // 2 + 1)):
            req = WorkloadRequest(
                f"t{i:02d}", "load", f"wait-{queued}", DeviceRequest(FlavorKind.GPU, 1, H100)
            )
            assert alloc.request(req).state.value == "queued"
            queued += 1
    return running, queued


async def spawn_path(url: str, tenant: str, spawns: int) -> dict[str, list[int]]:
    """Wall and CPU nanoseconds of the form and the allocation for ``spawns`` simulated spawns
    of one user in ``tenant``. CPU time is this process's (client and server threads both):
    the work done, apart from waiting for a CPU on a busy machine."""
    took: dict[str, list[int]] = {
        "form": [],
        "allocation": [],
        "form_cpu": [],
        "allocation_cpu": [],
    }
    async with SpawnerPortal(url, TOKEN, timeout=60) as portal:
        for i in range(spawns + 1):  # the first is the warm-up
            wall, cpu = time.perf_counter_ns(), time.process_time_ns()
            offers = await portal.offers(tenant)
            html = forms.render_form([forms.TenantOffers(tenant, tuple(offers))])
            form = (time.perf_counter_ns() - wall, time.process_time_ns() - cpu)
            assert OPTION in html

            # As the mixin's start(): one offer, the chosen one, checked; then the request.
            wall, cpu = time.perf_counter_ns(), time.process_time_ns()
            offers = await portal.offers(tenant, [OPTION])
            choice = forms.choose(
                {"tenant": tenant, "option": OPTION}, [tenant], {tenant: offers}, user="u"
            )
            workload = await portal.request_for(
                "u",
                tenant,
                choice.offer.devices,
                name=f"u/{i}",
                idempotency_key=uuid.uuid4().hex,
                option=OPTION,
            )
            allocation = (time.perf_counter_ns() - wall, time.process_time_ns() - cpu)
            assert workload.state.value == "running", workload
            await portal.release(workload.id)
            if i:
                took["form"].append(form[0])
                took["form_cpu"].append(form[1])
                took["allocation"].append(allocation[0])
                took["allocation_cpu"].append(allocation[1])
    return took


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.spawn", description=__doc__)
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--spawns", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    logs.configure("json", "info", io.TextIOWrapper(io.FileIO(os.devnull, "w")))
    with tempfile.TemporaryDirectory() as tmp:
        store = ReportingStore(f"sqlite:///{tmp}/portal.sqlite")
        try:
            alloc = Allocator(store)
            began = time.monotonic()
            nodes = generate(inventory(args.gpus))
            alloc.start(nodes)
            gpus = sum(len(n.gpus) for n in nodes)
            running, queued = load(alloc, random.Random(args.seed))
            print(
                f"{gpus} GPUs on {len(nodes)} nodes; {running} running, {queued} queued; "
                f"loaded in {time.monotonic() - began:.1f} s",
                flush=True,
            )
            metrics = ServiceMetrics(alloc)
            store.listeners.append(lambda outcome, _e: metrics.decided(outcome))
            caller = Caller("spawner", CallerKind.SERVICE, frozenset({Scope.ADMIN.value}))
            app = create_app(alloc, StaticAuthenticator({TOKEN: caller}), metrics=metrics)
            with Serving(app) as url:
                took = asyncio.run(spawn_path(url + "/", f"t{TENANTS - 1:02d}", args.spawns))
        finally:
            store.close()
    stats = {name: percentiles(samples) for name, samples in took.items()}
    result = {
        "gpus": gpus,
        "nodes": len(nodes),
        "running": running,
        "queued": queued,
        "spawns": args.spawns,
        **stats,
        "load_average": os.getloadavg(),
        "machine": f"Python {platform.python_version()}, {os.cpu_count()} CPUs",
    }
    print("| step | p50 ms | p90 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|")
    for name, label in (
        ("form", "options form (wall)"),
        ("allocation", "allocation (wall)"),
        ("form_cpu", "options form (CPU)"),
        ("allocation_cpu", "allocation (CPU)"),
    ):
        p = stats[name]
        print(
            f"| {label} | {p['p50_ms']:.2f} | {p['p90_ms']:.2f} | {p['p99_ms']:.2f} | "
            f"{p['max_ms']:.1f} |"
        )
    print(f"load average after the run: {result['load_average']}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
