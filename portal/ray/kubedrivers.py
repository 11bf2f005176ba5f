"""Ray job drivers on Kubernetes: each attempt of a Ray job is a ``batch/v1`` Job of one pod in
the tenant's namespace (``kubeobjects.driver_job_manifest``) running the entrypoint with
``RAY_ADDRESS`` = the head's GCS Service and the cluster's token from its Secret (a reference:
the portal never reads the token).

Why a Job and not a bare pod: the Job controller records how the pod ended even if the pod is
deleted behind the portal's back, and ``backoffLimit`` 0 keeps retries the portal's (each a
recorded attempt). The driver holds no device, so it is no gang member and no allocation: the
pod names ``schedulerName: gpuportal`` (nothing else schedules in a portal cluster) and the
portal binds it itself to the node of the cluster's head, as it binds the head.

Each ``poll`` (one round of the ``ray`` loop), in steps: list the driver Jobs and their pods
(plain JSON, by label); decide for each attempt the jobs think runs: ended (the pod's phase and
exit code, or the Job failed or gone), or to bind (a pending pod of that very Job, in the
cluster tenant's namespace, asking for no device); then act (bind). A restarted portal simply
polls again: everything it needs is in Kubernetes and the store.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.errors import InvalidRequest
from policies.isolation import IsolationSettings
from policies.isolation.common import MANAGER
from portal.jobs.backend import LogChunk
from portal.jobs.kube import pods as kpods
from portal.jobs.kube.manifests import JobKeys
from portal.jobs.runner import MemberExit, RunnerError
from portal.kube.calls import drain
from portal.ray import kubeobjects as ko
from portal.ray.drivers import DriverRun, job_config
from portal.ray.jobspec import RayJobSpec

log = logging.getLogger(__name__)

SIGKILL = 9
NO_DEVICE = frozenset({"cpu", "memory"})
"""The only resources a driver pod the portal binds may ask for."""


class KubeDrivers:
    """Starts, stops and watches Ray job drivers as Jobs in the tenants' namespaces.

    Needs, there: jobs create/list/delete, pods list, pods/binding create, pods/log get.
    """

    def __init__(
        self, api_client: client.ApiClient, settings: IsolationSettings, *, image: str
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._batch = client.BatchV1Api(api_client)
        self._settings = settings
        self._image = image
        self._job_key = JobKeys.of(settings).ray_job
        self._attempt_key = settings.label("ray-job-attempt")

    def check(self, spec: RayJobSpec) -> None:
        if spec.working_dir is not None:
            raise InvalidRequest(
                "runtime_env.working_dir",
                repr(spec.working_dir),
                "none on Kubernetes: the driver runs in the Ray image, not on the portal's "
                "host; bring code in the image or fetch it from the entrypoint",
            )

    def start(self, run: DriverRun, address: str, spec: RayJobSpec) -> None:
        body: Any = ko.driver_job_manifest(
            ko.DriverObjects(
                job_id=run.job_id,
                attempt=run.attempt,
                cluster_id=run.cluster_id,
                tenant=run.tenant,
                image=self._image,
                address=address,
                entrypoint=spec.entrypoint,
                env_vars=spec.env_vars,
                job_config=job_config(spec),
            ),
            self._settings,
        )
        namespace = self._settings.namespace(run.tenant)
        try:
            drain(self._batch.create_namespaced_job(namespace, body, _preload_content=False))
        except ApiException as e:
            if e.status == 409 and self._made_before(namespace, body["metadata"]["name"], run):
                return  # a portal that stopped before recording the attempt made it
            raise RunnerError(
                f"the driver's Job {namespace}/{body['metadata']['name']} was refused: "
                f"{kpods.api_message(e)}"
            ) from e
        log.info("ray: driver %s/%s created", namespace, body["metadata"]["name"])

    def stop(self, run: DriverRun, grace_s: float) -> None:
        """Delete the attempt's Job and its pod (``grace_s`` for the driver to end)."""
        try:
            self._batch.delete_namespaced_job(
                ko.driver_job_name(run.job_id, run.attempt),
                self._settings.namespace(run.tenant),
                grace_period_seconds=max(0, int(grace_s)),
                propagation_policy="Background",
                _preload_content=False,
            )
        except ApiException as e:
            if e.status != 404:
                raise RunnerError(f"driver of {run.job_id}: {kpods.api_message(e)}") from e

    def poll(self, running: Sequence[DriverRun]) -> list[MemberExit]:
        if not running:
            return []
        selector = f"{self._settings.label('managed-by')}={MANAGER},{self._job_key}"
        jobs = self._list(self._batch.list_job_for_all_namespaces, selector)
        pods = self._list(self._core.list_pod_for_all_namespaces, selector)
        by_name = {(_meta(j, "namespace"), _meta(j, "name")): j for j in jobs}
        exits: list[MemberExit] = []
        for run in running:
            namespace = self._settings.namespace(run.tenant)
            job = by_name.get((namespace, ko.driver_job_name(run.job_id, run.attempt)))
            if job is None or _meta(job, "uid") == "" or not self._is_driver(job, run):
                exits.append(MemberExit(run.job_id, run.attempt, 0, None, SIGKILL))
                continue
            mine = [p for p in pods if _owned_by(p, _meta(job, "uid"))]
            ended = _ended(job, mine)
            if ended is not None:
                code, signal = ended
                exits.append(MemberExit(run.job_id, run.attempt, 0, code, signal))
                continue
            for pod in mine:
                if _bindable(pod):
                    self._bind_beside_head(pod, run)
        return exits

    def read_log(self, job_id: str, attempt: int, offset: int, limit: int) -> LogChunk:
        selector = f"{self._job_key}={job_id},{self._attempt_key}={attempt}"
        try:
            pods = self._list(self._core.list_pod_for_all_namespaces, selector)
            if not pods:
                return LogChunk(b"", 0, f"attempt {attempt} has no driver pod (yet or any more)")
            pod = max(pods, key=lambda p: _meta(p, "creationTimestamp"))
            name, namespace = _meta(pod, "name"), _meta(pod, "namespace")
            return kpods.pod_log(self._core, name, namespace, ko.DRIVER_CONTAINER, offset, limit)
        except ApiException as e:
            return LogChunk(b"", 0, f"the driver's log cannot be read: {kpods.api_message(e)}")

    # ---------------------------------------------------------------- helpers

    def _list(self, call: Any, selector: str) -> list[dict[str, Any]]:
        return list(
            kpods.json_of(call(label_selector=selector, _preload_content=False)).get("items") or []
        )

    def _made_before(self, namespace: str, name: str, run: DriverRun) -> bool:
        try:
            found = kpods.json_of(
                self._batch.read_namespaced_job(name, namespace, _preload_content=False)
            )
        except ApiException:
            return False
        return self._is_driver(found, run)

    def _is_driver(self, job: Mapping[str, Any], run: DriverRun) -> bool:
        found = (job.get("metadata") or {}).get("labels") or {}
        return (
            found.get(self._job_key) == run.job_id
            and found.get(self._attempt_key) == str(run.attempt)
            and found.get(self._settings.label("ray-cluster")) == run.cluster_id
        )

    def _bind_beside_head(self, pod: Mapping[str, Any], run: DriverRun) -> None:
        namespace = self._settings.namespace(run.tenant)
        selector = f"{ko.CLUSTER_LABEL}={ko.cluster_name(run.cluster_id)},{ko.NODE_TYPE_LABEL}=head"
        heads = self._list(lambda **kw: self._core.list_namespaced_pod(namespace, **kw), selector)
        node = next(
            (n for h in heads if (n := (h.get("spec") or {}).get("nodeName")) and kpods.live(h)),
            None,
        )
        if node is None:
            return  # the head is not placed: the driver waits (the job is re-queued)
        body: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": _meta(pod, "name"),
                "namespace": namespace,
                "uid": _meta(pod, "uid"),
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            drain(
                self._core.create_namespaced_pod_binding(
                    _meta(pod, "name"), namespace, body, _preload_content=False
                )
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise RunnerError(f"driver of {run.job_id}: {kpods.api_message(e)}") from e
            return
        log.info("ray: bound driver %s/%s to %s", namespace, _meta(pod, "name"), node)


def _meta(obj: Mapping[str, Any], key: str) -> str:
    return str((obj.get("metadata") or {}).get(key) or "")


def _owned_by(pod: Mapping[str, Any], uid: str) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("kind") == "Job" and o.get("uid") == uid for o in owners)


def _ended(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> tuple[int | None, int | None] | None:
    """(exit code, signal) of an attempt that ended, from its pod's phase; a Job that failed
    without a pod that tells (deleted, evicted) ended as killed."""
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") == "Succeeded":
            return 0, None
        if status.get("phase") == "Failed":
            code = kpods.exit_code(status)
            return (code, None) if code is not None else (None, SIGKILL)
    if kpods.finished(job):
        conditions = (job.get("status") or {}).get("conditions") or []
        complete = any(
            c.get("type") == "Complete" and c.get("status") == "True" for c in conditions
        )
        return (0, None) if complete else (None, SIGKILL)
    return None


def _bindable(pod: Mapping[str, Any]) -> bool:
    """Pending, unbound, not being deleted, and asking for no device: a pod someone made to
    look like a driver gets nothing from being bound."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    if (pod.get("status") or {}).get("phase") not in (None, "Pending"):
        return False
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        asked = {*(resources.get("requests") or {}), *(resources.get("limits") or {})}
        if not asked <= NO_DEVICE:
            return False
    return True
