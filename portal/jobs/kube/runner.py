"""The Kubernetes runner of training jobs: an attempt is an indexed Job (``manifests``).

``launch`` creates the attempt's Job, its headless Service and, where the cluster serves
``scheduling.k8s.io/v1alpha1``, its gang Workload (and the tenant's checkpoint claim when
missing: ``volumes``); the Job controller creates the pods and the portal's binder binds each
to its rank's node. For a Job created with kubectl
(``MemberLaunch.kube_job``) it creates nothing: it labels that Job with the attempt and its
workload (so the binder finds them) and resumes it if it was suspended.

``poll`` reads the pods, Jobs and Nodes from informers (``portal.kube.informer``: listed once,
then followed by watches, so a round costs no list that grows with every Job ever run; what
the copies lack or show finished too early is confirmed by a direct read) and reports each
member once:
``Succeeded`` exits 0, ``Failed`` with its container's exit code, a pod whose node is gone or
not ready for ``node_lost_after_s`` as lost (the controller's ``node lost``), and a member
whose pod is gone with its Job (or that its Job stopped) as killed (SIGKILL); a kubectl Job
that its owner deleted is left to the admission pass, which cancels its job. ``stop`` deletes
the members' pods with the grace period (the kubelet's SIGTERM, then SIGKILL) and then the
Job (background propagation; its Service and Workload follow it as dependents); a kubectl
Job is suspended instead, so its object and status stay the user's. ``adopt`` finds the
attempts again from the Jobs' labels after a portal restart. Logs are the pods' logs, read
through the API (``read_log``). The reads of Jobs, pods, nodes and logs are in
``portal.jobs.kube.cluster_reads``.

The runner keeps no state that Kubernetes does not also hold: a new runner on the same cluster
(a restarted portal) knows every attempt again after ``adopt``.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.isolation import IsolationSettings
from policies.isolation.common import MANAGER
from portal.jobs.kube import manifests as m
from portal.jobs.kube import pods as kpods
from portal.jobs.kube.cluster_reads import ClusterReads, WatchedAttempt
from portal.jobs.kube.copies import ClusterCopies
from portal.jobs.kube.volumes import ensure_checkpoint_claim
from portal.jobs.runner import MemberExit, MemberLaunch, RunnerError
from portal.kube.calls import drain
from portal.kube.informer import Informer

log = logging.getLogger(__name__)

LAUNCH_CONCURRENCY = 4
"""Attempts the controller may launch at once (as many as the binder binds at once)."""
NODE_LOST_AFTER_S = 60.0
"""How long a member's node may stay not ready before the gang counts as lost."""
MERGE_PATCH = "application/merge-patch+json"


class KubeRunner(ClusterReads):
    """Runs attempts as indexed Jobs (see the module doc). Thread-safe.

    Needs, cluster-wide: jobs get/list/create/patch/delete, services create, pods
    list/delete, pods/log get, nodes list, persistentvolumeclaims get/create (the checkpoint
    claim, ``volumes``), and workloads create in ``scheduling.k8s.io``.
    """

    launch_concurrency = LAUNCH_CONCURRENCY

    def __init__(
        self,
        api_client: client.ApiClient,
        settings: IsolationSettings | None = None,
        *,
        stop_grace_s: float = 10.0,
        node_lost_after_s: float = NODE_LOST_AFTER_S,
        run_as_user: int = 1000,
        run_as_group: int = 100,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api_client
        self._core = client.CoreV1Api(api_client)
        self._batch = client.BatchV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._settings = settings or IsolationSettings()
        self._keys = m.JobKeys.of(self._settings)
        self._stop_grace_s = stop_grace_s
        self._node_lost_after_s = node_lost_after_s
        self._user = (run_as_user, run_as_group)
        self._clock = clock
        self._lock = threading.Lock()
        self._attempts: dict[tuple[str, int], WatchedAttempt] = {}
        self._workloads_served: bool | None = None
        self._informers: ClusterCopies | None = None
        self._watch_lock = threading.Lock()

    @property
    def settings(self) -> IsolationSettings:
        return self._settings

    @property
    def api_client(self) -> client.ApiClient:
        return self._api

    def jobs_informer(self) -> Informer:
        """The cluster's Jobs as the runner sees them (started on first use); the admission
        pass and the binder read the same copy instead of listing every Job themselves."""
        return self._watch().jobs

    def close(self) -> None:
        """Stop the informers' watches (a later poll starts them again)."""
        with self._watch_lock:
            informers, self._informers = self._informers, None
        if informers is not None:
            informers.stop()

    def _watch(self) -> ClusterCopies:
        with self._watch_lock:  # the admission pass asks from a thread of its own
            if self._informers is None:
                self._informers = ClusterCopies.start(self._batch, self._core)
            return self._informers

    def rendezvous(self, job_id: str, attempt: int) -> tuple[str, int]:
        """Rank 0's stable name and port (``Backend.rendezvous``)."""
        return m.master_addr(job_id, attempt), m.MASTER_PORT

    # -- launch ----------------------------------------------------------------------------

    def launch(self, members: Sequence[MemberLaunch]) -> None:
        """Create the attempt's objects (or take over a kubectl Job); ``RunnerError`` when
        the apiserver refuses, with nothing of the attempt left behind."""
        ordered = sorted(members, key=lambda x: x.rank)
        first = self._validate(ordered)
        # The round trips run outside the lock: the controller launches several attempts at
        # once (``launch_concurrency``), each its own objects.
        if first.kube_job is not None:
            tracked = self._attach(first, len(ordered))
        else:
            tracked = self._create(first, ordered)
        with self._lock:
            self._attempts[(first.job_id, first.attempt)] = tracked

    def _validate(self, members: Sequence[MemberLaunch]) -> MemberLaunch:
        if not members:
            raise RunnerError("no members to launch: expected at least one")
        first = members[0]
        for position, x in enumerate(members):
            if (x.job_id, x.attempt) != (first.job_id, first.attempt) or x.rank != position:
                raise RunnerError(
                    f"invalid members {[(y.job_id, y.attempt, y.rank) for y in members]}: "
                    f"expected ranks 0..{len(members) - 1} of one attempt"
                )
            if x.allocation is None or not x.tenant:
                raise RunnerError(
                    f"rank {x.rank} of job {x.job_id!r} has no allocation or tenant: the "
                    "Kubernetes runner places members where the allocator put them"
                )
        if first.kube_job is None and not first.image:
            raise RunnerError(f"job {first.job_id!r} has no image: the Kubernetes runner runs pods")
        shapes = {(x.allocation.flavor, len(x.allocation.gpus)) for x in members if x.allocation}
        if len(shapes) > 1:
            raise RunnerError(
                f"members of job {first.job_id!r} differ in devices: {sorted(shapes)}"
            )
        return first

    def _objects(self, first: MemberLaunch, members: Sequence[MemberLaunch]) -> m.AttemptObjects:
        a = first.allocation
        assert a is not None
        resources = m.gpu_resources(a.flavor, len(a.gpus), a.milli, self._settings)
        if a.cpu_milli:
            resources["cpu"] = f"{a.cpu_milli}m"
        if a.memory_mib:
            resources["memory"] = f"{a.memory_mib}Mi"
        env = m.shared_env([x.env for x in members])
        return m.AttemptObjects(
            job_id=first.job_id,
            attempt=first.attempt,
            tenant=first.tenant,
            workload_id=a.workload_id,
            members=len(members),
            image=first.image or "",
            command=first.command,
            env=env,
            resources=resources,
            stop_grace_s=self._stop_grace_s,
            run_as_user=self._user[0],
            run_as_group=self._user[1],
            checkpoint_dir=env.get("GPUPORTAL_CHECKPOINT_DIR", ""),
        )

    def _create(self, first: MemberLaunch, members: Sequence[MemberLaunch]) -> WatchedAttempt:
        objects = self._objects(first, members)
        job = m.job_manifest(objects, self._settings)
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        where = f"job {first.job_id!r} attempt {first.attempt} (Job {namespace}/{name})"
        if objects.checkpoint_dir:
            ensure_checkpoint_claim(self._core, first.tenant, self._settings)
        try:
            created = kpods.json_of(
                self._batch.create_namespaced_job(namespace, cast(Any, job), _preload_content=False)
            )
        except ApiException as e:
            if e.status != 409:
                raise RunnerError(f"cannot create {where}: {kpods.api_message(e)}") from e
            created = self._read_job(namespace, name) or {}
            labels = (created.get("metadata") or {}).get("labels") or {}
            if labels.get(self._keys.workload) != objects.workload_id:
                raise RunnerError(f"cannot create {where}: a Job of that name exists") from e
            # Created by this launch before a restart: take it as launched.
        owner = m.owner_reference(created)
        try:
            service = m.service_manifest(objects, self._settings, owner)
            self._create_quietly(
                lambda: self._core.create_namespaced_service(
                    namespace, cast(Any, service), _preload_content=False
                )
            )
            self._write_workload(namespace, name, objects.members, job["metadata"]["labels"], owner)
        except ApiException as e:
            self._delete_job(namespace, name)
            raise RunnerError(
                f"cannot create the Service of {where}: {kpods.api_message(e)}"
            ) from e
        log.info("jobs: created %s", where)
        return WatchedAttempt(
            first.job_id, first.attempt, namespace, name, len(members), created["metadata"]["uid"]
        )

    def _attach(self, first: MemberLaunch, members: int) -> WatchedAttempt:
        assert first.kube_job is not None and first.allocation is not None
        namespace, _, name = first.kube_job.partition("/")
        job = self._informed_job(namespace, name, first) or self._read_job(namespace, name)
        if job is None:
            raise RunnerError(f"the Job {first.kube_job} of job {first.job_id!r} is gone")
        labels = {
            self._keys.job: first.job_id,
            self._keys.attempt: str(first.attempt),
            self._keys.workload: first.allocation.workload_id,
            self._keys.tenant: first.tenant,
        }
        body: Any = {"metadata": {"labels": labels}}
        resumed = bool((job.get("spec") or {}).get("suspend"))
        if resumed:
            # Resuming before the Job controller has taken the suspended pods down would let
            # them run on as this attempt's, on the last attempt's nodes.
            self._await_suspended(namespace, name)
            body["spec"] = {"suspend": False}
        try:
            drain(
                self._batch.patch_namespaced_job(
                    name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False
                )
            )
            self._write_workload(namespace, name, members, labels, m.owner_reference(job))
        except ApiException as e:
            raise RunnerError(
                f"cannot take over the Job {first.kube_job}: {kpods.api_message(e)}"
            ) from e
        return WatchedAttempt(
            first.job_id,
            first.attempt,
            namespace,
            name,
            members,
            job["metadata"]["uid"],
            external=True,
            # Resumed: the pods of earlier attempts (still terminating) are not this one's.
            not_before=self._clock() if resumed else 0.0,
        )

    def _informed_job(
        self, namespace: str, name: str, first: MemberLaunch
    ) -> dict[str, Any] | None:
        """The Job as the copy shows it, where that is enough to take it over: a first attempt
        (the portal has never suspended it) of this very Job (its uid), not suspended. Else
        None: read it."""
        if first.attempt != 1 or self._informers is None:
            return None
        job = self._informers.jobs.get(namespace, name)
        if job is None or m.kubectl_job_id(job["metadata"].get("uid", "")) != first.job_id:
            return None
        return None if (job.get("spec") or {}).get("suspend") else job

    def _await_suspended(self, namespace: str, name: str, timeout_s: float = 30.0) -> None:
        """Wait until the suspended Job has no active pod left (``RunnerError`` if not)."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self._read_job(namespace, name) or {}
            if not (job.get("status") or {}).get("active"):
                return
            if time.monotonic() >= deadline:
                raise RunnerError(
                    f"the suspended Job {namespace}/{name} still has active pods after "
                    f"{timeout_s:g} s: it cannot be resumed yet"
                )
            time.sleep(0.2)

    def workloads_served(self) -> bool:
        """Whether the cluster serves gang ``Workload`` objects (asked once)."""
        if self._workloads_served is None:
            group, _, version = m.WORKLOAD_API.partition("/")
            try:
                found = self._custom.get_api_resources(group, version)
            except ApiException as e:
                if e.status != 404:
                    raise
                self._workloads_served = False
            else:
                names = {r.name for r in (found.resources or [])}
                self._workloads_served = "workloads" in names
        return self._workloads_served

    def _write_workload(
        self,
        namespace: str,
        name: str,
        members: int,
        labels: Mapping[str, str],
        owner: Mapping[str, Any],
    ) -> None:
        if not self.workloads_served():
            return
        body = m.workload_manifest(namespace, name, members, labels, owner)
        group, _, version = m.WORKLOAD_API.partition("/")
        self._create_quietly(
            lambda: self._custom.create_namespaced_custom_object(
                group, version, namespace, "workloads", body, _preload_content=False
            )
        )

    @staticmethod
    def _create_quietly(create: Callable[[], Any]) -> None:
        """Create, taking "exists already" (a launch repeated after a restart) as done."""
        try:
            drain(create())
        except ApiException as e:
            if e.status != 409:
                raise

    # -- stop ------------------------------------------------------------------------------

    def stop(self, job_id: str, attempt: int, grace_s: float, *, wait: bool = True) -> None:
        """Delete the attempt's running pods with ``grace_s`` (see the module doc), then its
        Job, or suspend a kubectl Job. With ``wait`` it returns once the pods are gone."""
        if not grace_s >= 0:
            raise RunnerError(f"invalid grace period {grace_s!r} s: expected 0 or more seconds")
        with self._lock:
            tracked = self._attempts.get((job_id, attempt))
            if tracked is None:
                raise RunnerError(f"no Job of job {job_id!r} attempt {attempt} in the cluster")
            tracked.stopping = True
            tracked.not_after = self._clock()
            if tracked.external:
                # The Job controller deletes a suspended Job's pods itself (with their own
                # grace period) and does not count them as failures; deleting them here would.
                self._suspend(tracked)
            else:
                grace = math.ceil(grace_s)
                for pod in self._pods_of(tracked, self._list_pods(tracked)):
                    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                        continue
                    self._delete_pod(pod, grace)
                self._delete_job(tracked.namespace, tracked.name)
        if wait:
            deadline = time.monotonic() + grace_s + 10.0
            while time.monotonic() < deadline:
                if not [
                    p for p in self._pods_of(tracked, self._list_pods(tracked)) if kpods.live(p)
                ]:
                    return
                time.sleep(0.2)
            raise RunnerError(f"the pods of job {job_id!r} attempt {attempt} did not end")

    def _suspend(self, t: WatchedAttempt) -> None:
        try:
            drain(
                self._batch.patch_namespaced_job(
                    t.name,
                    t.namespace,
                    {"spec": {"suspend": True}},
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                )
            )
        except ApiException as e:
            if e.status != 404:
                raise RunnerError(
                    f"cannot suspend Job {t.namespace}/{t.name}: {kpods.api_message(e)}"
                ) from e

    def _delete_pod(self, pod: Mapping[str, Any], grace: int) -> None:
        meta = pod["metadata"]
        try:
            drain(
                self._core.delete_namespaced_pod(
                    meta["name"],
                    meta["namespace"],
                    grace_period_seconds=grace,
                    _preload_content=False,
                )
            )
        except ApiException as e:
            if e.status != 404:
                where = f"{meta['namespace']}/{meta['name']}"
                raise RunnerError(f"cannot stop pod {where}: {kpods.api_message(e)}") from e

    def _delete_job(self, namespace: str, name: str) -> None:
        try:
            drain(
                self._batch.delete_namespaced_job(
                    name, namespace, propagation_policy="Background", _preload_content=False
                )
            )
        except ApiException as e:
            if e.status != 404:
                raise RunnerError(
                    f"cannot delete Job {namespace}/{name}: {kpods.api_message(e)}"
                ) from e

    # -- poll and adopt --------------------------------------------------------------------

    def poll(self) -> list[MemberExit]:
        """Members that ended since the last call, each once, in the order they ended."""
        with self._lock:
            if not self._attempts:
                return []
            informers = self._watch()
            nodes = self._nodes(informers.nodes.items())
            now = self._clock()
            exits: list[tuple[float, MemberExit]] = []
            for key, t in list(self._attempts.items()):
                # The copy may not have seen a Job just created (or taken over): ask.
                job = informers.jobs.get(t.namespace, t.name) or self._read_job(t.namespace, t.name)
                if job is not None and t.uid and job["metadata"].get("uid") != t.uid:
                    job = None  # a Job of that name made later is not this attempt's
                if job is None and t.external and not t.stopping:
                    continue  # its owner deleted it: the admission pass cancels the job
                over = job is None or kpods.finished(job) or t.stopping
                by_rank = self._ranks(t, informers.pods.by((t.namespace, t.name)))
                if over and any(r not in t.reported and r not in by_rank for r in range(t.members)):
                    # Over, with a member the copy has no pod for: a lagging watch must not
                    # turn a pod that succeeded into a member killed. Read them.
                    by_rank = self._ranks(t, self._list_pods(t))
                for rank in range(t.members):
                    if rank in t.reported:
                        continue
                    ended = self._member_end(t, rank, by_rank.get(rank, []), over, nodes, now)
                    if ended is not None and t.external and job is not None and kpods.complete(job):
                        # A kubectl Job that completed while an attempt was stopped and the
                        # next resumed: its members succeeded, in pods older than this attempt.
                        ended = (ended[0], MemberExit(t.job_id, t.attempt, rank, 0, None))
                    if ended is not None:
                        t.reported.add(rank)
                        exits.append(ended)
                if len(t.reported) >= t.members and (
                    job is None or kpods.finished(job) or t.stopping
                ):
                    del self._attempts[key]  # kept until then: a stop may still be due
            exits.sort(key=lambda e: (e[0], e[1].job_id, e[1].attempt, e[1].rank))
            return [e for _, e in exits]

    def _member_end(
        self,
        t: WatchedAttempt,
        rank: int,
        pods: Sequence[Mapping[str, Any]],
        over: bool,
        nodes: Mapping[str, kpods.NodeState],
        now: float,
    ) -> tuple[float, MemberExit] | None:
        """When and how rank ``rank`` ended, or None while it runs or is yet to start."""
        for pod in pods:
            status = pod.get("status") or {}
            phase = status.get("phase")
            if phase == "Succeeded":
                return kpods.terminated_at(status, now), MemberExit(
                    t.job_id, t.attempt, rank, 0, None
                )
            if phase == "Failed":
                code = kpods.exit_code(status)
                return kpods.terminated_at(status, now), MemberExit(
                    t.job_id, t.attempt, rank, code, None if code is not None else signal.SIGKILL
                )
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node and self._lost(nodes.get(node) or self._node(node, now), now):
                return now, MemberExit(t.job_id, t.attempt, rank, None, None, node_lost=True)
        if any(kpods.live(p) for p in pods) or not over:
            return None
        return now, MemberExit(t.job_id, t.attempt, rank, None, signal.SIGKILL)

    def _lost(self, node: kpods.NodeState | None, now: float) -> bool:
        if node is None:
            return True  # deleted
        return not node.ready and now - node.since >= self._node_lost_after_s

    def adopt(self) -> list[tuple[str, int]]:
        """Watch again every attempt the cluster's Jobs carry; return those still running."""
        with self._lock:
            running: list[tuple[str, int]] = []
            for job in self._portal_jobs():
                meta = job["metadata"]
                labels = meta.get("labels") or {}
                raw_attempt = labels.get(self._keys.attempt, "")
                if not raw_attempt.isdigit():
                    continue
                key = (labels[self._keys.job], int(raw_attempt))
                members = int((job.get("spec") or {}).get("completions") or 1)
                external = labels.get(self._keys.managed_by) != MANAGER
                self._attempts.setdefault(
                    key,
                    WatchedAttempt(
                        *key, meta["namespace"], meta["name"], members, meta["uid"], external
                    ),
                )
                if not kpods.finished(job) and not meta.get("deletionTimestamp"):
                    running.append(key)
            return sorted(running)
