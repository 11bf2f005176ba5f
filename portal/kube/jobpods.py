"""Binding the pods of training jobs: indexed pods that the Job controller made.

A Job's pods share one template, so unlike a notebook pod none names its allocation. The
binder finds it on its snapshot instead: the pod's Job (by the Job controller's
``job-name`` and ``controller-uid`` labels) carries the attempt's ``workload`` label (the
portal created the Job, or labelled a kubectl Job when it admitted it); the pod's completion
index is its rank; the allocator's placement of that workload, laid out contiguously per node
(``policies.jobs.rank_layout``), gives the rank's allocation and node. The pod is then
labelled and annotated like a notebook pod (so ``in_use`` sees it) plus its place on the node
(``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``, which its environment reads), and bound.
The same holds as for notebook pods: the namespace must be the workload's tenant's, and one
allocation is used by one pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.errors import NotFound
from policies.isolation import IsolationSettings
from policies.jobs import rank_layout
from portal.jobs.kube.manifests import (
    COMPLETION_INDEX,
    JOB_NAME_LABEL,
    JOB_UID_LABEL,
    JobKeys,
    rank_annotations,
)
from portal.kube.keys import PodKeys
from portal.kube.views import AllocationSource, PodView
from portal.store.records import WorkloadState


@dataclass(frozen=True, slots=True)
class JobRef:
    """A Job the portal runs an attempt in: its uid and the attempt's workload."""

    uid: str
    workload_id: str


def job_refs(
    jobs: Iterable[Mapping[str, Any]], settings: IsolationSettings
) -> dict[tuple[str, str], JobRef]:
    """(namespace, name) -> the Job's reference, of Jobs carrying a workload label."""
    key = JobKeys.of(settings).workload
    out = {}
    for job in jobs:
        meta = job.get("metadata") or {}
        workload = (meta.get("labels") or {}).get(key)
        if workload:
            out[(meta.get("namespace", ""), meta.get("name", ""))] = JobRef(
                meta.get("uid", ""), workload
            )
    return out


def completion_index(pod: PodView) -> int | None:
    raw = pod.labels.get(COMPLETION_INDEX) or pod.annotations.get(COMPLETION_INDEX)
    return int(raw) if raw is not None and raw.isdigit() else None


def is_job_pod(pod: PodView, keys: PodKeys) -> bool:
    """An indexed Job's pod that names no allocation itself."""
    return (
        JOB_NAME_LABEL in pod.labels
        and completion_index(pod) is not None
        and keys.allocation not in pod.annotations
    )


@dataclass(frozen=True, slots=True)
class JobPlacement:
    """Where a job pod goes and what it is marked with before the bind."""

    node: str
    workload_id: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class JobHold:
    """Why a job pod is not bound: ``reason`` is a ``HoldReason`` value."""

    reason: str
    message: str


def place_job_pod(
    pod: PodView,
    refs: Mapping[tuple[str, str], JobRef],
    source: AllocationSource,
    settings: IsolationSettings,
    holders: Mapping[str, PodView],
) -> JobPlacement | JobHold:
    """Decide one job pod on the snapshot ``refs``/``holders`` and the allocator's answer."""
    job_name = pod.labels.get(JOB_NAME_LABEL, "")
    ref = refs.get((pod.namespace, job_name))
    if ref is None or (ref.uid and pod.labels.get(JOB_UID_LABEL, ref.uid) != ref.uid):
        return JobHold(
            "GPUJobNotAdmitted",
            f"Job {pod.namespace}/{job_name} is not admitted by the portal (yet); its pods are "
            "bound once its gang is placed",
        )
    try:
        status = source.status(ref.workload_id, estimate=False)
    except NotFound:
        return JobHold(
            "UnknownGPUAllocation",
            f"the portal has no workload {ref.workload_id} (pod {pod}); it will not be bound",
        )
    if status.state is WorkloadState.QUEUED:
        where = f" ({status.message})" if status.message else ""
        return JobHold(
            "GPUAllocationQueued",
            f"workload {ref.workload_id} is queued{where}; the pod is bound once it is placed",
        )
    if status.state is not WorkloadState.RUNNING:
        return JobHold(
            "GPUAllocationEnded",
            f"workload {ref.workload_id} is {status.state.value}; its devices are not held, so "
            f"pod {pod} will not be bound",
        )
    expected = settings.namespace(status.tenant)
    if pod.namespace != expected:
        return JobHold(
            "GPUAllocationOfAnotherTenant",
            f"workload {ref.workload_id} belongs to tenant {status.tenant}, whose pods run in "
            f"namespace {expected}; pod {pod} will not be bound",
        )
    index = completion_index(pod)
    slots = rank_layout([(a.member, a.node) for a in status.allocations])
    if index is None or index >= len(slots):
        return JobHold(
            "UnknownGPUAllocation",
            f"pod {pod} has completion index {index}, but workload {ref.workload_id} has "
            f"{len(slots)} members; it will not be bound",
        )
    slot = slots[index]
    allocation = next(a for a in status.allocations if a.member == slot.member)
    holder = holders.get(allocation.id)
    if holder is not None and holder.uid != pod.uid:
        return JobHold(
            "GPUAllocationInUse",
            f"rank {index}'s allocation {allocation.id} is already used by pod {holder}; pod "
            f"{pod} will not be bound",
        )
    keys = PodKeys.of(settings)
    annotations = {
        keys.workload: ref.workload_id,
        keys.allocation: allocation.id,
        keys.node: allocation.node,
        keys.flavor: allocation.flavor,
        keys.gpus: ",".join(str(g) for g in allocation.gpus),
        **rank_annotations(
            JobKeys.of(settings), slot.local_rank, slot.local_world_size, slot.node_rank
        ),
    }
    labels = {keys.workload: ref.workload_id, keys.allocation: allocation.id}
    return JobPlacement(allocation.node, ref.workload_id, labels, annotations)
