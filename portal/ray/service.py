"""The Ray controller inside ``gpuportal serve``: over the service's allocator, with the
local backend when the inventory is this host's and ray is installed, or RayClusters for the
KubeRay operator on Kubernetes (``portal.ray.kube``), driven by the ``ray`` loop."""

from __future__ import annotations

from policies.isolation import IsolationSettings
from portal.allocator import Allocator
from portal.kube.service import cluster_client
from portal.ray.controller import RayController
from portal.ray.drivers import LocalDrivers
from portal.ray.idle import probe_python
from portal.ray.jobs import RayJobs
from portal.ray.kube import KubeRay, head_reader
from portal.ray.kubedrivers import KubeDrivers
from portal.ray.local import LocalRay, ray_program
from portal.ray.spec import installed_ray_version
from portal.ray.tokens import RayTokens, key_for
from portal.service.loops import Loops
from portal.settings import Settings

RAY_INTERVAL_S = 1.0
"""Seconds between rounds of the ``ray`` loop: how soon a placed slice's workers start, a
dead worker is replaced, or a shrink's slice is released."""

NO_RAY = "the ray package is not installed beside the portal: pip install ray"


def ray_tokens(settings: Settings) -> RayTokens:
    """The Ray clusters' tokens, from the configured key or the one kept in the state
    directory (``portal.ray.tokens``)."""
    return RayTokens(key_for(settings.ray_token_key, settings.state_dir))


def build_for_service(allocator: Allocator, settings: Settings) -> RayController:
    """The service's Ray controller, started (running nodes re-adopted). Where no backend
    can run Ray, it still lists and deletes clusters and answers a create with 503. On
    Kubernetes it runs no process: ``KubeRay`` (``register_for_service``) makes the
    operator's pods follow it."""
    if settings.inventory == "kubernetes":
        # Idleness and demand are read from the heads' GCS by an interpreter with ray: without
        # ray beside the portal, ``idle_s`` and ``autoscale`` are not acted on.
        tokens = ray_tokens(settings)
        heads = (
            head_reader(probe_python(ray_program()), tokens) if installed_ray_version() else None
        )
        controller = RayController(allocator, installed=settings.ray_version, heads=heads)
    elif installed_ray_version() is None:
        controller = RayController(allocator, refuse=NO_RAY)
    else:
        controller = RayController(allocator, backend=LocalRay(settings.state_dir / "ray"))
    controller.start()
    return controller


def build_jobs_for_service(
    controller: RayController, settings: Settings, isolation: IsolationSettings
) -> RayJobs:
    """The service's Ray jobs: their drivers run wherever the clusters' nodes do (on
    Kubernetes, a Job in the tenant's namespace with the clusters' image)."""
    if settings.inventory == "kubernetes":
        drivers = KubeDrivers(cluster_client(), isolation, image=settings.ray_image)
        return RayJobs(controller, drivers=drivers)
    if controller.backend is None:
        return RayJobs(controller)
    return RayJobs(controller, drivers=LocalDrivers(settings.state_dir / "ray-jobs"))


def register_for_service(
    loops: Loops,
    controller: RayController,
    jobs: RayJobs,
    settings: Settings,
    isolation: IsolationSettings,
) -> KubeRay | None:
    """Add the ``ray`` loop: the local backend's round, or on Kubernetes the controller's
    step followed by ``KubeRay.sync`` and the jobs' step (whose drivers need the head)."""
    if settings.inventory == "kubernetes":
        kube = KubeRay(
            cluster_client(), controller, isolation, ray_tokens(settings), image=settings.ray_image
        )

        def kube_round() -> None:
            controller.step()
            kube.sync()
            jobs.step()

        loops.add("ray", RAY_INTERVAL_S, kube_round)
        return kube
    if controller.backend is None:
        return None

    def round_() -> None:
        # Clusters first: a head that ended is seen (and started again) before the drivers
        # that lost it, so their exits count as the cluster's, not as the jobs' failures.
        controller.step()
        jobs.step()

    loops.add("ray", RAY_INTERVAL_S, round_)
    return None
