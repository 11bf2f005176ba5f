"""Idle release and resume with real ``ray start`` processes: a cluster busy with a task is
not released; once every node has been idle for ``idle_s`` (as the head's GCS reports), its
workers stop and its quota is free while the head keeps running; ``resume`` brings the
workers back through admission and tasks run on them. With ``idle_suspend`` the head stops
too, its Ray session directory is removed, and a resumed cluster runs at a new address.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.ray import RayState
from policies.requests import DeviceRequest
from portal.allocator import Allocator
from portal.ray.controller import RayController
from portal.ray.local import LocalRay, cluster_of, head_key
from portal.ray.spec import RaySpec
from portal.store.writer import Store
from tests.portal.allocator.conftest import hgx
from tests.portal.ray.test_local_ray import H100, VERSION, allocated, running_up, tasks, until
from tests.support.ray_guard import nodes_end_with_tests

pytestmark = pytest.mark.slow

BUSY = textwrap.dedent(
    """
    import os, sys, time
    import ray
    ray.init(address=sys.argv[1], log_to_driver=False)

    @ray.remote(num_gpus=1)
    def busy(seconds):
        time.sleep(seconds)

    ray.get(busy.remote(float(sys.argv[2])), timeout=300)
    os._exit(0)
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
    alloc.set_quota("team-a", H100, guaranteed=1, limit=1)
    with nodes_end_with_tests(tmp_path / "ray"):
        backend = LocalRay(tmp_path / "ray")
        rays = RayController(alloc, backend=backend, idle_check_s=1.0)
        rays.start()
        yield alloc, rays, backend
        for c in rays.clusters():
            rays.delete(c.cluster.id)
        for key, start in backend.adopt():  # whatever a failed step left running
            backend.runner.stop(key, start, 0.0)
    store.close()


def spec(idle_s: float, *, suspend: bool = False) -> RaySpec:
    assert VERSION is not None
    return RaySpec(
        tenant="team-a",
        owner="alice",
        name="rl",
        devices=DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({H100})),
        min_workers=1,
        max_workers=1,
        workers=1,
        ray_version=VERSION,
        idle_s=idle_s,
        idle_suspend=suspend,
    )


def nodes(backend: LocalRay, cid: str) -> set[str]:
    return {key for key, _ in backend.adopt() if cluster_of(key) == cid}


def test_a_busy_cluster_stays_an_idle_one_gives_its_workers_back_and_resumes(
    rig: tuple[Allocator, RayController, LocalRay], tmp_path: Path
) -> None:
    alloc, rays, backend = rig
    cid = rays.create(spec(20.0)).cluster.id
    until(rays, "head and worker", running_up(rays, cid, 1), 420)
    address = rays.view(cid).cluster.address
    assert address is not None

    # A task of 30 s on the worker: the cluster is read busy and stays running throughout.
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    driver = subprocess.Popen([sys.executable, str(script), address, "30"], env=env)
    try:
        while driver.poll() is None:
            rays.step()
            assert rays.view(cid).cluster.state is RayState.RUNNING
            time.sleep(0.5)
    finally:
        driver.kill()
        driver.wait()
    assert driver.returncode == 0

    # Then 20 s with nothing: workers stopped and released, the head kept.
    until(rays, "idle", lambda: rays.view(cid).cluster.state is RayState.IDLE, 180)
    assert alloc.workloads() == []
    until(rays, "the worker ended", lambda: nodes(backend, cid) == {head_key(cid)}, 60)
    view = rays.view(cid)
    assert (view.joined, view.cluster.address) == (0, address)

    # Resume: the worker comes back through admission, joins the same head, and runs tasks.
    rays.resume(cid)
    until(rays, "resumed", running_up(rays, cid, 1), 420)
    assert rays.view(cid).cluster.address == address
    pinned = allocated(alloc, rays.view(cid))
    assert len(pinned) == 1
    assert set(tasks(address, tmp_path)) == pinned


def test_a_suspended_cluster_stops_every_node_removes_its_session_and_resumes(
    rig: tuple[Allocator, RayController, LocalRay], tmp_path: Path
) -> None:
    alloc, rays, backend = rig
    cid = rays.create(spec(2.0, suspend=True)).cluster.id
    until(rays, "head and worker", running_up(rays, cid, 1), 420)
    first = rays.view(cid).cluster.address
    session = backend.session_dir(cid)
    assert session.is_dir()

    until(rays, "suspended", lambda: rays.view(cid).cluster.state is RayState.SUSPENDED, 180)
    assert alloc.workloads() == []
    assert rays.view(cid).cluster.address is None
    until(rays, "every node ended, the session removed", lambda: not session.exists(), 60)
    assert nodes(backend, cid) == set()

    rays.resume(cid)
    until(rays, "resumed", running_up(rays, cid, 1), 420)
    address = rays.view(cid).cluster.address
    assert address is not None and address != first
    assert set(tasks(address, tmp_path)) == allocated(alloc, rays.view(cid))
