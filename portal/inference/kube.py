"""The Kubernetes backend of services: each replica is a pod in the tenant's namespace
(``portal.inference.kubeobjects``), bound by the portal's binder to the node and devices the
allocator chose.

``KubeReplicas`` is the service controller's runner (``portal.jobs.backend.Runner``) for it:

- ``launch`` creates the service's headless Service (once) and the replica's pod; a pod of
  that name already there for the same workload (a launch the portal made just before a
  crash) is taken as it is;
- ``poll`` lists the replica pods (one call, a label selector) and reports each replica once:
  a finished pod as an exit with its container's code, a pod gone or being deleted that the
  portal did not stop (deleted from outside, evicted) as killed (SIGKILL). The controller then
  ends the replica and releases its devices, and its next round requests a new replica
  through the allocator, so a replacement is admitted against the tenant's quota like any
  other. It also notes which pods are Ready: the backend's probe answers from that, so
  readiness is the pod's (its readiness probe on the preset's health path), not a call from
  the portal. The warm pool's sleep and wake calls (``portal.inference.warm``) and the
  gateway's requests go to the pod's engine at its ``endpoint`` (``Reach``: its DNS name
  on the cluster's inference port);
- ``stop`` deletes the pod with the grace period (the kubelet's SIGTERM, then SIGKILL); the
  stop is reported once the pod is gone, and when the service's last replica is gone its
  Service and finished pods go too;
- ``adopt`` finds the live replica pods again from their labels after a portal restart.

The runner keeps no state Kubernetes does not hold: a new runner on the same cluster knows
every replica again after ``adopt``. Logs are the pods' logs, read through the API.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.isolation import IsolationSettings
from policies.isolation.network import replica_selector
from portal.inference import kubeobjects as ko
from portal.inference.backend import HEALTH_PATH_ENV, ServiceBackend
from portal.inference.kubecache import KubeWeights
from portal.inference.kubeweights import CacheConfig
from portal.inference.spec import Backend as BackendKind
from portal.jobs.backend import LogChunk
from portal.jobs.kube.pods import api_message, json_of, pod_log
from portal.jobs.runner import MemberExit, MemberLaunch, RunnerError
from portal.kube.calls import drain

log = logging.getLogger(__name__)

Key = tuple[str, int]
"""(service id, replica number)."""

Reach = Callable[[str, str, int], str]
"""The base URL of replica ``(service id, number)``'s engine in a namespace: where the
gateway and the warm pool's calls reach it."""


def cluster_reach(settings: IsolationSettings) -> Reach:
    """A replica's engine at its pod's DNS name, on the cluster's inference port."""

    def reach(namespace: str, service_id: str, number: int) -> str:
        return f"http://{ko.address(service_id, number, namespace)}:{settings.inference_port}"

    return reach


def _base(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(slots=True)
class _Replica:
    namespace: str
    name: str
    uid: str
    stopping: bool = False


class KubeReplicas:
    """Runs replicas as pods (see the module doc). Thread-safe.

    Needs, in the tenants' namespaces: pods list/create/delete, pods/log get, services
    create/delete.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        settings: IsolationSettings,
        *,
        run_as_user: int = 1000,
        run_as_group: int = 100,
        reach: Reach | None = None,
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._settings = settings
        self._reach = reach or cluster_reach(settings)
        self._keys = ko.ReplicaKeys.of(settings)
        self._user = (run_as_user, run_as_group)
        self._lock = threading.Lock()
        self._known: dict[Key, _Replica] = {}
        self._services: set[tuple[str, str]] = set()  # (namespace, name) created or seen
        self._ready: frozenset[str] = frozenset()  # endpoints of Ready pods, from the last poll

    # -- the backend ---------------------------------------------------------------------------

    def endpoint(self, service_id: str, number: int) -> str:
        """The base URL of a replica the runner knows (its namespace is its tenant's)."""
        with self._lock:
            known = self._known.get((service_id, number))
        namespace = known.namespace if known is not None else ""
        return self._reach(namespace, service_id, number)

    def probe(self, url: str) -> bool:
        """Whether the replica at ``url`` was Ready at the last poll (the path is the pod's
        readiness probe's, which the kubelet calls)."""
        return _base(url) in self._ready

    # -- Runner --------------------------------------------------------------------------------

    def launch(self, members: Sequence[MemberLaunch]) -> None:
        if len(members) != 1:
            raise RunnerError(f"a replica is one pod, not {len(members)}")
        (m,) = members
        if not m.image or not m.tenant or m.allocation is None:
            raise RunnerError(
                f"replica {m.attempt} of service {m.job_id} lacks its image, tenant or "
                "allocation: the Kubernetes backend needs all three"
            )
        objects = ko.ReplicaObjects(
            service_id=m.job_id,
            tenant=m.tenant,
            number=m.attempt,
            workload_id=m.allocation.workload_id,
            allocation=m.allocation,
            image=m.image,
            command=m.command,
            env=m.env,
            health_path=m.env.get(HEALTH_PATH_ENV, "/health"),
            run_as_user=self._user[0],
            run_as_group=self._user[1],
            weights=m.weights,
        )
        namespace = self._settings.namespace(m.tenant)
        self._ensure_service(m.job_id, m.tenant, namespace)
        manifest: Any = ko.replica_pod(objects, self._settings)
        name = manifest["metadata"]["name"]
        try:
            created = json_of(
                self._core.create_namespaced_pod(namespace, manifest, _preload_content=False)
            )
        except ApiException as e:
            if e.status != 409:
                raise RunnerError(f"cannot create pod {namespace}/{name}: {api_message(e)}") from e
            created = self._same_launch(namespace, name, objects.workload_id)
        uid = str(created["metadata"].get("uid") or "")
        with self._lock:
            self._known[(m.job_id, m.attempt)] = _Replica(namespace, name, uid)
        log.info("services: created pod %s/%s (workload %s)", namespace, name, objects.workload_id)

    def stop(self, job_id: str, attempt: int, grace_s: float, *, wait: bool = True) -> None:
        """Delete the replica's pod with ``grace_s`` (``wait`` is ignored: the kubelet keeps
        the grace, and ``poll`` reports the stop once the pod is gone)."""
        if grace_s < 0:
            raise RunnerError(f"invalid grace period {grace_s!r} s: expected 0 or more seconds")
        with self._lock:
            known = self._known.get((job_id, attempt))
            if known is None:
                raise RunnerError(f"replica {attempt} of service {job_id} has no pod")
            known.stopping = True
        body: Any = {
            "gracePeriodSeconds": math.ceil(grace_s),
            "preconditions": {"uid": known.uid} if known.uid else None,
        }
        try:
            drain(
                self._core.delete_namespaced_pod(
                    known.name, known.namespace, body=body, _preload_content=False
                )
            )
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or re-created under the name: not ours
                raise RunnerError(
                    f"cannot delete pod {known.namespace}/{known.name}: {api_message(e)}"
                ) from e

    def poll(self) -> list[MemberExit]:
        pods = self._pods()
        exits: list[MemberExit] = []
        stopped: set[tuple[str, str]] = set()  # (namespace, service id) of replicas stopped
        with self._lock:
            for key, known in sorted(self._known.items()):
                pod = pods.get(key)
                if pod is not None and known.uid and pod.uid != known.uid:
                    pod = None  # another pod under the name: ours is gone
                if pod is not None and pod.finished:
                    failed = pod.phase == "Failed" and pod.exit_code is None  # evicted, say
                    exits.append(self._exit(key, None if failed else pod.exit_code or 0, failed))
                elif pod is None or (pod.deleting and not known.stopping):
                    exits.append(self._exit(key, None, True))
                else:
                    continue
                del self._known[key]
                if known.stopping:
                    stopped.add((known.namespace, key[0]))
            self._ready = frozenset(
                self._reach(p.namespace, p.service_id, p.number)
                for key, p in pods.items()
                if p.ready and not p.deleting and key in self._known
            )
            left = {sid for sid, _ in self._known}
        # A crashed replica's pod stays (its log tells why) until the service is stopped.
        for namespace, service_id in sorted(stopped):
            if service_id not in left:
                self._clean_up(namespace, service_id)
        return exits

    def adopt(self) -> list[Key]:
        pods = self._pods()
        with self._lock:
            for key, p in pods.items():
                if not p.finished:
                    self._known[key] = _Replica(p.namespace, p.name, p.uid, stopping=p.deleting)
            self._ready = frozenset(
                self._reach(p.namespace, p.service_id, p.number)
                for p in pods.values()
                if p.ready and not p.deleting and not p.finished
            )
            return sorted(self._known)

    def log_path(self, job_id: str, attempt: int, rank: int) -> Path:
        """Replicas' logs are not files on this host: see ``read_log``. The path names the
        replica for people and never exists."""
        return Path("kubernetes") / job_id / f"replica-{attempt}"

    def read_log(self, job_id: str, attempt: int, rank: int, offset: int, limit: int) -> LogChunk:
        """The replica pod's log through the API (the kubelet serves it)."""
        selector = f"{self._keys.service}={job_id},{self._keys.replica}={attempt}"
        try:
            items = json_of(
                self._core.list_pod_for_all_namespaces(
                    label_selector=selector, _preload_content=False
                )
            ).get("items")
            if not items:
                return LogChunk(b"", 0, f"replica {attempt} has no pod: no log to read")
            meta = items[0]["metadata"]
            return pod_log(self._core, meta["name"], meta["namespace"], ko.CONTAINER, offset, limit)
        except ApiException as e:
            why = api_message(e)
            return LogChunk(b"", 0, f"the log of replica {attempt} cannot be read: {why}")

    # -- helpers -------------------------------------------------------------------------------

    def _exit(self, key: Key, code: int | None, killed: bool) -> MemberExit:
        return MemberExit(key[0], key[1], 0, code, int(signal.SIGKILL) if killed else None)

    def _pods(self) -> dict[Key, ko.ReplicaPod]:
        """The replica pods of every tenant, by replica (the newest when a name repeats)."""
        selector = ",".join(f"{k}={v}" for k, v in replica_selector(self._settings).items())
        try:
            items = json_of(
                self._core.list_pod_for_all_namespaces(
                    label_selector=selector, _preload_content=False
                )
            ).get("items")
        except ApiException as e:
            raise RunnerError(f"cannot list replica pods: {api_message(e)}") from e
        out: dict[Key, ko.ReplicaPod] = {}
        for item in items or []:
            view = ko.replica_pod_view(item, self._settings)
            if view is not None:
                out[(view.service_id, view.number)] = view
        return out

    def _ensure_service(self, service_id: str, tenant: str, namespace: str) -> None:
        name = ko.service_name(service_id)
        if (namespace, name) in self._services:
            return
        manifest: Any = ko.headless_service(service_id, tenant, self._settings)
        try:
            drain(self._core.create_namespaced_service(namespace, manifest, _preload_content=False))
        except ApiException as e:
            if e.status != 409:
                raise RunnerError(
                    f"cannot create Service {namespace}/{name}: {api_message(e)}"
                ) from e
        self._services.add((namespace, name))

    def _same_launch(self, namespace: str, name: str, workload_id: str) -> dict[str, Any]:
        """The pod already called ``name``, when it runs the same workload."""
        try:
            pod = json_of(self._core.read_namespaced_pod(name, namespace, _preload_content=False))
        except ApiException as e:
            raise RunnerError(f"cannot read pod {namespace}/{name}: {api_message(e)}") from e
        labels = pod["metadata"].get("labels") or {}
        workload_key = self._settings.label("workload")
        if labels.get(workload_key) != workload_id:
            raise RunnerError(
                f"pod {namespace}/{name} exists for workload {labels.get(workload_key)!r}, "
                f"not {workload_id}: delete it"
            )
        return pod

    def _clean_up(self, namespace: str, service_id: str) -> None:
        """The service has no replica left: its Service and finished pods go."""
        name = ko.service_name(service_id)
        try:
            drain(self._core.delete_namespaced_service(name, namespace, _preload_content=False))
        except ApiException as e:
            if e.status != 404:
                log.warning("services: cannot delete Service %s/%s: %s", namespace, name, e)
        try:
            drain(
                self._core.delete_collection_namespaced_pod(
                    namespace,
                    label_selector=f"{self._keys.service}={service_id}",
                    _preload_content=False,
                )
            )
        except ApiException as e:
            log.warning("services: cannot delete the pods of %s: %s", name, api_message(e))
        with self._lock:
            self._services.discard((namespace, name))


def kube_backend(
    api_client: client.ApiClient,
    settings: IsolationSettings,
    workdir: Path,
    weights: CacheConfig | None = None,
    *,
    reach: Reach | None = None,
) -> ServiceBackend:
    """Replicas as pods in the tenants' namespaces, reached by their DNS names on the
    cluster's ``inference_port`` (or where ``reach`` says), ready when their pod is; with
    ``weights``, an ``http(s)://`` model through the nodes' weight cache
    (``portal.inference.kubecache``)."""
    runner = KubeReplicas(api_client, settings, reach=reach)
    cache = KubeWeights(api_client, settings, weights) if weights is not None else None
    return ServiceBackend(
        BackendKind.KUBERNETES,
        runner,
        workdir,
        probe=runner.probe,
        port=settings.inference_port,
        bind=ko.BIND_ALL,
        endpoint=runner.endpoint,
        weights=cache,
    )
