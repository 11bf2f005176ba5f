"""Ray jobs on the local backend with real ``ray start`` processes: a one-off job gets a
cluster of its own through admission, its entrypoint runs as the driver with its runtime
environment (the task on the worker sees the ``env_vars`` and the ``working_dir``, and the
device its worker's allocation holds), and its end deletes the cluster and gives the quota
back. One cluster, a short entrypoint."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.jobs import JobState
from policies.ray import RayState
from policies.requests import DeviceRequest
from portal.allocator import Allocator
from portal.ray.controller import RayController
from portal.ray.drivers import LocalDrivers
from portal.ray.jobs import RayJobs
from portal.ray.jobspec import RayJobSpec
from portal.ray.local import LocalRay
from portal.ray.spec import RaySpec, installed_ray_version
from portal.store.writer import Store
from tests.portal.allocator.conftest import hgx
from tests.support.ray_guard import nodes_end_with_tests

pytestmark = pytest.mark.slow

H100 = "H100-80GB"
VERSION = installed_ray_version()

DRIVER = textwrap.dedent(
    """
    import os, sys, ray
    ray.init(log_to_driver=False)

    @ray.remote(num_gpus=1)
    def where():
        return [os.environ.get("GREETING"), os.path.exists("job.py"),
                os.environ.get("CUDA_VISIBLE_DEVICES")]

    print("task saw", ray.get(where.remote(), timeout=120), flush=True)
    """
)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Allocator, RayController, RayJobs]]:
    if VERSION is None:
        pytest.skip("ray is not installed")
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store)
    alloc.start([hgx("n1")])
    alloc.set_tenant("team-a")
    alloc.set_quota("team-a", H100, guaranteed=1, limit=1)
    with nodes_end_with_tests(tmp_path / "ray", tmp_path / "ray-jobs"):
        backend = LocalRay(tmp_path / "ray")
        rays = RayController(alloc, backend=backend)
        rays.start()
        drivers = LocalDrivers(tmp_path / "ray-jobs")
        yield alloc, rays, RayJobs(rays, drivers=drivers)
        for c in rays.clusters():
            rays.delete(c.cluster.id)
        for runner in (backend.runner, drivers.runner):  # whatever a failed step left running
            for key, start in runner.adopt():
                runner.stop(key, start, 0.0)
    store.close()


def test_a_one_off_job_runs_with_its_runtime_env_and_gives_its_quota_back(
    rig: tuple[Allocator, RayController, RayJobs], tmp_path: Path
) -> None:
    alloc, rays, jobs = rig
    assert VERSION is not None
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(DRIVER)
    cluster = RaySpec(
        tenant="team-a",
        owner="alice",
        name="one-off",
        devices=DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({H100})),
        min_workers=1,
        max_workers=1,
        workers=1,
        ray_version=VERSION,
    )
    spec = RayJobSpec(
        entrypoint="python job.py",
        working_dir=str(work),
        env_vars=(("GREETING", "hello"),),
    )
    jid = jobs.submit_one_off(cluster, spec).job.id
    [held] = alloc.workloads("team-a")
    pinned = {str(g) for a in held.allocations for g in a.gpus}

    deadline = time.monotonic() + 420
    while not jobs.get(jid).state.terminal:
        assert time.monotonic() < deadline, jobs.view(jid)
        rays.step()
        jobs.step()
        time.sleep(0.2)

    view = jobs.view(jid)
    log = jobs.read_log(jid, 1, 0, 1 << 20).data.decode()
    assert view.job.state is JobState.SUCCEEDED, (view, log[-3000:])
    [attempt] = view.job.attempts
    assert (attempt.number, attempt.exit_code, attempt.reason) == (1, 0, "completed")
    # The task ran on the worker with the job's env_vars, in its working_dir, on the device
    # the cluster's allocation holds.
    assert f"task saw ['hello', True, '{next(iter(pinned))}']" in log, log[-3000:]
    # The cluster was the job's alone: deleted, every slice released, the quota free.
    assert view.cluster_state is RayState.STOPPED
    assert alloc.workloads() == []
