"""The service controller inside ``gpuportal serve``: built over the service's allocator, with
the local process backend when the inventory is this host's, and driven by the ``services``
loop."""

from __future__ import annotations

from portal.allocator import Allocator
from portal.inference.autoscaler import EVALUATE_EVERY_S, Autoscaler
from portal.inference.backend import local_backend
from portal.inference.controller import ServiceController
from portal.inference.prewarm import PLAN_EVERY_S, ForecastWarm
from portal.inference.spec import Backend as BackendKind
from portal.inference.weights import WeightCache
from portal.service.loops import Loops
from portal.settings import Settings

SERVICES_INTERVAL_S = 0.5
"""Seconds between rounds of the services loop: how soon a placement, an engine's health or
its exit is acted on."""

NO_KUBERNETES_BACKEND = (
    "inference services run on the local backend only in this version: the Kubernetes "
    "service backend (Deployments) is not available yet"
)


def build_for_service(allocator: Allocator, settings: Settings) -> ServiceController:
    """The service's controller, started (running replicas re-adopted). Where no backend can
    run replicas it still lists, scales and deletes services, and answers a deploy with 503."""
    if settings.inventory == "kubernetes":
        controller = ServiceController(
            allocator, kind=BackendKind.KUBERNETES, refuse=NO_KUBERNETES_BACKEND
        )
    else:
        weights = WeightCache(
            settings.state_dir / "weights",
            node_bytes=settings.weight_cache_bytes,
            tenant_bytes=settings.weight_cache_tenant_bytes,
        )
        backend = local_backend(settings.state_dir / "services", weights)
        controller = ServiceController(
            allocator, backend=backend, drain_timeout_s=settings.drain_timeout_s
        )
    controller.start()
    return controller


def register_for_service(loops: Loops, controller: ServiceController) -> None:
    if controller.backend is not None:
        loops.add("services", SERVICES_INTERVAL_S, controller.step)
        loops.add("autoscaler", EVALUATE_EVERY_S, Autoscaler(controller).evaluate)
        loops.add("prewarm", PLAN_EVERY_S, ForecastWarm(controller).run)
