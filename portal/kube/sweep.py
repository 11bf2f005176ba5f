"""Pods deleted behind the hub's back give their devices back.

Each sweep lists the portal's pods and releases, through the allocator, every running workload
whose pods are all gone or finished: at once if a pod of it was seen before, or, when none ever
was (the pod is not created yet, or the portal restarted), once the allocation is older than a
grace period. A pod being deleted still holds its devices until it is gone. The allocator's
release is idempotent, so each workload is released once. Workloads of kind ``job`` are left to
the job controller, which releases an attempt when its members end, those of kind ``ray``
to the Ray controller, which releases a slice when its cluster shrinks or stops, and those of
kind ``inference`` to the service controller, which releases a replica when its pod is gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from kubernetes import client

from policies.isolation import IsolationSettings
from policies.requests import WorkloadKind
from portal.allocator.views import WorkloadStatus
from portal.kube.keys import PodKeys
from portal.kube.views import FINISHED_PHASES, AllocationSource, PodView, pod_view
from portal.store.records import WorkloadState

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
RELEASE_REASON = "pod-gone"
# States that hold devices; a preempted workload's pod going away is the expected end of it.
HOLDING = frozenset({WorkloadState.RUNNING, WorkloadState.PREEMPTING})
OWNED_KINDS = frozenset(
    k.value for k in (WorkloadKind.JOB, WorkloadKind.RAY, WorkloadKind.INFERENCE)
)
"""Workload kinds whose controllers release them when their pods go."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def gone(
    pods: Iterable[PodView],
    live: Iterable[WorkloadStatus],
    seen: set[str],
    keys: PodKeys,
    now: datetime,
    grace_s: float,
) -> list[str]:
    """Workloads holding devices whose pods are all gone or finished (see the module doc).

    Adds every workload with a live pod to ``seen``; returns the ids to release, sorted.
    """
    alive: set[str] = set()
    for p in pods:
        workload = p.labels.get(keys.workload)
        if workload and p.phase not in FINISHED_PHASES:
            alive.add(workload)
    seen.update(alive)
    out = []
    for w in live:
        if w.state not in HOLDING or not w.allocations or w.id in alive:
            continue
        if w.kind in OWNED_KINDS:
            # The job, Ray and service controllers own their pods (a Ray worker pod the
            # operator replaces keeps its slice) and release their workloads themselves.
            continue
        started = w.started_at or w.created_at
        if w.id in seen or (now - started).total_seconds() >= grace_s:
            out.append(w.id)
    return sorted(out)


class Sweeper:
    """Releases allocations whose pods are gone (see the module doc).

    Needs, cluster-wide: pods list.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        source: AllocationSource,
        settings: IsolationSettings,
        *,
        grace_s: float = 300.0,
        clock: Clock = utcnow,
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._source = source
        self._keys = PodKeys.of(settings)
        self._grace_s = grace_s
        self._clock = clock
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def sweep(self) -> list[str]:
        """One sweep: the ids of the workloads it released."""
        with self._lock:
            # Workloads before pods: one allocated while the pods are listed is not judged on a
            # list that is older than it.
            live = self._source.workloads()
            pods = self._core.list_pod_for_all_namespaces(
                label_selector=self._keys.selector()
            ).items
            ids = gone(
                map(pod_view, pods), live, self._seen, self._keys, self._clock(), self._grace_s
            )
            released = []
            for workload_id in ids:
                status = self._source.release(workload_id, reason=RELEASE_REASON)
                self._seen.discard(workload_id)
                if status.reason == RELEASE_REASON:
                    released.append(workload_id)
                    log.info("sweep: released workload %s: its pods are gone", workload_id)
            # Forget workloads that ended through the hub (no longer live).
            self._seen &= {w.id for w in live}
            return released
