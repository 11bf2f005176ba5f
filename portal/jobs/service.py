"""The job controller inside ``gpuportal serve``: built over the service's allocator, with
the local process backend when the inventory is this host's and the Kubernetes backend
(``portal.jobs.kube``) on the ``kubernetes`` inventory, driven by the ``jobs`` loop (and, on
Kubernetes, the ``jobs-admission`` loop of kubectl Jobs)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Engine

from policies.elastic import Sample
from policies.isolation import IsolationSettings
from portal.allocator import Allocator
from portal.jobs.backend import local_backend
from portal.jobs.controller import JobController
from portal.jobs.elastic import Utilization
from portal.jobs.spec import Backend as BackendKind
from portal.service.loops import Loops
from portal.settings import Settings
from portal.telemetry.reads import workload_utilization

log = logging.getLogger(__name__)

JOBS_INTERVAL_S = 0.5
"""Seconds between rounds of the jobs loop: how soon a member's exit, a placement or a
preemption is acted on."""

ELASTIC_CHECK_S = 10.0
"""Seconds between two readings of an elastic job's utilization under serve."""

NO_LOCAL_RUNNER = "this installation has no local job runner (portal.jobs.runner)"


def build_for_service(
    allocator: Allocator, settings: Settings, isolation: IsolationSettings | None = None
) -> JobController:
    """The service's job controller, started (running members re-adopted).

    Where no backend can run jobs, the controller still lists and cancels them and answers
    a submit with 503 and why, rather than queueing work nothing would ever start.
    """
    if settings.inventory.strip() == "kubernetes":
        from portal.jobs.kube.service import kube_backend  # the kubernetes client, only here

        backend = kube_backend(isolation or IsolationSettings())
        controller = JobController(allocator, backend=backend)
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
    wire_elastic(controller, allocator.store.engine)
    controller.start()
    return controller


def telemetry_utilization(engine: Engine) -> Utilization:
    """Elastic jobs' utilization as the telemetry stored it: the samples the node agent (NVML)
    or the simulated inventory sent, attributed to workloads at ingest."""

    def read(workload_ids: Sequence[str], since: datetime) -> list[Sample]:
        rows = workload_utilization(engine, workload_ids, since.timestamp())
        return [Sample(at, fraction) for at, fraction in rows]

    return read


def wire_elastic(controller: JobController, engine: Engine) -> None:
    """Elastic jobs under serve grow on the stored telemetry, read every ``ELASTIC_CHECK_S``."""
    controller.elastic.utilization = telemetry_utilization(engine)
    controller.elastic.check_s = ELASTIC_CHECK_S


def register_for_service(loops: Loops, controller: JobController) -> None:
    if controller.backend is None:
        return
    loops.add("jobs", JOBS_INTERVAL_S, controller.step)
    if controller.backend.kind is BackendKind.KUBERNETES:
        from portal.jobs.kube.service import register_admission

        register_admission(loops, controller)
