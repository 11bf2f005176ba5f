"""Ray clusters on the local backend with real ``ray start`` processes: a cluster of 2
workers runs 20 GPU tasks, each on the device its worker's allocation holds; a killed worker
is replaced and the next tasks succeed; growth past the quota waits with its reason while the
running part keeps running; a restarted portal re-adopts the nodes; delete stops and releases
everything.

One cluster serves every step (``ray start`` takes tens of seconds on a small machine); the
GPUs are the simulated inventory's, so the check is that Ray hands each task exactly the
``CUDA_VISIBLE_DEVICES`` the allocator chose (the lowest boundary: no driver is asked).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.ray import RayState, SliceState
from policies.requests import DeviceRequest
from portal.allocator import Allocator
from portal.ray.controller import RayController, RayView
from portal.ray.local import LocalRay, worker_key
from portal.ray.spec import RaySpec, installed_ray_version
from portal.store.writer import Store
from tests.portal.allocator.conftest import hgx
from tests.support.ray_guard import nodes_end_with_tests

pytestmark = pytest.mark.slow

H100 = "H100-80GB"
VERSION = installed_ray_version()

TASKS = textwrap.dedent(
    """
    import json, os, sys, time
    import ray
    ray.init(address=sys.argv[1], log_to_driver=False)

    # max_calls=0: keep the worker process between tasks (Ray starts a new one per GPU task
    # by default, seconds each on a small machine).
    @ray.remote(num_gpus=1, max_calls=0)
    def where(i):
        time.sleep(0.2)
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")

    print(json.dumps(ray.get([where.remote(i) for i in range(20)], timeout=240)), flush=True)
    os._exit(0)  # the driver's shutdown waits on the cluster: not what is measured here
    """
)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Allocator, RayController, LocalRay]]:
    if VERSION is None:
        pytest.skip("ray is not installed")
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store)
    alloc.start([hgx("n1")])
    alloc.set_tenant("team-a")
    alloc.set_quota("team-a", H100, guaranteed=2, limit=2)
    with nodes_end_with_tests(tmp_path / "ray"):
        backend = LocalRay(tmp_path / "ray")
        rays = RayController(alloc, backend=backend)
        rays.start()
        yield alloc, rays, backend
        for c in rays.clusters():
            rays.delete(c.cluster.id)
        for key, start in backend.adopt():  # whatever a failed step left running
            backend.runner.stop(key, start, 0.0)
    store.close()


def until(rays: RayController, what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        rays.step()
        time.sleep(0.2)


def tasks(address: str, tmp: Path) -> list[str]:
    script = tmp / "tasks.py"
    script.write_text(TASKS)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    out = subprocess.run(
        [sys.executable, str(script), address],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def allocated(alloc: Allocator, view: RayView) -> set[str]:
    devices: set[str] = set()
    for s in view.slices:
        if s.slice.state is SliceState.RUNNING:
            devices |= {
                str(g) for a in alloc.status(s.slice.workload_id).allocations for g in a.gpus
            }
    return devices


def member_pid(backend: LocalRay, key: str, start: int) -> int:
    member = backend.log_path(key, start).with_name("member.json")
    pid: int = json.loads(member.read_text())["pid"]
    return pid


def running_up(rays: RayController, cid: str, joined: int) -> Callable[[], bool]:
    def check() -> bool:
        v = rays.view(cid)
        return v.cluster.state is RayState.RUNNING and v.joined == joined

    return check


def test_a_cluster_runs_pinned_tasks_replaces_a_dead_worker_and_gives_everything_back(
    rig: tuple[Allocator, RayController, LocalRay], tmp_path: Path
) -> None:
    alloc, rays, backend = rig
    assert VERSION is not None
    spec = RaySpec(
        tenant="team-a",
        owner="alice",
        name="rl",
        devices=DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({H100})),
        min_workers=2,
        max_workers=4,
        workers=2,
        ray_version=VERSION,
    )
    cid = rays.create(spec).cluster.id
    until(rays, "head and 2 workers", running_up(rays, cid, 2), 420)
    view = rays.view(cid)
    address = view.cluster.address
    assert address is not None and address.startswith("127.0.0.1:")
    pinned = allocated(alloc, view)
    assert len(pinned) == 2

    # 20 tasks of one GPU each ran on exactly the allocated devices, both of them.
    assert set(tasks(address, tmp_path)) == pinned

    # Kill a worker's whole process group: it is started again on its allocation.
    key = worker_key(cid, 1, 0)
    start = backend.next_start(key) - 1
    os.killpg(member_pid(backend, key, start), signal.SIGKILL)
    until(rays, "the worker replaced", lambda: backend.next_start(key) == start + 2, 60)
    until(rays, "the replacement joined", running_up(rays, cid, 2), 420)
    assert allocated(alloc, rays.view(cid)) == pinned  # the same devices: within quota
    assert set(tasks(address, tmp_path)) == pinned

    # 2 -> 4 past team-a's limit of 2: +2 waits with its reason; the 2 keep running.
    running = {k: backend.next_start(k) - 1 for k in (worker_key(cid, 1, 0), worker_key(cid, 1, 1))}
    view = rays.scale(cid, 4)
    gang, grown = view.slices
    assert (grown.slice.workers, grown.slice.state) == (2, SliceState.QUEUED)
    assert grown.workload is not None and grown.workload.reason == "quota"
    rays.step()
    assert {k: backend.next_start(k) - 1 for k in running} == running
    assert gang.slice.state is SliceState.RUNNING
    assert rays.view(cid).joined == 2

    # A restarted portal re-adopts the nodes: no head or worker is started again.
    heads = rays.view(cid).cluster.head
    again = RayController(alloc, backend=LocalRay(tmp_path / "ray"))
    again.start()
    until(again, "re-adopted and running", lambda: again.view(cid).joined == 2, 30)
    assert again.view(cid).cluster.head == heads
    assert {k: backend.next_start(k) - 1 for k in running} == running

    # Down: every slice released, every node ended.
    done = again.delete(cid)
    assert done.cluster.state is RayState.STOPPED
    assert alloc.workloads() == []
    until(again, "every node ended", lambda: not backend.adopt(), 60)
