"""Spawn latency with and without a pre-started environment (decision 0013).

``python -m benchmarks.prestart --gpus 1000 [--spawns 100] [--imports 3] [--json OUT]``:

1. **devices placed**: the state of ``benchmarks.spawn`` (simulated inventory, 20 tenants,
   about 75 % of the H100s running; its queue cancelled, since the pool holds nothing while
   anyone waits), the API served as ``gpuportal serve`` serves it, with the pre-start pool of
   serve (``PrestartService``, 4 GPU-equivalents) holding placeholders of
   ``gpu:H100-80GB:1``. Each spawn is what the spawner's ``start()`` does before the server
   starts (the chosen offer, ``choose``, ``POST /workloads`` on the user's behalf), timed from
   request to the ``201`` with the devices, alternating: with the option key (adopts a
   placeholder in the same decision) and without it (placed on free capacity). Untimed between
   spawns: the release, and a pool round that puts the placeholder back.
2. **interpreter**: what a pre-started local interpreter would save, which is not built:
   a fresh ``python -c 'import jupyterhub.singleuser'`` (the single-user server's imports)
   against ``python -c pass``, wall and CPU of the child.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.api import Serving, percentiles
from benchmarks.spawn import TENANTS, TOKEN, inventory, load
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.inventory.simulated import generate
from portal.prestart.service import PrestartService, PrestartSettings
from portal.service import logs
from portal.service.decisions import ReportingStore
from portal.store.records import WorkloadState
from spawner import options as forms
from spawner.portal_api import SpawnerPortal

OPTION = "gpu:H100-80GB:1"
BUDGET_GPUS = 4.0
RATE_PER_HOUR = 6.0  # mean 1 spawn per 10 minutes: 2 placeholders kept


async def spawns(url: str, tenant: str, n: int, pre: PrestartService) -> dict[str, list[int]]:
    took: dict[str, list[int]] = {"adopted": [], "adopted_cpu": [], "free": [], "free_cpu": []}
    async with SpawnerPortal(url, TOKEN, timeout=60) as portal:
        for i in range(2 * n + 2):  # the first two are warm-ups
            adopt = i % 2 == 0
            pre.round()  # the pool as its loop keeps it (untimed)
            held = len(pre.pool.held().get(OPTION, []))
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
                option=OPTION if adopt else None,
            )
            took_ns = (time.perf_counter_ns() - wall, time.process_time_ns() - cpu)
            assert workload.state is WorkloadState.RUNNING, workload
            after = len(pre.pool.held().get(OPTION, []))
            assert held > 0 and after == (held - 1 if adopt else held), (held, after, adopt)
            await portal.release(workload.id)
            if i >= 2:
                key = "adopted" if adopt else "free"
                took[key].append(took_ns[0])
                took[f"{key}_cpu"].append(took_ns[1])
    return took


def interpreter(imports: int) -> dict[str, dict[str, float]]:
    """Wall and child CPU seconds of a fresh interpreter, bare and with the server's imports."""
    out: dict[str, dict[str, float]] = {}
    for label, code in (("bare", "pass"), ("singleuser", "import jupyterhub.singleuser")):
        walls, cpus = [], []
        for _ in range(imports):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            began = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            walls.append(time.perf_counter() - began)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        out[label] = {"wall_s_median": sorted(walls)[len(walls) // 2],
                      "cpu_s_median": sorted(cpus)[len(cpus) // 2]}  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.prestart", description=__doc__)
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--spawns", type=int, default=100, help="spawns per mode")
    ap.add_argument("--imports", type=int, default=3, help="interpreter starts per case (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    logs.configure("json", "info", io.TextIOWrapper(io.FileIO(os.devnull, "w")))
    with tempfile.TemporaryDirectory() as tmp:
        store = ReportingStore(f"sqlite:///{tmp}/portal.sqlite")
        try:
            alloc = Allocator(store)
            nodes = generate(inventory(args.gpus))
            alloc.start(nodes)
            running, _queued = load(alloc, random.Random(args.seed))
            for w in alloc.workloads():
                if w.state is WorkloadState.QUEUED:
                    alloc.release(w.id)
            pre = PrestartService(
                alloc,
                PrestartSettings(
                    budget_gpus=BUDGET_GPUS, horizon_s=600, tenant="platform", interval_s=5
                ),
            )
            pre.setup()
            pre.refresh()
            pre.rates = {OPTION: RATE_PER_HOUR}
            store.listeners.append(pre.on_decision)
            caller = Caller("spawner", CallerKind.SERVICE, frozenset({Scope.ADMIN.value}))
            app = create_app(alloc, StaticAuthenticator({TOKEN: caller}))
            app.state.prestart = pre
            with Serving(app) as url:
                took = asyncio.run(spawns(url + "/", f"t{TENANTS - 1:02d}", args.spawns, pre))
        finally:
            store.close()
    stats = {name: percentiles(samples) for name, samples in took.items()}
    started = interpreter(args.imports) if args.imports > 0 else {}
    result = {
        "gpus": sum(len(n.gpus) for n in nodes),
        "running": running,
        "spawns_per_mode": args.spawns,
        **stats,
        "interpreter": started,
        "load_average": os.getloadavg(),
        "machine": f"Python {platform.python_version()}, {os.cpu_count()} CPUs",
    }
    print(
        "| spawn to devices placed | p50 ms | p90 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|"
    )
    for name, label in (
        ("adopted", "adopting a placeholder (wall)"),
        ("free", "on free capacity (wall)"),
        ("adopted_cpu", "adopting a placeholder (CPU)"),
        ("free_cpu", "on free capacity (CPU)"),
    ):
        p = stats[name]
        print(
            f"| {label} | {p['p50_ms']:.2f} | {p['p90_ms']:.2f} | {p['p99_ms']:.2f} | "
            f"{p['max_ms']:.1f} |"
        )
    print("| fresh interpreter | wall s (median) | CPU s (median) |\n|---|---:|---:|")
    for label, v in started.items():
        print(f"| {label} | {v['wall_s_median']:.2f} | {v['cpu_s_median']:.2f} |")
    print(f"load average after the run: {result['load_average']}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
