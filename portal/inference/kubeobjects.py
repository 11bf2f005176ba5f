"""What the Kubernetes backend of services writes and reads, with no I/O.

- Each replica is one **pod** in the tenant's namespace, named after its service and number,
  with ``schedulerName: gpuportal`` and the allocator's workload and allocation on it (labels
  and annotations), so the portal's binder (``portal.kube.binder``) binds it to the node the
  allocator chose, and to nothing else. It asks the device-plugin resource of its devices
  (what the tenant's ResourceQuota counts), runs the preset's image and command with
  ``{host}`` = ``0.0.0.0`` and ``{port}`` = the cluster's ``inference_port``, under the
  restricted Pod Security profile: non-root, no privilege escalation, every capability
  dropped, the default seccomp profile, no ServiceAccount token, and a read-only root file
  system with two scratch ``emptyDir`` volumes (``/tmp``, where ``HOME`` and the engines'
  caches point, and ``/dev/shm``, which engines use between their workers), plus, for a model
  in the weight cache, its entry read-only (``portal.inference.kubeweights``). ``restartPolicy:
  Never``: an engine that exits is replaced through the allocator (so quota and the
  start-failure limit apply), not restarted in place.
- Each service has one headless **Service** selecting its pods; with the pods' ``hostname``
  and ``subdomain`` it gives every replica the stable name ``r<N>.<service>.<namespace>.svc``
  the gateway sends requests to (per-pod addressing: the gateway balances over replicas
  itself, and no name changes when a pod is re-created).
- The labels come from ``policies.isolation.network.replica_selector``: the tenant's
  ``allow-gateway-to-replicas`` NetworkPolicy lets only the portal's pods reach that port.

No label is trusted for the tenant: the namespace is the tenant's, and the binder refuses an
allocation of another tenant's (``HoldReason.WRONG_NAMESPACE``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.isolation import IsolationSettings
from policies.isolation.common import MANAGER
from policies.isolation.network import replica_selector
from policies.isolation.podsecurity import restricted_container_context, restricted_pod_context
from portal.inference import kubeweights as kw
from portal.jobs.kube.manifests import gpu_resources
from portal.jobs.kube.pods import exit_code
from portal.kube.keys import SCHEDULER_NAME, PodKeys
from portal.kube.views import FINISHED_PHASES
from portal.store.records import AllocationRecord

Manifest = dict[str, Any]

CONTAINER = "engine"
BIND_ALL = "0.0.0.0"
"""What ``{host}`` is on Kubernetes: the pod's own addresses (the NetworkPolicy decides who
calls them)."""
SCRATCH = "/tmp"
SCRATCH_ENV = {
    "HOME": SCRATCH,
    "XDG_CACHE_HOME": f"{SCRATCH}/.cache",
    "HF_HOME": f"{SCRATCH}/.cache/huggingface",
}
"""Where engines write with a read-only root file system."""
ID_CHARS = 12
"""Characters of a service id in its object names (DNS labels are at most 63 characters)."""


@dataclass(frozen=True, slots=True)
class ReplicaKeys:
    """Label keys of a replica pod beyond the binder's (``PodKeys``)."""

    managed_by: str
    tenant: str
    service: str
    replica: str

    @staticmethod
    def of(settings: IsolationSettings) -> ReplicaKeys:
        return ReplicaKeys(
            managed_by=settings.label("managed-by"),
            tenant=settings.label("tenant"),
            service=settings.label("service"),
            replica=settings.label("replica"),
        )


def service_name(service_id: str) -> str:
    """The headless Service of a service (its pods' ``subdomain``)."""
    return f"svc-{service_id[:ID_CHARS]}"


def pod_name(service_id: str, number: int) -> str:
    return f"{service_name(service_id)}-r{number}"


def address(service_id: str, number: int, namespace: str) -> str:
    """The DNS name of replica ``number`` (see the module doc)."""
    return f"r{number}.{service_name(service_id)}.{namespace}.svc"


def service_labels(service_id: str, tenant: str, settings: IsolationSettings) -> dict[str, str]:
    keys = ReplicaKeys.of(settings)
    return {
        keys.managed_by: MANAGER,
        keys.tenant: tenant,
        keys.service: service_id,
        **replica_selector(settings),
    }


@dataclass(frozen=True, slots=True)
class ReplicaObjects:
    """What a replica's pod is built from: the service's id and tenant, the replica's number,
    workload and allocation, and the engine as the preset (or ``engine.image``) gives it,
    ``command`` with its placeholders filled in."""

    service_id: str
    tenant: str
    number: int
    workload_id: str
    allocation: AllocationRecord
    image: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    health_path: str
    stop_grace_s: float = 10.0
    run_as_user: int = 1000
    run_as_group: int = 100
    weights: str | None = None
    """The digest of the model the weight cache holds on the node (``kubeweights``): the pod
    mounts that entry read-only at ``kubeweights.MOUNT``."""


def replica_pod(o: ReplicaObjects, settings: IsolationSettings) -> Manifest:
    """The replica's pod (see the module doc)."""
    keys, pod_keys = ReplicaKeys.of(settings), PodKeys.of(settings)
    a = o.allocation
    resources = gpu_resources(a.flavor, len(a.gpus), a.milli, settings)
    if a.cpu_milli:
        resources["cpu"] = f"{a.cpu_milli}m"
    if a.memory_mib:
        resources["memory"] = f"{a.memory_mib}Mi"
    mark = {pod_keys.workload: o.workload_id, pod_keys.allocation: a.id}
    labels = {
        **service_labels(o.service_id, o.tenant, settings),
        keys.replica: str(o.number),
        **mark,
    }
    annotations = {
        **mark,
        pod_keys.node: a.node,
        pod_keys.flavor: a.flavor,
        pod_keys.gpus: ",".join(map(str, a.gpus)),
        pod_keys.gpu_uuids: ",".join(a.gpu_uuids),
    }
    env = {**o.env, **SCRATCH_ENV}
    port = settings.inference_port
    volumes: list[Manifest] = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts: list[Manifest] = [
        {"name": "scratch", "mountPath": SCRATCH},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    if o.weights is not None:
        volume, mount = kw.replica_volume(a.node, o.weights)
        volumes.append(volume)
        mounts.append(mount)
    container: Manifest = {
        "name": CONTAINER,
        "image": o.image,
        "command": list(o.command),
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": o.health_path, "port": port},
            "periodSeconds": 5,
        },
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": restricted_container_context(read_only_root=True),
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(o.service_id, o.number),
            "namespace": settings.namespace(o.tenant),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "restartPolicy": "Never",
            "schedulerName": SCHEDULER_NAME,
            "hostname": f"r{o.number}",
            "subdomain": service_name(o.service_id),
            "serviceAccountName": settings.jobs_service_account,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": math.ceil(o.stop_grace_s),
            "securityContext": restricted_pod_context(o.run_as_user, o.run_as_group),
            "containers": [container],
            "volumes": volumes,
        },
    }


def headless_service(service_id: str, tenant: str, settings: IsolationSettings) -> Manifest:
    """The service's headless Service: DNS names for its pods, ready or not (the portal
    reads readiness from the pods and routes only to ready ones)."""
    selector = {
        ReplicaKeys.of(settings).service: service_id,
        **replica_selector(settings),
    }
    port = settings.inference_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(service_id),
            "namespace": settings.namespace(tenant),
            "labels": service_labels(service_id, tenant, settings),
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


# ---- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaPod:
    """A replica pod as the runner reads it."""

    service_id: str
    number: int
    namespace: str
    name: str
    uid: str
    phase: str
    ready: bool
    deleting: bool
    exit_code: int | None

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES


def replica_pod_view(pod: Mapping[str, Any], settings: IsolationSettings) -> ReplicaPod | None:
    """The replica ``pod`` is (from its plain JSON form), or None for a pod that is not one."""
    keys = ReplicaKeys.of(settings)
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    number = labels.get(keys.replica, "")
    if not labels.get(keys.service) or not number.isdigit():
        return None
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return ReplicaPod(
        service_id=labels[keys.service],
        number=int(number),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        phase=str(status.get("phase") or ""),
        ready=ready,
        deleting=meta.get("deletionTimestamp") is not None,
        exit_code=exit_code(status),
    )
