"""Notebook to usable Ray cluster, and how fast it grows, on the local backend with real Ray.

``python -m benchmarks.ray --runs 5 [--workers 2] [--grow 1] [--json OUT.json]`` serves the
portal API in this process as ``gpuportal serve`` does (the app on uvicorn on loopback, the
Ray controller driven by the ``ray`` loop's interval) over one simulated 8-GPU node, and from
the client's side, as a notebook would:

1. **usable**: ``Portal().ray.up(tenant, workers=N)`` — from the API call until the head is up
   and the ``N`` workers have joined (``up`` returns the address for ``ray.init``);
2. **admit**: ``Portal().ray.scale(id, N + grow)`` — until the answer, whose new slice is
   admitted (its workload holds devices) or not;
3. **join**: from the scale call until ``GET /api/v1/ray/{id}`` shows ``N + grow`` joined;
4. **idle read**: one read of every node's idle time from the head's GCS (the child
   interpreter the controller runs every ``idle_check_s`` for clusters with ``idle_s``).

With ``--autoscale`` the increase is Ray's instead (``workers.autoscale``): a driver submits
``N + grow`` one-GPU tasks that hold their GPU, so ``grow`` of them cannot be scheduled, and
from the moment they are submitted the benchmark measures until the increase's slice holds
its devices (**admitted**: the controller's demand read, every ``idle_check_s`` as in the
service, then admission) and until ``N + grow`` workers have joined (**joined**).

Each run takes the cluster down and waits until every node has ended before the next one.
Medians over ``--runs``; the machine's load average is printed, since ``ray start`` is
CPU-bound on a small machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.api import Serving
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.client import Portal
from portal.inventory.simulated import generate
from portal.ray.controller import RayController
from portal.ray.idle import Due
from portal.ray.local import LocalRay
from portal.ray.service import RAY_INTERVAL_S
from portal.ray.spec import installed_ray_version
from portal.store.writer import Store

TOKEN = "benchmark-token-000000000001"
TENANT = "bench"
FLAVOR = "H100-80GB"
POLL_S = 0.2


def _loop(rays: RayController, stop: threading.Event) -> None:
    """The service's ``ray`` loop: a round every ``RAY_INTERVAL_S``."""
    while not stop.wait(RAY_INTERVAL_S):
        rays.step()


def _until(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(POLL_S)


DRIVER = textwrap.dedent(
    """
    import os, pathlib, sys, time
    import ray
    ray.init(address=sys.argv[1], log_to_driver=False)
    flag = pathlib.Path(sys.argv[3])

    @ray.remote(num_gpus=1)
    def hold():
        while not flag.exists():
            time.sleep(0.1)

    held = [hold.remote() for _ in range(int(sys.argv[2]))]
    print("submitted", flush=True)
    ray.get(held, timeout=900)
    os._exit(0)
    """
)


def autoscale_run(
    portal: Portal, backend: LocalRay, workers: int, grow: int, timeout_s: float, tmp: Path
) -> dict[str, float]:
    began = time.monotonic()
    address = portal.ray.up(
        TENANT,
        workers=workers,
        max_workers=workers + grow,
        flavor=FLAVOR,
        autoscale=True,
        timeout_s=timeout_s,
        poll_s=POLL_S,
    )
    usable = time.monotonic() - began
    [cluster] = [c for c in portal.ray.list(TENANT) if c.state.value == "running"]
    flag = tmp / f"go-{cluster.id}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, address, str(workers + grow), str(flag)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert driver.stdout is not None
        if driver.stdout.readline().strip() != "submitted":
            raise RuntimeError("the driver did not submit its tasks")
        began = time.monotonic()

        def admitted() -> bool:
            s = portal.ray.get(cluster.id).slices
            return len(s) > 1 and s[-1].workload is not None and bool(s[-1].workload.allocations)

        _until("the increase admitted", admitted, timeout_s)
        admit = time.monotonic() - began
        _until(
            f"{workers + grow} workers joined",
            lambda: portal.ray.get(cluster.id).joined == workers + grow,
            timeout_s,
        )
        join = time.monotonic() - began
        flag.write_text("")
        driver.wait(timeout_s)
    finally:
        driver.kill()
        driver.wait()
    portal.ray.down(cluster.id)
    _until("every node ended", lambda: not backend.adopt(), 120)
    return {"usable_s": usable, "admit_s": admit, "join_s": join}


def one_run(
    portal: Portal, backend: LocalRay, workers: int, grow: int, timeout_s: float
) -> dict[str, float]:
    began = time.monotonic()
    address = portal.ray.up(
        TENANT,
        workers=workers,
        max_workers=workers + grow,
        flavor=FLAVOR,
        timeout_s=timeout_s,
        poll_s=POLL_S,
    )
    usable = time.monotonic() - began
    [cluster] = [c for c in portal.ray.list(TENANT) if c.state.value == "running"]

    began = time.monotonic()
    grown = portal.ray.scale(cluster.id, workers + grow)
    admit = time.monotonic() - began
    newest = grown.slices[-1]
    if newest.workload is None or newest.workload.state.value != "running":
        raise RuntimeError(f"the increase was not admitted: {newest}")
    _until(
        f"{workers + grow} workers joined",
        lambda: portal.ray.get(cluster.id).joined == workers + grow,
        timeout_s,
    )
    join = time.monotonic() - began

    began = time.monotonic()
    times = backend.read_heads([Due(cluster.id, 0, address)])
    idle_read = time.monotonic() - began
    if times.get(address) is None:
        raise RuntimeError(f"the head at {address} did not report its nodes' idle times")

    portal.ray.down(cluster.id)
    _until("every node ended", lambda: not backend.adopt(), 120)
    return {"usable_s": usable, "admit_ms": admit * 1000, "join_s": join, "idle_read_s": idle_read}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ray", description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2, help="workers admitted with the head")
    ap.add_argument("--grow", type=int, default=1, help="workers added by the increase")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one step may take")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--autoscale", action="store_true", help="the increase is Ray's unmet demand, not scale"
    )
    args = ap.parse_args(argv)
    version = installed_ray_version()
    if version is None:
        raise SystemExit("the ray package is not installed beside the portal")
    say: Callable[[str], None] = lambda m: print(m, flush=True)  # noqa: E731
    load_before = os.getloadavg()
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/portal.sqlite")
        stop = threading.Event()
        backend = LocalRay(Path(tmp) / "ray")
        try:
            alloc = Allocator(store)
            alloc.start(generate({"hgx-h100-8": 1}))
            alloc.set_tenant(TENANT)
            alloc.set_quota(TENANT, FLAVOR, guaranteed=8, limit=8)
            rays = RayController(alloc, backend=backend)
            rays.start()
            caller = Caller("bench", CallerKind.SERVICE, frozenset({Scope.ADMIN.value}))
            app = create_app(alloc, StaticAuthenticator({TOKEN: caller}), ray_controller=rays)
            loop = threading.Thread(target=_loop, args=(rays, stop), daemon=True)
            loop.start()
            with Serving(app) as url:
                portal = Portal(url, TOKEN)
                for n in range(args.runs):
                    if args.autoscale:
                        runs.append(
                            autoscale_run(
                                portal, backend, args.workers, args.grow, args.timeout, Path(tmp)
                            )
                        )
                        r = runs[-1]
                        say(
                            f"run {n + 1}: usable {r['usable_s']:.1f} s, demand to admitted "
                            f"{r['admit_s']:.1f} s, to joined {r['join_s']:.1f} s"
                        )
                        continue
                    runs.append(one_run(portal, backend, args.workers, args.grow, args.timeout))
                    r = runs[-1]
                    say(
                        f"run {n + 1}: usable {r['usable_s']:.1f} s, admit {r['admit_ms']:.0f} "
                        f"ms, join {r['join_s']:.1f} s, idle read {r['idle_read_s']:.2f} s"
                    )
            stop.set()
            loop.join(30)
        finally:
            stop.set()
            for key, start in backend.adopt():  # whatever a failed run left running
                backend.runner.stop(key, start, 0.0)
            store.close()
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    result = {
        "runs": runs,
        "median": medians,
        "workers": args.workers,
        "grow": args.grow,
        "ray": version,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "machine": f"{platform.python_version()} {os.cpu_count()} cpus",
    }
    say(f"\n| measure (median of {len(runs)}) | value |\n|---|---:|")
    m, w, g = medians, args.workers, args.grow
    say(f"| API call to usable cluster (head + {w} workers) | {m['usable_s']:.1f} s |")
    if args.autoscale:
        say(f"| unmet demand to increase {w} -> {w + g} admitted | {m['admit_s']:.1f} s |")
        say(f"| unmet demand to increase joined | {m['join_s']:.1f} s |")
    else:
        say(f"| increase {w} -> {w + g} admitted | {m['admit_ms']:.0f} ms |")
        say(f"| increase joined | {medians['join_s']:.1f} s |")
        say(f"| one idle read of a head's nodes | {medians['idle_read_s']:.2f} s |")
    say(
        "load average (1, 5, 15 min): before "
        + ", ".join(f"{x:.2f}" for x in load_before)
        + "; after "
        + ", ".join(f"{x:.2f}" for x in result["load_after"])
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
