"""The service controller inside ``gpuportal serve``: built over the service's allocator, with
the local process backend when the inventory is this host's, the Kubernetes backend (pods
bound by the portal's binder: ``portal.inference.kube``) when it is the cluster's, and driven
by the ``services`` loop."""

from __future__ import annotations

from policies.isolation import IsolationSettings
from portal.allocator import Allocator
from portal.inference.autoscaler import EVALUATE_EVERY_S, Autoscaler
from portal.inference.backend import local_backend
from portal.inference.controller import ServiceController
from portal.inference.kube import kube_backend
from portal.inference.kubeweights import CacheConfig
from portal.inference.prewarm import PLAN_EVERY_S, ForecastWarm
from portal.inference.weights import WeightCache
from portal.kube.service import cluster_client
from portal.service.loops import Loops
from portal.settings import Settings

SERVICES_INTERVAL_S = 0.5
"""Seconds between rounds of the services loop: how soon a placement, an engine's health or
its exit is acted on."""


def build_for_service(
    allocator: Allocator, settings: Settings, isolation: IsolationSettings | None = None
) -> ServiceController:
    """The service's controller, started (running replicas re-adopted)."""
    if settings.inventory == "kubernetes":
        cache = None
        if settings.weight_cache_node_path:
            cache = CacheConfig(
                settings.weight_cache_node_path,
                settings.weight_fetch_image,
                settings.weight_cache_tenant_bytes,
            )
        backend = kube_backend(
            cluster_client(),
            isolation or IsolationSettings(),
            settings.state_dir / "services",
            cache,
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
