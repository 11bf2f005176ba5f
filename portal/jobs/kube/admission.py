"""Jobs created with kubectl: a ``batch/v1`` Job in a tenant's namespace whose pods name
``schedulerName: gpuportal`` becomes a portal job, admitted like one submitted to the API.

Each pass (``Admission.admit``), in steps:

1. read the Jobs whose pod template names the portal's scheduler and that carry no ``job``
   label yet (from the Kubernetes runner's copy of the Jobs, ``KubeRunner.jobs_informer``, or a
   list when the controller runs no such runner), and list the portal's tenant namespaces;
2. decide each on that snapshot (``spec_of``): the **tenant is the namespace's** — a namespace
   the portal's isolation made, labelled ``managed-by: gpuportal`` with its ``tenant`` label
   and named ``<prefix><tenant>`` — never a label or annotation the Job carries; the members
   are ``completions`` (= ``parallelism``, ``completionMode: Indexed``); each member's devices
   are its container's ``nvidia.com/gpu`` request; the image is that container's;
3. act: enqueue the pass's jobs together (``JobController.enqueue_many``: each job's id is
   derived from its Job's uid, so a repeated pass, two passes at once or a restarted portal
   never admit one Job twice; the jobs placed at once are launched several at a time, and
   their launch labels each Job with its job, attempt, workload and tenant in one patch);
   or post a Warning Event on the Job saying why it is not admitted. A Job left queued is
   not labelled until its launch: the pass remembers the uids it admitted (and a restarted
   portal finds them in the store), so a later pass does not offer them again.

The portal does not restart a kubectl Job (``max_restarts`` 0: its own ``backoffLimit`` is the
user's); stopping it (cancel, preemption) suspends it. A Job deleted with kubectl cancels its
portal job. Its pods get placement and their rank annotations, but not the rendezvous
environment (a pod's environment is fixed when the Job controller creates it):
``JOB_COMPLETION_INDEX`` is the rank.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.errors import Conflict, InvalidRequest, PortalError
from policies.flavors import FlavorKind
from policies.isolation import IsolationSettings
from policies.isolation.common import MANAGER
from policies.jobs import RestartPolicy
from policies.requests import DeviceRequest
from portal.jobs.controller import JobController
from portal.jobs.kube.manifests import JobKeys, kubectl_job_id
from portal.jobs.kube.runner import KubeRunner
from portal.jobs.spec import JobSpec
from portal.kube.calls import drain
from portal.kube.keys import EVENT_SOURCE, SCHEDULER_NAME

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
OWNER = "kubectl"
"""The owner of an admitted Job: Kubernetes does not record who created an object."""
MERGE_PATCH = "application/merge-patch+json"


job_id_of = kubectl_job_id
"""The portal job id of the Job with ``uid`` (``manifests.kubectl_job_id``)."""


def tenant_of(namespace: Mapping[str, Any], settings: IsolationSettings) -> str | None:
    """The tenant whose namespace this is, or None for a namespace the portal did not make."""
    meta = namespace.get("metadata") or {}
    labels = meta.get("labels") or {}
    tenant = labels.get(settings.label("tenant"))
    if labels.get(settings.label("managed-by")) != MANAGER or not tenant:
        return None
    try:
        expected = settings.namespace(tenant)
    except InvalidRequest:
        return None
    return tenant if meta.get("name") == expected else None


def spec_of(job: Mapping[str, Any], tenant: str) -> JobSpec:
    """The portal job a kubectl Job asks for; ``InvalidRequest`` names the Job's field."""
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    completions = spec.get("completions")
    parallelism = spec.get("parallelism", 1)
    if spec.get("completionMode") != "Indexed":
        raise InvalidRequest(
            "spec.completionMode",
            repr(spec.get("completionMode") or "NonIndexed"),
            "Indexed: each pod's completion index is its rank",
        )
    if not isinstance(completions, int) or completions != parallelism:
        raise InvalidRequest(
            "spec.parallelism",
            f"{parallelism} with completions {completions}",
            "parallelism equal to completions: every member runs at once",
        )
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    asking = [c for c in containers if _gpus(c) is not None]
    if len(asking) != 1:
        raise InvalidRequest(
            "spec.template.spec.containers",
            f"{len(asking)} containers asking for {GPU_RESOURCE}",
            f"one container with resources.limits {GPU_RESOURCE}: N (whole GPUs)",
        )
    gpus = _gpus(asking[0])
    assert gpus is not None
    devices = DeviceRequest(kind=FlavorKind.GPU, count=gpus)
    return JobSpec(
        tenant=tenant,
        owner=OWNER,
        name=f"{meta.get('namespace')}/{meta.get('name')}",
        members=completions,
        devices=devices,
        image=str(asking[0].get("image") or ""),
        restart=RestartPolicy(max_restarts=0),
        kube_job=f"{meta.get('namespace')}/{meta.get('name')}",
    )


def _gpus(container: Mapping[str, Any]) -> int | None:
    resources = container.get("resources") or {}
    raw = (resources.get("limits") or {}).get(GPU_RESOURCE) or (
        resources.get("requests") or {}
    ).get(GPU_RESOURCE)
    if raw is None:
        return None
    if not str(raw).isdigit() or int(raw) < 1:
        raise InvalidRequest(f"resources.limits {GPU_RESOURCE}", repr(raw), "a whole number >= 1")
    return int(raw)


def wants_portal(job: Mapping[str, Any], keys: JobKeys) -> bool:
    """A Job whose pods the portal places and that it has not admitted yet (nor made itself
    for a Ray job's driver)."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    template = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    return (
        template.get("schedulerName") == SCHEDULER_NAME
        and keys.job not in labels
        and keys.ray_job not in labels
    )


@dataclass(frozen=True, slots=True)
class AdmissionReport:
    """One pass: Jobs admitted (``namespace/name``, job id), refused (``namespace/name``,
    why) and portal jobs cancelled because their Job was deleted."""

    admitted: tuple[tuple[str, str], ...] = ()
    refused: tuple[tuple[str, str], ...] = ()
    cancelled: tuple[str, ...] = ()


class Admission:
    """Admits kubectl Jobs into ``controller`` (see the module doc). One pass at a time.

    Needs, cluster-wide: jobs list/patch, namespaces list, events create.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        controller: JobController,
        settings: IsolationSettings | None = None,
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._batch = client.BatchV1Api(api_client)
        self._jobs = controller
        runner = controller.backend.runner if controller.backend is not None else None
        self._runner = runner if isinstance(runner, KubeRunner) else None
        self._settings = settings or IsolationSettings()
        self._keys = JobKeys.of(self._settings)
        self._lock = threading.Lock()
        # Job ids this pass knows the store holds: admitted, whether launched (labelled) yet
        # or still queued (not labelled: the launch labels it).
        self._known: set[str] = set()

    def admit(self) -> AdmissionReport:
        with self._lock:
            if self._runner is not None:
                jobs = self._runner.jobs_informer().items()
            else:
                jobs = self._list(self._batch.list_job_for_all_namespaces)
            present = {job_id_of((j.get("metadata") or {}).get("uid", "")) for j in jobs}
            self._known &= present  # forget the Jobs that are gone
            candidates = [
                j
                for j in jobs
                if wants_portal(j, self._keys)
                and job_id_of(j["metadata"]["uid"]) not in self._known
            ]
            admitted: list[tuple[str, str]] = []
            refused: list[tuple[str, str]] = []
            if candidates:
                admitted, refused = self._admit_all(candidates)
            return AdmissionReport(tuple(admitted), tuple(refused), self._cancel_deleted(jobs))

    def _admit_all(
        self, candidates: list[dict[str, Any]]
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """Decide every candidate on one snapshot of the tenants' namespaces, then enqueue
        the admitted ones together; (admitted, refused) as ``namespace/name`` pairs."""
        selector = f"{self._settings.label('managed-by')}={MANAGER}"
        namespaces = {
            n["metadata"]["name"]: n
            for n in self._list(self._core.list_namespace, label_selector=selector)
        }
        refused: list[tuple[str, str]] = []
        wanted: list[tuple[dict[str, Any], str, JobSpec]] = []  # (Job, job id, spec)
        for job in candidates:
            meta = job["metadata"]
            where = f"{meta['namespace']}/{meta['name']}"
            job_id = job_id_of(meta["uid"])
            try:
                wanted.append((job, job_id, self._spec(job, namespaces)))
            except PortalError as exc:
                refused.append((where, exc.message))
                self._refuse(job, exc.message)
        admitted: list[tuple[str, str]] = []
        results = self._jobs.enqueue_many([(spec, job_id) for _, job_id, spec in wanted])
        for (job, job_id, _), result in zip(wanted, results, strict=True):
            where = f"{job['metadata']['namespace']}/{job['metadata']['name']}"
            if isinstance(result, Conflict):
                # Admitted already: by a pass before a restart, or by another at once.
                self._known.add(job_id)
                continue
            if isinstance(result, PortalError):
                refused.append((where, result.message))
                self._refuse(job, result.message)
                continue
            self._known.add(job_id)
            admitted.append((where, job_id))
            log.info("jobs: admitted Job %s as %s", where, job_id)
        return admitted, refused

    def _spec(self, job: Mapping[str, Any], namespaces: Mapping[str, Any]) -> JobSpec:
        """The Job's portal job, charged to its namespace's tenant (``InvalidRequest`` when
        the namespace is not a tenant's, or the Job asks for what the portal cannot run)."""
        meta = job["metadata"]
        namespace = namespaces.get(meta["namespace"])
        tenant = None if namespace is None else tenant_of(namespace, self._settings)
        if tenant is None:
            raise InvalidRequest(
                "metadata.namespace",
                repr(meta["namespace"]),
                "a tenant's namespace (the portal's isolation makes one per tenant)",
            )
        return spec_of(job, tenant)

    def _cancel_deleted(self, jobs: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
        """Cancel the portal jobs of kubectl Jobs that are gone (by uid: a Job re-created
        under the same name is another Job)."""
        present = {job_id_of((j.get("metadata") or {}).get("uid", "")) for j in jobs}
        cancelled = []
        for record in self._jobs.active_jobs():
            if not record.spec.get("kube_job"):
                continue
            if record.id not in present and self._gone(str(record.spec["kube_job"]), record.id):
                self._jobs.cancel(record.id)
                cancelled.append(record.id)
                log.info("jobs: the Job of %s (%s) is gone: cancelled", record.id, record.name)
        return tuple(cancelled)

    def _gone(self, kube_job: str, job_id: str) -> bool:
        """Whether the Job is gone indeed: a copy of the Jobs may lag (a direct read)."""
        if self._runner is None:
            return True  # read from a list a moment ago
        namespace, _, name = kube_job.partition("/")
        try:
            job: Any = self._batch.read_namespaced_job(name, namespace, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return job_id_of(json.loads(job.data)["metadata"]["uid"]) != job_id

    def _refuse(self, job: Mapping[str, Any], message: str) -> None:
        meta = job["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{meta['uid'][:8]}.gpujobrefused"[:253],
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": "GPUJobRefused",
            "message": f"the portal does not admit this Job: {message}",
            "type": "Warning",
            "source": {"component": EVENT_SOURCE},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            drain(
                self._core.create_namespaced_event(meta["namespace"], event, _preload_content=False)
            )
        except ApiException as e:
            if e.status != 409:  # 409: posted by an earlier pass
                log.warning("jobs: no event on Job %s: %s", meta["name"], e.reason)

    @staticmethod
    def _list(call: Any, **kwargs: Any) -> list[dict[str, Any]]:
        data = json.loads(call(_preload_content=False, **kwargs).data or b"{}")
        return list(data.get("items") or [])
