"""What the weight cache writes and reads on Kubernetes, with no I/O (decision 0015).

Pod Security ``restricted`` forbids ``hostPath``, so a node's cache is reached through a
**local PersistentVolume** per (node, tenant): the folder ``<node path>/<namespace>`` on that
node, with node affinity to it, pre-bound to one **claim** in the tenant's namespace. A claim
is namespaced and a volume binds one claim, so each tenant has its own folder: no tenant can
mount, read or fill another's weights, at the price of one copy per tenant on a node (not one
per node) when two tenants serve the same model.

Each (node, tenant, digest) is fetched once by a **fetch Job** in the tenant's namespace: one
pod, restricted, no GPU, set on the node by the portal (``nodeName``), running
``python -m portal.inference.fetch`` from the portal's image with the claim mounted
read-write. Its exit code tells a refusal (the digest does not match: never retried, never
mounted) from a source that failed. Replica pods mount the same claim **read-only** at
``MOUNT`` with the entry's folder as ``subPath``, and are created only once the Job
succeeded. The fetch Jobs the portal wrote are the cache's entries per node and tenant (with
their declared size and last use as annotations). An **evict Job** is the same pod running
``--evict``: it removes one entry's folder to make room for another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from policies.isolation import IsolationSettings
from policies.isolation.common import MANAGER
from policies.isolation.podsecurity import restricted_container_context, restricted_pod_context
from policies.services import ModelRef
from portal.inference import fetch
from portal.inference.digest import PREFIX

Manifest = dict[str, Any]

MOUNT = "/weights"
"""Where a replica finds its model's folder (what ``{model}`` is in its command)."""
CACHE = "/cache"
"""Where a fetch pod has the tenant's cache folder."""
STORAGE_CLASS = "gpuportal-weights"
"""The class the cache's volumes and claims name (no provisioner: each is made by the portal
and bound to the other)."""
FETCH_CONTAINER = "fetch"
COMPONENT = "weight-cache"
FETCH_COMPONENT = "weight-fetch"
EVICT_COMPONENT = "weight-evict"
SIZE = "size"
"""The fetch Job's annotation of the entry's size as its source declared it (bytes)."""
LAST_USED = "last-used"
"""The fetch Job's annotation of when a replica last started on the entry (ISO time)."""
FETCH_RESOURCES = {"cpu": "500m", "memory": "512Mi"}
"""A fetch streams to disk and hashes in 1 MiB chunks: little CPU and memory, no GPU."""
FETCH_RETRIES = 2
"""Tries after the first for a source that failed (exit ``UNAVAILABLE``); a refusal (``USAGE``,
``MISMATCH``, ``TOO_LARGE``) ends the Job at once."""
FETCH_DEADLINE_S = 3600
"""A fetch that has not ended in an hour (a pod that cannot start: the node's folder missing,
say) fails, so its replicas stop holding their devices and the next one tries again."""


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The cache's settings on Kubernetes: the folder on each GPU node under which every
    tenant's folder lies, the image holding the portal (its fetch module), and the bytes a
    tenant may cache on a node (a model above is refused by its fetch)."""

    node_path: str
    image: str
    tenant_bytes: int
    run_as_user: int = 1000
    run_as_group: int = 100


def _short(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:12]


def hex_of(digest: str) -> str:
    return digest.removeprefix(PREFIX)


def volume_name(node: str, namespace: str) -> str:
    """The local PersistentVolume of ``namespace``'s cache on ``node`` (cluster-scoped)."""
    return f"gpuportal-weights-{namespace[:40]}-{_short(node, namespace)}"


def claim_name(node: str) -> str:
    """The tenant's claim of its cache on ``node`` (in its namespace)."""
    return f"weights-{_short(node)}"


def fetch_job_name(node: str, digest: str) -> str:
    return f"fetch-{hex_of(digest)[:16]}-{_short(node)}"


def evict_job_name(node: str, digest: str) -> str:
    return f"evict-{hex_of(digest)[:16]}-{_short(node)}"


def _labels(settings: IsolationSettings, tenant: str, component: str) -> dict[str, str]:
    return {
        settings.label("managed-by"): MANAGER,
        settings.label("tenant"): tenant,
        settings.label("component"): component,
    }


def _annotations(settings: IsolationSettings, node: str, digest: str = "") -> dict[str, str]:
    out = {settings.label("node"): node}
    if digest:
        out[settings.label("digest")] = digest
    return out


def cache_volume(node: str, tenant: str, c: CacheConfig, settings: IsolationSettings) -> Manifest:
    namespace = settings.namespace(tenant)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(node, namespace),
            "labels": _labels(settings, tenant, COMPONENT),
            "annotations": _annotations(settings, node),
        },
        "spec": {
            "capacity": {"storage": str(c.tenant_bytes)},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": "Filesystem",
            "local": {"path": f"{c.node_path.rstrip('/')}/{namespace}"},
            "claimRef": {"namespace": namespace, "name": claim_name(node)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


def cache_claim(node: str, tenant: str, c: CacheConfig, settings: IsolationSettings) -> Manifest:
    namespace = settings.namespace(tenant)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name(node),
            "namespace": namespace,
            "labels": _labels(settings, tenant, COMPONENT),
            "annotations": _annotations(settings, node),
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": STORAGE_CLASS,
            "volumeName": volume_name(node, namespace),
            "resources": {"requests": {"storage": str(c.tenant_bytes)}},
        },
    }


def fetch_job(
    node: str,
    tenant: str,
    model: ModelRef,
    c: CacheConfig,
    settings: IsolationSettings,
    size: int = 0,
) -> Manifest:
    """The Job that fetches ``model`` into ``tenant``'s cache on ``node`` (see the module).
    ``size``, when known (the source declared it), is recorded on the Job: the entry counts
    that much until its pod reports what it verified."""
    refusals = sorted(code for code in fetch.EXIT_REASONS if code != fetch.UNAVAILABLE)
    command = [
        "python", "-m", "portal.inference.fetch", model.uri, model.digest, CACHE,
        "--limit", str(c.tenant_bytes), "--report", "/dev/termination-log",
    ]  # fmt: skip
    job = _cache_job(
        fetch_job_name(node, model.digest), node, tenant, model.digest, command, c, settings,
        FETCH_COMPONENT,
    )  # fmt: skip
    if size > 0:
        job["metadata"]["annotations"][settings.label(SIZE)] = str(size)
    job["spec"]["podFailurePolicy"] = {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": FETCH_CONTAINER,
                    "operator": "In",
                    "values": refusals,
                },
            }
        ]
    }
    return job


def evict_job(
    node: str, tenant: str, digest: str, c: CacheConfig, settings: IsolationSettings
) -> Manifest:
    """The Job that removes ``digest``'s entry from ``tenant``'s cache on ``node``: the fetch
    pod's image, module, volume and restrictions, running ``--evict``."""
    command = ["python", "-m", "portal.inference.fetch", "--evict", digest, CACHE]
    return _cache_job(
        evict_job_name(node, digest), node, tenant, digest, command, c, settings, EVICT_COMPONENT
    )


def _cache_job(
    name: str,
    node: str,
    tenant: str,
    digest: str,
    command: list[str],
    c: CacheConfig,
    settings: IsolationSettings,
    component: str,
) -> Manifest:
    labels = _labels(settings, tenant, component)
    annotations = _annotations(settings, node, digest)
    container: Manifest = {
        "name": FETCH_CONTAINER,
        "image": c.image,
        "command": command,
        "env": [{"name": "HOME", "value": "/tmp"}],
        "resources": {"requests": dict(FETCH_RESOURCES), "limits": dict(FETCH_RESOURCES)},
        "securityContext": restricted_container_context(read_only_root=True),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "cache", "mountPath": CACHE},
            {"name": "scratch", "mountPath": "/tmp"},
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": settings.namespace(tenant),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "backoffLimit": FETCH_RETRIES,
            "activeDeadlineSeconds": FETCH_DEADLINE_S,
            "template": {
                "metadata": {"labels": dict(labels), "annotations": dict(annotations)},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeName": node,
                    "serviceAccountName": settings.jobs_service_account,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": restricted_pod_context(c.run_as_user, c.run_as_group),
                    "containers": [container],
                    "volumes": [
                        {"name": "cache", "persistentVolumeClaim": {"claimName": claim_name(node)}},
                        {"name": "scratch", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def replica_volume(node: str, digest: str) -> tuple[Manifest, Manifest]:
    """A replica's volume (the tenant's claim on ``node``, read-only) and its mount (the
    entry's folder at ``MOUNT``, read-only)."""
    volume = {
        "name": "weights",
        "persistentVolumeClaim": {"claimName": claim_name(node), "readOnly": True},
    }
    mount = {"name": "weights", "mountPath": MOUNT, "subPath": hex_of(digest), "readOnly": True}
    return volume, mount


# ---- reading ---------------------------------------------------------------------------------


class FetchState(StrEnum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class FetchJob:
    """A fetch (or evict) Job as the cache reads it."""

    namespace: str
    tenant: str
    node: str
    digest: str
    state: FetchState
    finished_at: str
    message: str
    name: str = ""
    declared: int = 0
    """The size its source declared (``SIZE``), 0 if unknown."""
    last_used: str = ""
    """When a replica last started on the entry (``LAST_USED``), "" if none did since."""
    deleting: bool = False
    """Being deleted (its entry evicted, or its source failed): counts as nothing."""


def fetch_job_view(
    job: Mapping[str, Any], settings: IsolationSettings, component: str = FETCH_COMPONENT
) -> FetchJob | None:
    """The fetch Job ``job`` is (its plain JSON form), or None for another Job; with
    ``component=EVICT_COMPONENT``, the evict Job."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if labels.get(settings.label("component")) != component:
        return None
    status = job.get("status") or {}
    conditions = {
        c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"
    }
    if meta.get("deletionTimestamp"):
        # Deleted after its source failed: replicas wait for it to go and a new one to run,
        # rather than each being refused by the old one meanwhile.
        state, cond = FetchState.RUNNING, {}
    elif "Complete" in conditions:
        state, cond = FetchState.DONE, conditions["Complete"]
    elif "Failed" in conditions:
        state, cond = FetchState.FAILED, conditions["Failed"]
    else:
        state, cond = FetchState.RUNNING, {}
    return FetchJob(
        namespace=str(meta.get("namespace") or ""),
        tenant=str(labels.get(settings.label("tenant")) or ""),
        node=str(annotations.get(settings.label("node")) or ""),
        digest=str(annotations.get(settings.label("digest")) or ""),
        state=state,
        finished_at=str(status.get("completionTime") or cond.get("lastTransitionTime") or ""),
        message=str(cond.get("message") or ""),
        name=str(meta.get("name") or ""),
        declared=_int(annotations.get(settings.label(SIZE))),
        last_used=str(annotations.get(settings.label(LAST_USED)) or ""),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def _int(text: object) -> int:
    try:
        return max(int(str(text)), 0)
    except ValueError:
        return 0


def failure_reason(code: int | None, message: str) -> str:
    """Why a fetch failed, from its pod's exit code and termination message (or, with no
    code, the Job's own words: its deadline passed, say)."""
    if code is None:
        known = "the fetch did not finish"
    else:
        known = fetch.EXIT_REASONS.get(code, f"the fetch pod failed (exit code {code})")
    detail = message.strip().splitlines()[-1] if message.strip() else ""
    return f"{known}: {detail}" if detail else known
