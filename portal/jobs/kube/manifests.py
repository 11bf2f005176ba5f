"""An attempt's Kubernetes objects, from pure builders over frozen inputs (no I/O).

- the **Job**: ``completionMode: Indexed``, ``completions`` = ``parallelism`` = members,
  ``backoffLimit: 0`` (the portal owns retries), pods with ``schedulerName: gpuportal`` and the
  restricted Pod Security context, deleted ``ttlSecondsAfterFinished`` after it ends;
- the headless **Service** named like the Job: with the pods' ``subdomain`` it gives rank 0 the
  stable name ``<job>-0.<job>`` that ``MASTER_ADDR`` holds;
- the gang **Workload** (``scheduling.k8s.io/v1alpha1``), where the cluster serves it, with
  ``minCount`` = members, so other tools see that the pods form one gang;
- for a job with a ``checkpoint_dir``, the tenant's checkpoint **PersistentVolumeClaim**
  (``checkpoint_claim_manifest``, one per tenant), mounted in every member at
  ``checkpoint_dir`` with the job's own sub-path, so jobs do not see each other's checkpoints.

Per-rank values cannot sit in one pod template: ``RANK`` is the completion index the Job
controller writes on each pod, and ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``NODE_RANK`` are
annotations the binder writes on the pod before it binds it (the kubelet resolves them when the
container starts, which is after the bind).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.errors import InvalidRequest
from policies.flavors import MILLI_PER_GPU, Flavor, FlavorKind
from policies.isolation import IsolationSettings
from policies.isolation.common import MANAGER
from policies.isolation.podsecurity import restricted_container_context, restricted_pod_context
from portal.kube.keys import SCHEDULER_NAME

Manifest = dict[str, Any]

CONTAINER = "member"
"""The container of every member pod (the one with the devices)."""
MASTER_PORT = 29500
"""Rank 0's rendezvous port (``torchrun``'s default); each pod has its own network."""
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
"""The Job controller's label and annotation of an indexed pod's index."""
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
WORKLOAD_API = "scheduling.k8s.io/v1alpha1"
TTL_AFTER_FINISHED_S = 86400
"""How long a finished attempt's Job (its pods, their logs) stays before Kubernetes deletes it."""
CHECKPOINT_VOLUME = "checkpoints"
"""The member pods' volume of the tenant's checkpoint claim."""
CHECKPOINT_ACCESS_MODE = "ReadWriteMany"
"""Members on several nodes write to the claim at once."""
PER_RANK = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")
"""Rendezvous variables the binder provides per pod, as annotations (see the module doc)."""

_NAME_OK = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, slots=True)
class JobKeys:
    """Label and annotation keys on the objects of an attempt (under the isolation prefix)."""

    tenant: str
    job: str
    attempt: str
    workload: str
    managed_by: str
    ray_job: str
    """On the Job of a Ray job's driver (``portal.ray.kubeobjects``): the portal's own, never
    a kubectl Job to admit."""
    rank: Mapping[str, str] = field(default_factory=dict)
    """Rendezvous variable -> the annotation the binder writes it in (``PER_RANK``)."""

    @staticmethod
    def of(settings: IsolationSettings) -> JobKeys:
        return JobKeys(
            tenant=settings.label("tenant"),
            job=settings.label("job"),
            attempt=settings.label("attempt"),
            workload=settings.label("workload"),
            managed_by=settings.label("managed-by"),
            ray_job=settings.label("ray-job"),
            rank={v: settings.label(v.lower().replace("_", "-")) for v in PER_RANK},
        )


@dataclass(frozen=True, slots=True)
class AttemptObjects:
    """What one attempt's objects are built from. ``env`` is rank 0's rendezvous environment
    merged with the job's own (``portal.jobs.backend.merged_env``); ``resources`` the member
    container's requests (= limits)."""

    job_id: str
    attempt: int
    tenant: str
    workload_id: str
    members: int
    image: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    resources: Mapping[str, str]
    stop_grace_s: float = 10.0
    run_as_user: int = 1000
    run_as_group: int = 100
    checkpoint_dir: str = ""
    """Where the tenant's checkpoint claim is mounted in each member; "": no volume."""


def checkpoint_sub_path(job_id: str) -> str:
    """The job's folder on its tenant's checkpoint claim: one per job, named by its id (ids
    are unique; the prefix keeps them apart from anything else an admin keeps there)."""
    return f"jobs/{_NAME_OK.sub('-', job_id.lower()).strip('-') or 'job'}"


def checkpoint_claim_manifest(tenant: str, settings: IsolationSettings) -> Manifest:
    """The tenant's checkpoint claim, as the portal creates it when none exists."""
    keys = JobKeys.of(settings)
    spec: dict[str, Any] = {
        "accessModes": [CHECKPOINT_ACCESS_MODE],
        "resources": {"requests": {"storage": settings.checkpoint_claim_size}},
    }
    if settings.checkpoint_storage_class:
        spec["storageClassName"] = settings.checkpoint_storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": settings.checkpoint_claim,
            "namespace": settings.namespace(tenant),
            "labels": {keys.managed_by: MANAGER, keys.tenant: tenant},
        },
        "spec": spec,
    }


def kubectl_job_id(uid: str) -> str:
    """The portal job id of the kubectl Job with ``uid`` (stable: the same Job, the same id)."""
    return "k" + uid.replace("-", "").lower()


def job_name(job_id: str, attempt: int) -> str:
    """The Job (and Service) of attempt ``attempt``: a DNS label that leaves room for the
    index in the pods' host names (``<name>-<index>`` within 63 characters)."""
    base = _NAME_OK.sub("-", job_id.lower()).strip("-")[:40] or "job"
    return f"j-{base}-{attempt}"


def master_addr(job_id: str, attempt: int) -> str:
    """Rank 0's stable name through the headless Service (resolved in the pods' namespace)."""
    name = job_name(job_id, attempt)
    return f"{name}-0.{name}"


def gpu_resources(
    flavor: str, gpus: int, milli: int, settings: IsolationSettings
) -> dict[str, str]:
    """The device-plugin resource counting one member's devices: ``nvidia.com/gpu: N``,
    ``nvidia.com/mig-<profile>: 1``, or the shared resource in replicas (rounded up, as the
    tenant's ResourceQuota counts it)."""
    parsed = Flavor.parse(flavor)
    if parsed.kind is FlavorKind.GPU:
        return {"nvidia.com/gpu": str(gpus)}
    if parsed.kind is FlavorKind.MIG:
        return {f"nvidia.com/mig-{parsed.profile}": "1"}
    replicas = settings.shared_gpu_replicas
    return {settings.shared_gpu_resource: str(math.ceil(milli * replicas / MILLI_PER_GPU))}


def _labels(o: AttemptObjects, keys: JobKeys) -> dict[str, str]:
    return {
        keys.managed_by: MANAGER,
        keys.tenant: o.tenant,
        keys.job: o.job_id,
        keys.attempt: str(o.attempt),
        keys.workload: o.workload_id,
    }


def _env(o: AttemptObjects, keys: JobKeys) -> list[dict[str, Any]]:
    """The member's variables: shared ones as values, per-rank ones from the pod's
    annotations (sorted, so the same attempt always renders the same template)."""
    per_pod = {
        "RANK": COMPLETION_INDEX,
        "JOB_COMPLETION_INDEX": COMPLETION_INDEX,
        **{v: keys.rank[v] for v in PER_RANK},
    }
    out: list[dict[str, Any]] = [
        {"name": k, "value": v} for k, v in sorted(o.env.items()) if k not in per_pod
    ]
    out += [
        {
            "name": k,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{annotation}']"}},
        }
        for k, annotation in sorted(per_pod.items())
    ]
    return out


def job_manifest(o: AttemptObjects, settings: IsolationSettings) -> Manifest:
    """The attempt's indexed Job (see the module doc)."""
    if o.members < 1:
        raise InvalidRequest("members", o.members, "1 or more")
    if not o.image:
        raise InvalidRequest("image", repr(o.image), "a container image")
    keys = JobKeys.of(settings)
    name = job_name(o.job_id, o.attempt)
    labels = _labels(o, keys)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": o.image,
        "env": _env(o, keys),
        "ports": [{"name": "rendezvous", "containerPort": MASTER_PORT, "protocol": "TCP"}],
        "resources": {"requests": dict(o.resources), "limits": dict(o.resources)},
        "securityContext": restricted_container_context(),
    }
    if o.command:
        container["command"] = list(o.command)
    volumes: list[dict[str, Any]] = []
    if o.checkpoint_dir:
        if not o.checkpoint_dir.startswith("/") or o.checkpoint_dir.rstrip("/") == "":
            raise InvalidRequest(
                "checkpoint_dir", repr(o.checkpoint_dir), "an absolute path other than /"
            )
        # A claim volume, never hostPath: Pod Security restricted admits it.
        volumes.append(
            {
                "name": CHECKPOINT_VOLUME,
                "persistentVolumeClaim": {"claimName": settings.checkpoint_claim},
            }
        )
        container["volumeMounts"] = [
            {
                "name": CHECKPOINT_VOLUME,
                "mountPath": o.checkpoint_dir,
                "subPath": checkpoint_sub_path(o.job_id),
            }
        ]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "schedulerName": SCHEDULER_NAME,
        "subdomain": name,
        "serviceAccountName": settings.jobs_service_account,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": math.ceil(o.stop_grace_s),
        "securityContext": restricted_pod_context(o.run_as_user, o.run_as_group),
        "containers": [container],
    }
    if volumes:
        pod_spec["volumes"] = volumes
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": settings.namespace(o.tenant),
            "labels": labels,
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": o.members,
            "parallelism": o.members,
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    """A reference to the created Job: its Service and Workload go when it goes."""
    meta = job["metadata"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": False,
    }


def service_manifest(
    o: AttemptObjects, settings: IsolationSettings, owner: Mapping[str, Any] | None = None
) -> Manifest:
    """The headless Service giving each member ``<job>-<index>.<job>``; it publishes pods that
    are not ready yet, since ranks meet before any is ready."""
    keys = JobKeys.of(settings)
    name = job_name(o.job_id, o.attempt)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": settings.namespace(o.tenant),
        "labels": _labels(o, keys),
    }
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {keys.job: o.job_id, keys.attempt: str(o.attempt)},
            "ports": [{"name": "rendezvous", "port": MASTER_PORT, "protocol": "TCP"}],
        },
    }


def workload_manifest(
    namespace: str,
    name: str,
    members: int,
    labels: Mapping[str, str],
    owner: Mapping[str, Any] | None = None,
) -> Manifest:
    """The gang as a ``scheduling.k8s.io/v1alpha1`` Workload: one pod group of ``members``
    with ``minCount`` = members, controlled by the Job ``name``."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return {
        "apiVersion": WORKLOAD_API,
        "kind": "Workload",
        "metadata": meta,
        "spec": {
            "controllerRef": {"apiGroup": "batch", "kind": "Job", "name": name},
            "podGroups": [{"name": "members", "policy": {"gang": {"minCount": members}}}],
        },
    }


def rank_annotations(
    keys: JobKeys, local_rank: int, local_world_size: int, node_rank: int
) -> dict[str, str]:
    """The per-rank annotations the binder writes on a member pod before binding it."""
    return {
        keys.rank["LOCAL_RANK"]: str(local_rank),
        keys.rank["LOCAL_WORLD_SIZE"]: str(local_world_size),
        keys.rank["NODE_RANK"]: str(node_rank),
    }


def shared_env(envs: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """Rank 0's environment without the per-rank variables (the template's part)."""
    if not envs:
        raise InvalidRequest("members", "[]", "at least one member")
    return {k: v for k, v in envs[0].items() if k not in ("RANK", *PER_RANK)}
