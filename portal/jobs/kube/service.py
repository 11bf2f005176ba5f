"""The Kubernetes job backend inside ``gpuportal serve`` (``GPUPORTAL_INVENTORY=kubernetes``):
the runner over the same credentials as the binder, and the admission loop of kubectl Jobs."""

from __future__ import annotations

from kubernetes import client

from policies.isolation import IsolationSettings
from portal.jobs.backend import Backend
from portal.jobs.controller import JobController
from portal.jobs.kube.admission import Admission
from portal.jobs.kube.runner import KubeRunner
from portal.jobs.spec import Backend as BackendKind
from portal.kube.service import cluster_client
from portal.service.loops import Loops

ADMISSION_INTERVAL_S = 2.0
"""Seconds between passes over kubectl-created Jobs."""


def kube_backend(
    isolation: IsolationSettings, api_client: client.ApiClient | None = None
) -> Backend:
    """Jobs as indexed Jobs in the tenants' namespaces; rank 0 found through its Service."""
    runner = KubeRunner(api_client or cluster_client(), isolation)
    return Backend(kind=BackendKind.KUBERNETES, runner=runner, rendezvous=runner.rendezvous)


def register_admission(loops: Loops, controller: JobController) -> Admission | None:
    """Add the ``jobs-admission`` loop when the controller runs the Kubernetes backend."""
    backend = controller.backend
    if backend is None or not isinstance(backend.runner, KubeRunner):
        return None
    runner = backend.runner
    admission = Admission(runner.api_client, controller, runner.settings)

    def admit() -> None:
        admission.admit()

    loops.add("jobs-admission", ADMISSION_INTERVAL_S, admit)
    loops.at_stop(runner.close)  # the runner's watches
    return admission
