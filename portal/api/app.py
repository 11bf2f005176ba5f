"""The ASGI application: ``create_app(allocator, authenticator)``.

Routes live in one module per noun; every one declares its scope. Endpoints are plain ``def``:
FastAPI runs them in its threadpool, because allocator calls block (a lock and a database
commit).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from portal.allocator import Allocator
from portal.api import alerts as alert_routes
from portal.api import (
    cost,
    elastic,
    errors,
    forecast,
    inventory,
    jobs,
    offers,
    prestart,
    queue,
    quotas,
    ray,
    ray_jobs,
    services,
    tenants,
    usage,
    workloads,
)
from portal.api import metrics as service_metrics
from portal.api import telemetry as telemetry_routes
from portal.api.auth import Authenticator
from portal.api.deps import allocator
from portal.api.metrics import RequestObserver, RouteTemplates, ServiceMetrics
from portal.inference.controller import ServiceController
from portal.inference.gateway import Gateway
from portal.inference.gateway import router as gateway_router
from portal.inference.gateway_asgi import GatewayASGI
from portal.jobs.controller import JobController
from portal.ray.controller import RayController
from portal.ray.jobs import RayJobs
from portal.ray.tokens import RayTokens

PREFIX = "/api/v1"
PUBLIC_PATHS = frozenset({"/", "/health", "/ready", f"{PREFIX}/openapi.json", f"{PREFIX}/docs"})
"""Paths answered without a token; every other route must declare a scope."""


def create_app(
    alloc: Allocator,
    authenticator: Authenticator,
    *,
    metrics: ServiceMetrics | None = None,
    job_controller: JobController | None = None,
    service_controller: ServiceController | None = None,
    ray_controller: RayController | None = None,
    ray_job_controller: RayJobs | None = None,
    ray_tokens: RayTokens | None = None,
) -> FastAPI:
    """The portal API over a started ``Allocator``, authenticating with ``authenticator``.

    ``metrics`` (default: new ones over ``alloc``) are served at ``/metrics``; the service
    passes its own so the allocator's commits can count decisions into them.
    ``job_controller`` runs ``/jobs`` (default: one without a backend, which takes, lists
    and cancels jobs but launches nothing: the service passes the one its loop drives);
    ``service_controller`` likewise runs ``/services`` and the gateway.
    ``ray_controller`` runs ``/ray`` the same way, and ``ray_job_controller`` (over it) the
    Ray jobs; ``ray_tokens`` derives the clusters' tokens where the heads want one
    (Kubernetes; None: they run without authentication).
    """
    app = FastAPI(
        title="gpuportal",
        version="1",
        summary="Quota-aware, topology-aware GPU allocation for JupyterHub",
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=f"{PREFIX}/docs",
        redoc_url=None,
    )
    app.state.allocator = alloc
    app.state.authenticator = authenticator
    app.state.metrics = metrics or ServiceMetrics(alloc)
    app.state.jobs = job_controller or JobController(alloc)
    app.state.services = service_controller or ServiceController(alloc)
    app.state.gateway = Gateway(app.state.services)
    app.state.metrics.registry.register(app.state.gateway.book)
    app.state.ray = ray_controller or RayController(alloc)
    app.state.ray_jobs = ray_job_controller or RayJobs(app.state.ray)
    app.state.ray_tokens = ray_tokens
    app.add_middleware(RequestObserver, metrics=app.state.metrics, templates=RouteTemplates(app))
    # Outermost: the gateway's operations skip the middleware and FastAPI (same checks, same
    # metrics and access line), every other request passes through.
    app.add_middleware(GatewayASGI)
    errors.install(app)
    for module in (
        tenants,
        quotas,
        elastic,
        workloads,
        jobs,
        services,
        ray_jobs,  # before ray: /ray/jobs is not a cluster id
        ray,
        queue,
        usage,
        inventory,
        cost,
        forecast,
        offers,
        prestart,
    ):
        app.include_router(module.router, prefix=PREFIX)
    app.include_router(telemetry_routes.router, prefix=PREFIX)
    app.include_router(alert_routes.router, prefix=PREFIX)
    app.include_router(service_metrics.router)
    app.include_router(gateway_router)

    @app.get("/", tags=["health"], summary="What this service is and where its API lives")
    def index() -> dict[str, str]:
        # JupyterHub checks a service's URL every minute; the paths are relative to it.
        return {
            "service": "gpuportal",
            "api": PREFIX.lstrip("/"),
            "docs": f"{PREFIX}/docs".lstrip("/"),
            "health": "health",
        }

    @app.get("/health", tags=["health"], summary="The process answers")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/ready",
        tags=["health"],
        summary="The allocator has started and answers",
        responses={
            503: {
                "description": (
                    "the allocator has not finished starting, or this portal may not write "
                    "(the database is unreachable or the writer guard is lost)"
                )
            }
        },
    )
    def ready(a: Annotated[Allocator, Depends(allocator)]) -> JSONResponse:
        if not a.started:
            return JSONResponse({"status": "starting"}, status_code=503)
        problem = a.store.writer_problem()
        if problem is not None:
            # The platform stops routing here until the guard is back (or the process restarts).
            return JSONResponse({"status": "unavailable", "reason": problem}, status_code=503)
        # Takes the allocator's lock: a wedged allocator makes this hang, which probes see.
        a.tenants()
        return JSONResponse({"status": "ready"})

    return app
