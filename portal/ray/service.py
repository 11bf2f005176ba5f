"""The Ray controller inside ``gpuportal serve``: over the service's allocator, with the
local backend when the inventory is this host's and ray is installed, driven by the ``ray``
loop."""

from __future__ import annotations

from portal.allocator import Allocator
from portal.ray.controller import RayController
from portal.ray.drivers import LocalDrivers
from portal.ray.jobs import RayJobs
from portal.ray.local import LocalRay
from portal.ray.spec import installed_ray_version
from portal.service.loops import Loops
from portal.settings import Settings

RAY_INTERVAL_S = 1.0
"""Seconds between rounds of the ``ray`` loop: how soon a placed slice's workers start, a
dead worker is replaced, or a shrink's slice is released."""

NO_KUBERNETES_BACKEND = (
    "Ray clusters run on the local backend only in this version: the Kubernetes backend "
    "(KubeRay) is not available yet"
)
NO_RAY = "the ray package is not installed beside the portal: pip install ray"


def build_for_service(allocator: Allocator, settings: Settings) -> RayController:
    """The service's Ray controller, started (running nodes re-adopted). Where no backend
    can run Ray, it still lists and deletes clusters and answers a create with 503."""
    if settings.inventory == "kubernetes":
        controller = RayController(allocator, refuse=NO_KUBERNETES_BACKEND)
    elif installed_ray_version() is None:
        controller = RayController(allocator, refuse=NO_RAY)
    else:
        controller = RayController(allocator, backend=LocalRay(settings.state_dir / "ray"))
    controller.start()
    return controller


def build_jobs_for_service(controller: RayController, settings: Settings) -> RayJobs:
    """The service's Ray jobs: their drivers run wherever the clusters' nodes do."""
    if controller.backend is None:
        return RayJobs(controller)
    return RayJobs(controller, drivers=LocalDrivers(settings.state_dir / "ray-jobs"))


def register_for_service(loops: Loops, controller: RayController, jobs: RayJobs) -> None:
    if controller.backend is None:
        return

    def round_() -> None:
        # Clusters first: a head that ended is seen (and started again) before the drivers
        # that lost it, so their exits count as the cluster's, not as the jobs' failures.
        controller.step()
        jobs.step()

    loops.add("ray", RAY_INTERVAL_S, round_)
