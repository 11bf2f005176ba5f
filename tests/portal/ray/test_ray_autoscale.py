"""Autoscaler-driven growth with real ``ray start`` processes: GPU tasks that Ray cannot
schedule on the workers it has make the portal ask for more workers, each increase its own
slice through admission; within quota the new worker joins and runs the waiting task, beyond
quota the increase waits with the allocator's reason while the running part keeps running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.ray import SliceState
from policies.requests import DeviceRequest
from portal.allocator import Allocator
from portal.ray.controller import RayController
from portal.ray.local import LocalRay
from portal.ray.spec import RaySpec
from portal.store.writer import Store
from tests.portal.allocator.conftest import hgx
from tests.portal.ray.test_local_ray import H100, VERSION, allocated, running_up, until
from tests.support.ray_guard import nodes_end_with_tests

pytestmark = pytest.mark.slow

# Two 1-GPU tasks that hold their GPU until the test lets them go, then a third once both
# run: on a cluster of one worker, the second and then the third are unmet demand.
DRIVER = textwrap.dedent(
    """
    import os, pathlib, sys, time
    import ray
    ray.init(address=sys.argv[1], log_to_driver=False)
    here = pathlib.Path(sys.argv[2])

    @ray.remote(num_gpus=1)
    def hold(i):
        (here / f"started-{i}").write_text(os.environ["CUDA_VISIBLE_DEVICES"])
        while not (here / "go").exists():
            time.sleep(0.2)

    first = [hold.remote(i) for i in (1, 2)]
    while not all((here / f"started-{i}").exists() for i in (1, 2)):
        time.sleep(0.2)
    ray.get(first + [hold.remote(3)], timeout=300)
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
    alloc.set_quota("team-a", H100, guaranteed=2, limit=2)
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


def test_unmet_gpu_demand_adds_a_worker_within_quota_and_waits_beyond_it(
    rig: tuple[Allocator, RayController, LocalRay], tmp_path: Path
) -> None:
    alloc, rays, _ = rig
    assert VERSION is not None
    spec = RaySpec(
        tenant="team-a",
        owner="alice",
        name="rl",
        devices=DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({H100})),
        min_workers=1,
        max_workers=3,
        workers=1,
        ray_version=VERSION,
        autoscale=True,
    )
    cid = rays.create(spec).cluster.id
    until(rays, "head and worker", running_up(rays, cid, 1), 420)
    address = rays.view(cid).cluster.address
    assert address is not None

    here = tmp_path / "driver"
    here.mkdir()
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    driver = subprocess.Popen([sys.executable, str(script), address, str(here)], env=env)
    try:
        # The second task waits in Ray: one more worker, its own slice, joins and runs it.
        def second_ran() -> bool:
            v = rays.view(cid)
            return v.joined == 2 and (here / "started-2").exists()

        until(rays, "a worker added for the waiting task", second_ran, 300)
        view = rays.view(cid)
        assert [(s.slice.number, s.slice.workers, s.slice.state) for s in view.slices] == [
            (1, 1, SliceState.RUNNING),
            (2, 1, SliceState.RUNNING),
        ]
        ran = {(here / f"started-{i}").read_text() for i in (1, 2)}
        assert ran == allocated(alloc, view)  # each task on a device the portal allocated

        # The third task: the increase is asked for and waits (the tenant's limit is 2),
        # while both running slices and their workers are left as they are.
        def third_waits() -> bool:
            return len(rays.view(cid).slices) == 3

        until(rays, "the increase beyond quota requested", third_waits, 120)
        for _ in range(3):
            rays.step()
        view = rays.view(cid)
        third = view.slices[2]
        assert (third.slice.workers, third.slice.state) == (1, SliceState.QUEUED)
        assert third.workload is not None
        assert third.workload.reason == "quota", third.workload.message
        assert [s.slice.state for s in view.slices[:2]] == [SliceState.RUNNING] * 2
        assert view.joined == 2 and rays.view(cid).cluster.spec["workers"] == 3

        # Let the tasks finish: the third runs on a freed worker; nothing more is asked for.
        (here / "go").write_text("")
        assert driver.wait(300) == 0
    finally:
        driver.kill()
        driver.wait()
    assert len(rays.view(cid).slices) == 3
