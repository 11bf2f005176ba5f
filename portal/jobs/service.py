"""The job controller inside ``gpuportal serve``: built over the service's allocator, with
the local process backend when the inventory is this host's, and driven by the ``jobs``
loop."""

from __future__ import annotations

import logging

from portal.allocator import Allocator
from portal.jobs.backend import local_backend
from portal.jobs.controller import JobController
from portal.jobs.spec import Backend as BackendKind
from portal.service.loops import Loops
from portal.settings import Settings

log = logging.getLogger(__name__)

JOBS_INTERVAL_S = 0.5
"""Seconds between rounds of the jobs loop: how soon a member's exit, a placement or a
preemption is acted on."""

NO_KUBERNETES_BACKEND = (
    "training jobs run on the local backend only in this version: the Kubernetes job "
    "backend (indexed Jobs) is not available yet"
)
NO_LOCAL_RUNNER = "this installation has no local job runner (portal.jobs.runner)"


def build_for_service(allocator: Allocator, settings: Settings) -> JobController:
    """The service's job controller, started (running members re-adopted).

    Where no backend can run jobs, the controller still lists and cancels them and answers
    a submit with 503 and why, rather than queueing work nothing would ever start.
    """
    if settings.inventory == "kubernetes":
        controller = JobController(
            allocator, kind=BackendKind.KUBERNETES, refuse=NO_KUBERNETES_BACKEND
        )
    else:
        try:
            backend = local_backend(settings.state_dir / "jobs")
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("portal.jobs."):
                raise  # the runner is there but something it needs is not: say so
            log.warning("jobs: %s; submitting a job answers 503", NO_LOCAL_RUNNER)
            controller = JobController(allocator, refuse=NO_LOCAL_RUNNER)
        else:
            controller = JobController(allocator, backend=backend)
    controller.start()
    return controller


def register_for_service(loops: Loops, controller: JobController) -> None:
    if controller.backend is not None:
        loops.add("jobs", JOBS_INTERVAL_S, controller.step)
