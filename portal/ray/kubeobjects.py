"""What the Kubernetes Ray backend writes and decides, with no I/O: the ``ray.io/v1``
RayCluster the KubeRay operator turns into pods, and which worker pod uses which allocation.

The RayCluster lives in the tenant's namespace. Its head is CPU-only (``num-gpus: 0``); its one
worker group asks each pod for the devices of one worker (the device-plugin resource the
tenant's ResourceQuota counts). Every pod names ``schedulerName: gpuportal``, so only the
portal binds them (``portal.ray.kube``). Ray's token authentication is on: the pinned KubeRay
(v1.5.0) has no authentication field in the RayCluster spec, so each node gets Ray's own
``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` from a Secret of the cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.flavors import FlavorKind
from policies.isolation import IsolationSettings
from policies.isolation.common import MANAGER
from policies.isolation.podsecurity import restricted_container_context, restricted_pod_context
from policies.requests import DeviceRequest
from portal.jobs.kube.manifests import JobKeys
from portal.kube.keys import SCHEDULER_NAME, PodKeys
from portal.kube.views import FINISHED_PHASES, PodView

GROUP = "ray.io"
VERSION = "v1"
PLURAL = "rayclusters"
WORKER_GROUP = "workers"
CLUSTER_LABEL = "ray.io/cluster"
"""Set by the operator on every pod of a RayCluster: the RayCluster's name."""
NODE_TYPE_LABEL = "ray.io/node-type"
"""Set by the operator: ``head`` or ``worker``."""
GCS_PORT = 6379
TOKEN_KEY = "token"
QUEUED_ALLOCATION = "queued"
"""The allocation a worker pod of a waiting slice is marked with: the binder holds it with the
slice's queue reason until the slice is placed and the pod gets a real one."""
MEMORY_PER_CPU_MIB = 2048

Manifest = dict[str, Any]


def cluster_name(cluster_id: str) -> str:
    """The RayCluster's name: short, since the operator derives pod and Service names."""
    return f"ray-{cluster_id[:12]}"


def token_secret_name(cluster_id: str) -> str:
    return f"{cluster_name(cluster_id)}-auth"


def head_address(cluster_id: str, namespace: str) -> str:
    """``host:port`` of the head's GCS through the Service the operator makes for it."""
    return f"{cluster_name(cluster_id)}-head-svc.{namespace}.svc:{GCS_PORT}"


def device_resources(devices: DeviceRequest, settings: IsolationSettings) -> dict[str, str]:
    """The device-plugin resource one worker's devices are counted with."""
    if devices.kind is FlavorKind.GPU:
        return {"nvidia.com/gpu": str(devices.count)}
    if devices.kind is FlavorKind.MIG:
        return {f"nvidia.com/mig-{devices.mig_profile}": "1"}
    if devices.kind is FlavorKind.SHARE:
        replicas = settings.shared_gpu_replicas
        return {settings.shared_gpu_resource: str(math.ceil(devices.milli * replicas / 1000))}
    return {}


@dataclass(frozen=True, slots=True)
class RayClusterObjects:
    """What a cluster's objects are built from."""

    cluster_id: str
    tenant: str
    image: str
    ray_version: str
    devices: DeviceRequest
    head_cpus: int
    worker_cpus: int
    min_workers: int
    max_workers: int
    replicas: int
    workers_to_delete: tuple[str, ...] = ()
    suspend: bool = False
    """The operator deletes every pod (the head's Service stays): a suspended cluster."""
    run_as_user: int = 1000
    run_as_group: int = 100


def labels(cluster_id: str, tenant: str, settings: IsolationSettings) -> dict[str, str]:
    return {
        settings.label("managed-by"): MANAGER,
        settings.label("tenant"): tenant,
        settings.label("ray-cluster"): cluster_id,
    }


def _pod_template(
    o: RayClusterObjects,
    settings: IsolationSettings,
    container: str,
    cpus: int,
    devices: Mapping[str, str],
) -> Manifest:
    resources = {"cpu": str(cpus), "memory": f"{cpus * MEMORY_PER_CPU_MIB}Mi", **devices}
    secret = {"name": token_secret_name(o.cluster_id), "key": TOKEN_KEY}
    return {
        "metadata": {"labels": labels(o.cluster_id, o.tenant, settings)},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "automountServiceAccountToken": False,
            "securityContext": restricted_pod_context(
                o.run_as_user, o.run_as_group, fs_group=False
            ),
            "containers": [
                {
                    "name": container,
                    "image": o.image,
                    "env": [
                        {"name": "RAY_AUTH_MODE", "value": "token"},
                        {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": secret}},
                        {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
                    ],
                    "resources": {"requests": dict(resources), "limits": dict(resources)},
                    "securityContext": restricted_container_context(),
                }
            ],
        },
    }


def raycluster_manifest(o: RayClusterObjects, settings: IsolationSettings) -> Manifest:
    """The cluster's RayCluster (see the module doc)."""
    devices = device_resources(o.devices, settings)
    gpus = o.devices.count if o.devices.kind is FlavorKind.GPU else 1 if devices else 0
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RayCluster",
        "metadata": {
            "name": cluster_name(o.cluster_id),
            "namespace": settings.namespace(o.tenant),
            "labels": labels(o.cluster_id, o.tenant, settings),
        },
        "spec": {
            "rayVersion": o.ray_version,
            "suspend": o.suspend,
            "headGroupSpec": {
                "rayStartParams": {"num-gpus": "0", "include-dashboard": "false"},
                "template": _pod_template(o, settings, "ray-head", o.head_cpus, {}),
            },
            "workerGroupSpecs": [
                {
                    "groupName": WORKER_GROUP,
                    "replicas": o.replicas,
                    "minReplicas": o.min_workers,
                    "maxReplicas": o.max_workers,
                    "rayStartParams": {"num-gpus": str(gpus)},
                    "scaleStrategy": {"workersToDelete": list(o.workers_to_delete)},
                    "template": _pod_template(o, settings, "ray-worker", o.worker_cpus, devices),
                }
            ],
        },
    }


def token_secret_manifest(
    cluster_id: str, tenant: str, token: str, settings: IsolationSettings
) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": token_secret_name(cluster_id),
            "namespace": settings.namespace(tenant),
            "labels": labels(cluster_id, tenant, settings),
        },
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }


# ---- a Ray job's driver ------------------------------------------------------------------------

DRIVER_CONTAINER = "driver"
DRIVER_CPUS = 1
DRIVER_TTL_S = 86_400
"""How long a finished driver's Job (and its pod's log) stays before Kubernetes deletes it."""
PORTAL_ENV = frozenset({"RAY_USAGE_STATS_ENABLED", "PYTHONUNBUFFERED"})
"""Variables the portal sets on the driver that a job's ``env_vars`` may name but not change,
as on the local backend (``jobspec.RAY_RESERVED_ENV`` refuses the others)."""


def driver_job_name(job_id: str, attempt: int) -> str:
    return f"rayjob-{job_id[:12]}-{attempt}"


@dataclass(frozen=True, slots=True)
class DriverObjects:
    """What a driver's Job is built from: attempt ``attempt`` of Ray job ``job_id`` running
    ``entrypoint`` against cluster ``cluster_id`` (whose head is at ``address``)."""

    job_id: str
    attempt: int
    cluster_id: str
    tenant: str
    image: str
    address: str
    entrypoint: str
    env_vars: tuple[tuple[str, str], ...]
    job_config: str
    run_as_user: int = 1000
    run_as_group: int = 100


def driver_labels(o: DriverObjects, settings: IsolationSettings) -> dict[str, str]:
    return {
        **labels(o.cluster_id, o.tenant, settings),
        # The key kubectl admission leaves alone: the driver's Job is no job to admit.
        JobKeys.of(settings).ray_job: o.job_id,
        settings.label("ray-job-attempt"): str(o.attempt),
    }


def driver_job_manifest(o: DriverObjects, settings: IsolationSettings) -> Manifest:
    """A ``batch/v1`` Job of one pod that runs the entrypoint once (``backoffLimit`` 0: a
    retry is the portal's next attempt, recorded as such). The pod holds no device; it names
    ``schedulerName: gpuportal`` and the portal binds it beside the cluster's head."""
    resources = {"cpu": str(DRIVER_CPUS), "memory": f"{DRIVER_CPUS * MEMORY_PER_CPU_MIB}Mi"}
    secret = {"name": token_secret_name(o.cluster_id), "key": TOKEN_KEY}
    env = [
        *({"name": k, "value": v} for k, v in o.env_vars if k not in PORTAL_ENV),
        {"name": "RAY_ADDRESS", "value": o.address},
        {"name": "RAY_JOB_CONFIG_JSON_ENV_VAR", "value": o.job_config},
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": secret}},
        {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    meta = {"labels": driver_labels(o, settings)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": driver_job_name(o.job_id, o.attempt),
            "namespace": settings.namespace(o.tenant),
            **meta,
        },
        "spec": {
            "backoffLimit": 0,
            "completions": 1,
            "parallelism": 1,
            "ttlSecondsAfterFinished": DRIVER_TTL_S,
            "template": {
                "metadata": meta,
                "spec": {
                    "schedulerName": SCHEDULER_NAME,
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": restricted_pod_context(
                        o.run_as_user, o.run_as_group, fs_group=False
                    ),
                    "containers": [
                        {
                            "name": DRIVER_CONTAINER,
                            "image": o.image,
                            "command": ["/bin/sh", "-c", o.entrypoint],
                            "env": env,
                            "resources": {"requests": resources, "limits": dict(resources)},
                            "securityContext": restricted_container_context(),
                        }
                    ],
                },
            },
        },
    }


# ---- which worker pod uses which allocation --------------------------------------------------


@dataclass(frozen=True, slots=True)
class SliceHold:
    """A live slice as the plan needs it: its workload, and its allocations once placed
    (empty while it waits)."""

    number: int
    workload_id: str
    allocations: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Mark:
    """Write ``workload``/``allocation`` on ``pod`` (labels and annotations) for the binder."""

    pod: PodView
    workload_id: str
    allocation_id: str


@dataclass(frozen=True, slots=True)
class PodPlan:
    """Worker pods to mark, and those to delete (their slice was released)."""

    marks: tuple[Mark, ...]
    delete: tuple[str, ...]


def plan_workers(pods: Sequence[PodView], slices: Sequence[SliceHold], keys: PodKeys) -> PodPlan:
    """Give each worker pod without one an allocation of a placed slice (oldest slice and
    member first); a pod left over waits marked with the oldest waiting slice. A pod marked
    with a slice that is no longer live is deleted (the operator is told to drop exactly
    those, not pods it picks at random). Finished and deleting pods are left alone."""
    live = {s.workload_id for s in slices}
    placed = [
        (s.workload_id, a) for s in sorted(slices, key=lambda s: s.number) for a in s.allocations
    ]
    valid = set(placed)
    waiting = next((s for s in sorted(slices, key=lambda s: s.number) if not s.allocations), None)
    delete: list[str] = []
    unmarked: list[PodView] = []
    taken: set[tuple[str, str]] = set()
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.deleting or pod.phase in FINISHED_PHASES:
            continue
        mark = (pod.labels.get(keys.workload, ""), pod.labels.get(keys.allocation, ""))
        if mark[0] and mark[0] not in live:
            delete.append(pod.name)
        elif mark in valid and mark not in taken:
            taken.add(mark)
        elif pod.node_name:
            delete.append(pod.name)  # bound without a valid allocation: it holds nothing
        else:
            unmarked.append(pod)
    free = [p for p in placed if p not in taken]
    marks: list[Mark] = []
    for pod in unmarked:
        if free:
            workload_id, allocation_id = free.pop(0)
            marks.append(Mark(pod, workload_id, allocation_id))
        elif waiting is not None:
            current = (pod.labels.get(keys.workload), pod.labels.get(keys.allocation))
            if current != (waiting.workload_id, QUEUED_ALLOCATION):
                marks.append(Mark(pod, waiting.workload_id, QUEUED_ALLOCATION))
    return PodPlan(tuple(marks), tuple(delete))
