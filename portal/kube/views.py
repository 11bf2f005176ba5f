"""Typed views of what the binder and the sweep read: pods, and the allocator's answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from portal.allocator.views import WorkloadStatus

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
"""Pod phases in which the containers have stopped for good: the devices are free again."""


class AllocationSource(Protocol):
    """What the binder and the sweep need from the allocator (``portal.allocator.Allocator``
    has exactly these methods)."""

    def status(self, workload_id: str, *, estimate: bool = True) -> WorkloadStatus:
        """The workload's status (``estimate=False``: without its place in the queue and
        ETA, which binding never reads); raises ``NotFound`` for an unknown id."""
        ...

    def workloads(self, tenant: str | None = None) -> list[WorkloadStatus]:
        """Every non-terminal workload."""
        ...

    def release(self, workload_id: str, *, reason: str = "released") -> WorkloadStatus:
        """Release the workload's devices; idempotent."""
        ...


@dataclass(frozen=True, slots=True)
class PodView:
    """The parts of a Pod the binder and the sweep read."""

    namespace: str
    name: str
    uid: str
    scheduler_name: str
    node_name: str | None
    phase: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    deleting: bool = False

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_view(pod: Any) -> PodView:
    """A typed view of a ``V1Pod`` (either client library) or its plain dict form."""
    if isinstance(pod, Mapping):
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        return PodView(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            scheduler_name=str(spec.get("schedulerName") or ""),
            node_name=spec.get("nodeName") or None,
            phase=str(status.get("phase") or ""),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            deleting=meta.get("deletionTimestamp") is not None,
        )
    meta, spec, status = pod.metadata, pod.spec, pod.status
    return PodView(
        namespace=str(meta.namespace or ""),
        name=str(meta.name or ""),
        uid=str(meta.uid or ""),
        scheduler_name=str((spec.scheduler_name if spec else None) or ""),
        node_name=(spec.node_name if spec else None) or None,
        phase=str((status.phase if status else None) or ""),
        labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}),
        deleting=meta.deletion_timestamp is not None,
    )
