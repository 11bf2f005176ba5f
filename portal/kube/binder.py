"""The portal as the scheduler of record for GPU pods (architecture decision 1).

The allocator decides where a GPU workload runs; the binder makes Kubernetes follow that
decision. Pods with ``schedulerName: gpuportal`` are left alone by the default scheduler; the
binder binds each one to its allocation's node through the Binding API (``pods/binding``).

One pass (``Binder.bind_pending``), in steps:

1. list the unbound pods with our scheduler name (a field selector: the apiserver filters), and
   every pod carrying the portal's labels, for the allocations already in use;
2. decide each pending pod on that snapshot and the allocator's answer (``decide``): bind to the
   allocation's node, or hold with a reason — no allocation annotation, an unknown allocation,
   an allocation that is queued or has ended, a pod outside its tenant's namespace, or an
   allocation another pod already uses. Nothing is guessed: a held pod stays Pending;
3. act, up to ``ACT_WORKERS`` decisions at once (step 2 gave each allocation to one pod at
   most): create the Binding (with the pod's uid as precondition, so a pod re-created under the
   same name is never bound on a stale decision), or post a Warning Event on the pod that says
   why it waits (named after pod, uid and reason, so repeating a pass posts it once).

A pass is idempotent and keeps no state that Kubernetes does not hold (it remembers only which
held pods' Events it posted, so that a pod waiting in the queue costs no call per pass): a pod
already bound is not listed again, and a Binding refused because the pod is bound meanwhile
(409) counts as done. A restarted binder simply runs the next pass.

The reverse direction, pods deleted behind the hub's back, is ``portal.kube.sweep``;
``portal.kube.service`` runs both as loops of ``gpuportal serve``.

Pods of training jobs (indexed Jobs, which name no allocation themselves) are decided by
``portal.kube.jobpods`` on the same snapshot plus the portal's Jobs, and get their allocation
and rank written on them just before the bind.

Kubernetes objects become typed views (``PodView``) at the boundary; decisions use only views.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.errors import NotFound
from policies.isolation import IsolationSettings
from portal.allocator.views import WorkloadStatus
from portal.kube import jobpods
from portal.kube.calls import drain
from portal.kube.informer import Informer
from portal.kube.keys import EVENT_SOURCE, SCHEDULER_NAME, PodKeys
from portal.kube.views import FINISHED_PHASES, AllocationSource, PodView, pod_view
from portal.store.records import WorkloadState

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
ACT_WORKERS = 16
"""Decisions of a pass carried out at once (each pod's calls stay in order). A bind is three
round trips (mark, Binding, Event) that wait on the apiserver, not on this process: with 4 at
a time a pass of a burst of job pods took seconds, and pods created meanwhile waited for it.
The client's connection pool must hold this many (``portal.kube.service.cluster_client``)."""


def utcnow() -> datetime:
    return datetime.now(UTC)


# ---- deciding --------------------------------------------------------------------------------


class HoldReason(StrEnum):
    """Why a pod is not bound (the ``reason`` of the Event posted on it)."""

    NO_ALLOCATION = "NoGPUAllocation"
    UNKNOWN_ALLOCATION = "UnknownGPUAllocation"
    ALLOCATION_QUEUED = "GPUAllocationQueued"
    ALLOCATION_ENDED = "GPUAllocationEnded"
    WRONG_NAMESPACE = "GPUAllocationOfAnotherTenant"
    ALLOCATION_IN_USE = "GPUAllocationInUse"
    JOB_NOT_ADMITTED = "GPUJobNotAdmitted"

    @property
    def event_type(self) -> str:
        # Waiting in the queue is normal; everything else needs someone to act.
        waiting = (HoldReason.ALLOCATION_QUEUED, HoldReason.JOB_NOT_ADMITTED)
        return "Normal" if self in waiting else "Warning"


@dataclass(frozen=True, slots=True)
class Bind:
    """Bind ``pod`` to ``node``, after adding ``labels`` and ``annotations`` to it (a job
    pod's allocation and rank: ``portal.kube.jobpods``)."""

    pod: PodView
    node: str
    workload_id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Hold:
    """Leave ``pod`` Pending; ``message`` says why and what would unblock it."""

    pod: PodView
    reason: HoldReason
    message: str


Decision = Bind | Hold


def in_use(pods: Iterable[PodView], keys: PodKeys) -> dict[str, PodView]:
    """Allocation id -> the pod holding it: bound to a node and neither finished nor deleted."""
    held: dict[str, PodView] = {}
    for p in pods:
        allocation = p.annotations.get(keys.allocation)
        if allocation and p.node_name and p.phase not in FINISHED_PHASES and not p.deleting:
            held[allocation] = p
    return held


def decide(
    pod: PodView,
    source: AllocationSource,
    settings: IsolationSettings,
    holders: Mapping[str, PodView],
) -> Decision:
    """Where ``pod`` goes, from its annotations and the allocator's answer (see module doc)."""
    keys = PodKeys.of(settings)
    workload_id = pod.annotations.get(keys.workload)
    allocation_id = pod.annotations.get(keys.allocation)
    if not workload_id or not allocation_id:
        return Hold(
            pod,
            HoldReason.NO_ALLOCATION,
            f"pod {pod} uses scheduler {SCHEDULER_NAME} but lacks the annotations "
            f"{keys.workload} and {keys.allocation}; the portal binds only pods it allocated "
            "devices for: start it through JupyterHub or the portal API",
        )
    try:
        status = source.status(workload_id, estimate=False)
    except NotFound:
        return Hold(
            pod,
            HoldReason.UNKNOWN_ALLOCATION,
            f"the portal has no workload {workload_id} (pod {pod}); it will not be bound",
        )
    if status.state is WorkloadState.QUEUED:
        where = f" ({status.message})" if status.message else ""
        return Hold(
            pod,
            HoldReason.ALLOCATION_QUEUED,
            f"workload {workload_id} is queued{where}; the pod is bound once it is allocated",
        )
    if status.state is WorkloadState.PREEMPTING:
        return Hold(
            pod,
            HoldReason.ALLOCATION_ENDED,
            f"workload {workload_id} is being preempted ({status.reason or 'reclaimed'}); its "
            f"devices are being taken back, so pod {pod} will not be bound",
        )
    if status.state is not WorkloadState.RUNNING:
        why = f": {status.reason}" if status.reason else ""
        return Hold(
            pod,
            HoldReason.ALLOCATION_ENDED,
            f"workload {workload_id} is {status.state.value}{why}; its devices are no longer "
            f"held, so pod {pod} will not be bound: delete it",
        )
    allocation = next((a for a in status.allocations if a.id == allocation_id), None)
    if allocation is None:
        known = ", ".join(a.id for a in status.allocations) or "none"
        return Hold(
            pod,
            HoldReason.UNKNOWN_ALLOCATION,
            f"workload {workload_id} has no allocation {allocation_id} (it holds: {known}); "
            f"pod {pod} will not be bound",
        )
    expected = settings.namespace(status.tenant)
    if pod.namespace != expected:
        return Hold(
            pod,
            HoldReason.WRONG_NAMESPACE,
            f"allocation {allocation_id} belongs to tenant {status.tenant}, whose pods run in "
            f"namespace {expected}; pod {pod} will not be bound",
        )
    holder = holders.get(allocation_id)
    if holder is not None and holder.uid != pod.uid:
        return Hold(
            pod,
            HoldReason.ALLOCATION_IN_USE,
            f"allocation {allocation_id} is already used by pod {holder} on node "
            f"{holder.node_name}; pod {pod} will not be bound",
        )
    return Bind(pod, allocation.node, workload_id)


class _PassStatuses:
    """The allocator's answers within one pass, asked once per workload (an
    ``AllocationSource`` for ``decide`` and ``jobpods.place_job_pod``)."""

    def __init__(self, source: AllocationSource) -> None:
        self._source = source
        self._answers: dict[str, WorkloadStatus | NotFound] = {}

    def status(self, workload_id: str, *, estimate: bool = True) -> WorkloadStatus:
        answer = self._answers.get(workload_id)
        if answer is None:
            try:
                answer = self._source.status(workload_id, estimate=False)
            except NotFound as e:
                answer = e
            self._answers[workload_id] = answer
        if isinstance(answer, NotFound):
            raise answer
        return answer

    def workloads(self, tenant: str | None = None) -> list[WorkloadStatus]:
        return self._source.workloads(tenant)

    def release(self, workload_id: str, *, reason: str = "released") -> WorkloadStatus:
        return self._source.release(workload_id, reason=reason)


# ---- acting ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BindReport:
    """What one pass did: pods bound (pod, node), held (pod, reason), failed (pod, error)."""

    bound: tuple[tuple[str, str], ...] = ()
    held: tuple[tuple[str, HoldReason], ...] = ()
    failed: tuple[tuple[str, str], ...] = ()


def _status_message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except ValueError:
        return str(error.body or error.reason)


class Binder:
    """Binds the portal's pending pods (see the module doc). Thread-safe: one pass at a time.

    Needs, cluster-wide: pods get/list/watch/patch, pods/binding create, events create,
    jobs list.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        source: AllocationSource,
        settings: IsolationSettings,
        *,
        clock: Clock = utcnow,
        instance: str = "gpuportal",
        jobs: Informer | None = None,
        act_workers: int = ACT_WORKERS,
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._batch = client.BatchV1Api(api_client)
        self._source = source
        self._settings = settings
        self._keys = PodKeys.of(settings)
        self._clock = clock
        self._instance = instance
        self._jobs = jobs  # a copy of the Jobs kept by a watch (the job runner's), else lists
        if act_workers < 1:
            raise ValueError(f"act_workers must be at least 1, not {act_workers}")
        self._act_workers = act_workers
        self._lock = threading.Lock()
        self._held: set[tuple[str, str]] = set()  # (pod uid, reason) whose Event is posted

    def pending(self) -> list[PodView]:
        """Our scheduler's pods that no node holds yet (and that are not being deleted)."""
        pods = self._list_pods(field_selector=f"spec.schedulerName={SCHEDULER_NAME},spec.nodeName=")
        return [v for v in map(pod_view, pods) if not v.deleting]

    def portal_pods(self) -> list[PodView]:
        """Every pod carrying the portal's workload and allocation labels that has not
        finished (a finished pod holds nothing: ``in_use``; the apiserver filters, so the
        pass does not grow with the pods that ran before)."""
        finished = ",".join(f"status.phase!={phase}" for phase in sorted(FINISHED_PHASES))
        pods = self._list_pods(label_selector=self._keys.selector(), field_selector=finished)
        return [pod_view(p) for p in pods]

    def _list_pods(self, **selectors: Any) -> list[dict[str, Any]]:
        # Plain JSON: building the client's models costs more than the call on a busy cluster.
        response: Any = self._core.list_pod_for_all_namespaces(_preload_content=False, **selectors)
        return list(json.loads(response.data).get("items") or [])

    def job_refs(self) -> dict[tuple[str, str], jobpods.JobRef]:
        """The Jobs the portal runs attempts in (labelled with their workload)."""
        if self._jobs is not None:
            # A Job labelled a moment ago may be missing: its pods wait one more pass.
            return jobpods.job_refs(self._jobs.items(), self._settings)
        key = PodKeys.of(self._settings).workload
        response: Any = self._batch.list_job_for_all_namespaces(
            label_selector=key, _preload_content=False
        )
        return jobpods.job_refs(json.loads(response.data).get("items") or [], self._settings)

    def decide_all(self) -> list[Decision]:
        """Steps 1 and 2: the decisions for every pending pod, on one snapshot."""
        pending = self.pending()
        if not pending:
            return []
        holders = in_use(self.portal_pods(), self._keys)
        refs = self.job_refs() if any(jobpods.is_job_pod(p, self._keys) for p in pending) else {}
        # One answer per workload for the whole pass: a gang's pods are decided on the same
        # status, and the allocator's lock is taken once per workload, not once per pod.
        source = _PassStatuses(self._source)
        decisions: list[Decision] = []
        for pod in sorted(pending, key=lambda p: (p.namespace, p.name)):
            if jobpods.is_job_pod(pod, self._keys):
                decision = self._decide_job_pod(pod, refs, holders, source)
            else:
                decision = decide(pod, source, self._settings, holders)
            if isinstance(decision, Bind):
                # Two pending pods naming one allocation: the first (by name) gets it.
                allocation = decision.annotations.get(self._keys.allocation)
                holders = {**holders, allocation or pod.annotations[self._keys.allocation]: pod}
            decisions.append(decision)
        return decisions

    def _decide_job_pod(
        self,
        pod: PodView,
        refs: Mapping[tuple[str, str], jobpods.JobRef],
        holders: Mapping[str, PodView],
        source: AllocationSource,
    ) -> Decision:
        placed = jobpods.place_job_pod(pod, refs, source, self._settings, holders)
        if isinstance(placed, jobpods.JobHold):
            return Hold(pod, HoldReason(placed.reason), placed.message)
        return Bind(pod, placed.node, placed.workload_id, placed.labels, placed.annotations)

    def bind_pending(self) -> BindReport:
        """One pass: decide on a snapshot, then act on every decision."""
        with self._lock:
            bound: list[tuple[str, str]] = []
            held: list[tuple[str, HoldReason]] = []
            failed: list[tuple[str, str]] = []
            decisions = self.decide_all()
            # Forget the holds of pods no longer pending: the set stays as small as the queue.
            waiting = {d.pod.uid for d in decisions}
            self._held = {k for k in self._held if k[0] in waiting}
            # Each decision is about a pod of its own (the decisions gave each allocation to
            # one pod at most): acting on them at once overlaps the apiserver's round trips
            # (three calls a bind) instead of queueing them. Holds already told cost no call.
            calls = [d for d in decisions if not self._told(d)]
            errors: dict[int, str | None] = {id(d): None for d in decisions}
            errors.update(self._act_all(calls))
            for decision in decisions:
                error = errors[id(decision)]
                if error is not None:
                    log.warning("binder: %s failed: %s", decision.pod, error)
                    failed.append((str(decision.pod), error))
                    continue
                if isinstance(decision, Bind):
                    bound.append((str(decision.pod), decision.node))
                else:
                    held.append((str(decision.pod), decision.reason))
            return BindReport(tuple(bound), tuple(held), tuple(failed))

    def _told(self, decision: Decision) -> bool:
        return isinstance(decision, Hold) and (decision.pod.uid, str(decision.reason)) in self._held

    def _act_all(self, decisions: list[Decision]) -> dict[int, str | None]:
        """id(decision) -> the error acting on it met, or None."""
        if len(decisions) <= 1:
            return {id(d): self._try_act(d) for d in decisions}
        workers = min(self._act_workers, len(decisions))
        with ThreadPoolExecutor(workers, thread_name_prefix="binder") as pool:
            return dict(zip(map(id, decisions), pool.map(self._try_act, decisions), strict=True))

    def _try_act(self, decision: Decision) -> str | None:
        try:
            self.act(decision)
        except ApiException as e:
            return _status_message(e)
        return None

    def act(self, decision: Decision) -> None:
        """Carry out one decision. A pod bound or deleted meanwhile is not an error."""
        if isinstance(decision, Bind):
            self._bind(decision)
        else:
            self._post_event(decision)

    def _bind(self, decision: Bind) -> None:
        pod = decision.pod
        if decision.labels or decision.annotations:
            self._mark(decision)
        # Plain-dict bodies: the client sends them as they are, its hints name models.
        body: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            # The uid is a precondition: a pod re-created under this name is not bound.
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": decision.node},
        }
        try:
            # The generated client cannot read the Status this call answers with: skip parsing.
            drain(
                self._core.create_namespaced_pod_binding(
                    pod.name, pod.namespace, body, _preload_content=False
                )
            )
        except ApiException as e:
            if e.status in (404, 409):
                log.info("binder: %s is gone or bound meanwhile: %s", pod, _status_message(e))
                return
            raise
        log.info("binder: bound %s to %s (workload %s)", pod, decision.node, decision.workload_id)
        # Like the kube-scheduler's: KubeSpawner shows it on the spawn page.
        message = (
            f"Successfully assigned {pod} to {decision.node} "
            f"(gpuportal workload {decision.workload_id})"
        )
        try:
            self._event(pod, "Scheduled", "Normal", message)
        except ApiException as e:  # the pod is bound; a lost Event is only a lost message
            log.warning("binder: no Scheduled event for %s: %s", pod, _status_message(e))

    def _mark(self, decision: Bind) -> None:
        """Write a job pod's allocation and rank on it, before the bind (its environment
        reads them when the container starts, which is after)."""
        pod = decision.pod
        patch: Any = {
            "metadata": {
                "uid": pod.uid,  # a precondition, as for the Binding
                "labels": dict(decision.labels),
                "annotations": dict(decision.annotations),
            }
        }
        drain(
            self._core.patch_namespaced_pod(
                pod.name,
                pod.namespace,
                patch,
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        )

    def _post_event(self, decision: Hold) -> None:
        # A pod waiting in the queue is held again on every pass: its Event is posted once
        # (a restarted binder learns of the earlier ones from the apiserver's 409).
        key = (decision.pod.uid, str(decision.reason))
        if key in self._held:
            return
        if self._event(
            decision.pod, str(decision.reason), decision.reason.event_type, decision.message
        ):
            log.info("binder: holding %s: %s", decision.pod, decision.message)
        self._held.add(key)

    def _event(self, pod: PodView, reason: str, kind: str, message: str) -> bool:
        """Post an Event on ``pod``; False when one for this pod and reason exists already."""
        now = self._clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        name = f"{pod.name}.{pod.uid[:8]}.{reason.lower()}"
        event: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name[:253], "namespace": pod.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            drain(self._core.create_namespaced_event(pod.namespace, event, _preload_content=False))
        except ApiException as e:
            if e.status == 409:
                return False  # posted by an earlier pass
            raise
        return True
