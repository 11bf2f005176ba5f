"""The Kubernetes backend of Ray clusters: a ``ray.io/v1`` RayCluster per cluster in the
tenant's namespace, turned into pods by the real KubeRay operator, bound by the portal.

The Ray controller (``portal.ray.controller``, run without a process backend) keeps doing what
it does on every backend: slice 1 (head + ``min`` workers) is one gang, each increase a slice
of its own, a decrease releases slices. Each round of the ``ray`` loop, after the controller's
step, ``KubeRay.sync`` makes Kubernetes follow, in steps:

1. read the clusters and their slices (with their workloads) and each RayCluster's pods;
2. decide on that snapshot (``portal.ray.kubeobjects``): the RayCluster wanted (worker
   ``replicas`` = the workers wanted, ``workersToDelete`` = the pods of released slices, so a
   shrink drops exactly them), which worker pod uses which allocation of a placed slice (a pod
   of a waiting slice is marked with that slice, so the binder holds it Pending with the
   queue's reason), and where the head goes;
3. act: create or patch the RayCluster (and its token Secret, the token derived from the
   portal's key, ``portal.ray.tokens``), mark the worker pods (labels
   and annotations, the pod's uid as precondition) for the binder (``portal.kube.binder``),
   which binds them through the Binding API like any GPU pod; bind the head once its gang is
   placed (to the node of the gang's first worker: it holds no device), and delete the
   RayCluster of a stopped cluster (the operator's pods go with it). An idle cluster keeps
   its RayCluster with no workers (``replicas`` and ``minReplicas`` 0: the operator would
   raise ``replicas`` to ``minReplicas``), a suspended one is ``spec.suspend`` (the operator
   deletes every pod and keeps the head's Service, so the address does not change);
4. record the cluster's state from its pods: ``queued`` until the gang is placed, ``starting``
   until the head and every placed worker run, then ``running`` (a waiting slice's reason in
   the message).

The tenant is the cluster's own (the API's check), and the namespace is that tenant's: the
binder refuses an allocation in another tenant's namespace, so no label a user writes moves
devices across tenants.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.isolation import IsolationSettings
from policies.ray import RayState, SliceState
from portal.jobs.kube.pods import api_message
from portal.kube.calls import drain
from portal.kube.keys import PodKeys
from portal.kube.views import PodView, pod_view
from portal.ray import idle
from portal.ray import kubeobjects as ko
from portal.ray.controller import RayController, RayView
from portal.ray.spec import cluster_spec
from portal.ray.tokens import RayTokens
from portal.store.records import WorkloadState

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "rayproject/ray:2.60.0"
MERGE_PATCH = "application/merge-patch+json"


def head_reader(
    python: str, tokens: RayTokens, resolve: Callable[[str], str] | None = None
) -> idle.HeadReads:
    """How the controller reads the heads of RayClusters (idleness and unmet GPU demand,
    ``portal.ray.idle``): at their Services' addresses, through ``python`` (an interpreter
    with ray), each with its cluster's token (``tokens``: derived, never read from the
    Secret). ``resolve`` turns a cluster's address into one this process reaches (the
    Service's DNS name resolves inside the cluster as it is); each answer is filed under the
    cluster's own address."""

    def read(due: Sequence[idle.Due]) -> dict[str, idle.HeadRead | None]:
        reached = {d.address: resolve(d.address) if resolve else d.address for d in due}
        found = idle.read_heads(
            python, {reached[d.address]: tokens.token(d.cluster_id) for d in due}
        )
        return {a: found.get(r) for a, r in reached.items()}

    return read


class KubeRay:
    """Runs ``controller``'s clusters as RayClusters (see the module doc). One sync at a time.

    Needs, in the tenants' namespaces: rayclusters create/get/patch/delete, secrets
    create/delete, pods list/patch, pods/binding create.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        controller: RayController,
        settings: IsolationSettings,
        tokens: RayTokens,
        *,
        image: str = DEFAULT_IMAGE,
    ) -> None:
        self._tokens = tokens
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._controller = controller
        self._settings = settings
        self._keys = PodKeys.of(settings)
        self._image = image
        self._lock = threading.Lock()
        self._removed: set[str] = set()  # clusters whose objects are deleted

    def sync(self) -> None:
        with self._lock, self._controller.lock:
            for view in self._controller.clusters():
                cluster = view.cluster
                try:
                    if cluster.state.terminal:
                        self._remove(cluster.id, cluster.tenant)
                    else:
                        self._removed.discard(cluster.id)
                        self._sync_one(view)
                except ApiException as e:
                    log.warning("ray: cluster %s: %s", cluster.id, api_message(e))

    # ---------------------------------------------------------------- one cluster

    def _sync_one(self, view: RayView) -> None:
        cluster = view.cluster
        spec = cluster_spec(cluster)
        namespace = self._settings.namespace(cluster.tenant)
        name = ko.cluster_name(cluster.id)
        live = [s for s in view.slices if s.slice.state is not SliceState.RELEASED]
        holds = [
            ko.SliceHold(
                s.slice.number,
                s.slice.workload_id,
                tuple(a.id for a in s.workload.allocations)
                if s.workload is not None and s.workload.state is WorkloadState.RUNNING
                else (),
            )
            for s in live
        ]
        pods = self._pods(namespace, name)
        workers = [p for p in pods if p.labels.get(ko.NODE_TYPE_LABEL) == "worker"]
        head = next((p for p in pods if p.labels.get(ko.NODE_TYPE_LABEL) == "head"), None)
        plan = ko.plan_workers(workers, holds, self._keys)
        # Released for idleness: no slice is held, so no worker may run (and none is marked).
        released = cluster.state.released
        objects = ko.RayClusterObjects(
            cluster_id=cluster.id,
            tenant=cluster.tenant,
            image=self._image,
            ray_version=spec.ray_version,
            devices=spec.devices,
            head_cpus=spec.head_cpus,
            worker_cpus=spec.worker_cpus,
            min_workers=0 if released else spec.min_workers,
            max_workers=spec.max_workers,
            replicas=0 if released else spec.workers,
            workers_to_delete=plan.delete,
            suspend=cluster.state is RayState.SUSPENDED,
        )
        self._apply(objects)
        if released:
            return
        for mark in plan.marks:
            self._mark(mark)
        # The gang is the oldest live slice: the head runs only with it.
        gang = holds[0] if holds else None
        gang_placed = spec.min_workers == 0 or (gang is not None and bool(gang.allocations))
        if head is not None and head.node_name is None and gang_placed and not head.deleting:
            node = self._head_node(live)
            if node is not None:
                self._bind(head, node)
        self._observe(view, head, workers, holds, gang_placed, namespace)

    def _observe(
        self,
        view: RayView,
        head: PodView | None,
        workers: list[PodView],
        holds: list[ko.SliceHold],
        gang_placed: bool,
        namespace: str,
    ) -> None:
        cluster = view.cluster
        if not gang_placed:
            gang = next((s for s in view.slices if s.slice.state is SliceState.QUEUED), None)
            message = gang.workload.message if gang and gang.workload else "queued"
            self._controller.observe(cluster.id, RayState.QUEUED, message, address=None, joined=0)
            return
        placed = {(s.workload_id, a) for s in holds for a in s.allocations}
        joined = sum(
            1
            for p in workers
            if p.phase == "Running"
            and (p.labels.get(self._keys.workload), p.labels.get(self._keys.allocation)) in placed
        )
        head_up = head is not None and head.phase == "Running"
        address = ko.head_address(cluster.id, namespace) if head_up else None
        if head_up and joined >= len(placed):
            note = f"{joined} workers joined"
            waiting = next(
                (s for s in view.slices if s.slice.state is SliceState.QUEUED and s.workload),
                None,
            )
            if waiting is not None and waiting.workload is not None:
                note += f"; +{waiting.slice.workers} waiting: {waiting.workload.message}"
            state = RayState.RUNNING
        else:
            state = RayState.STARTING
            note = (
                f"head {'up' if head_up else 'starting'}, {joined} of {len(placed)} workers joined"
            )
        self._controller.observe(cluster.id, state, note, address=address, joined=joined)

    def _head_node(self, live: list[Any]) -> str | None:
        for s in live:
            if s.workload is not None and s.workload.allocations:
                return str(s.workload.allocations[0].node)
        # ``min`` 0: no device anywhere to sit beside; the first ready node will do.
        nodes: Any = self._core.list_node(_preload_content=False)
        for node in sorted(json.loads(nodes.data).get("items") or [], key=_name):
            conditions = (node.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                return _name(node)
        return None

    # ---------------------------------------------------------------- acting

    def _pods(self, namespace: str, name: str) -> list[PodView]:
        response: Any = self._core.list_namespaced_pod(
            namespace, label_selector=f"{ko.CLUSTER_LABEL}={name}", _preload_content=False
        )
        return [pod_view(p) for p in json.loads(response.data).get("items") or []]

    def _apply(self, o: ko.RayClusterObjects) -> None:
        """Create the RayCluster (and its token) or bring its worker count, and whether it
        is suspended, in line."""
        namespace = self._settings.namespace(o.tenant)
        name = ko.cluster_name(o.cluster_id)
        try:
            current: Any = self._custom.get_namespaced_custom_object(
                ko.GROUP, ko.VERSION, namespace, ko.PLURAL, name
            )
        except ApiException as e:
            if e.status != 404:
                raise
            self._create(o)
            return
        group = (current.get("spec") or {}).get("workerGroupSpecs") or [{}]
        now = (
            group[0].get("replicas"),
            group[0].get("minReplicas"),
            list((group[0].get("scaleStrategy") or {}).get("workersToDelete") or []),
            bool((current.get("spec") or {}).get("suspend")),
        )
        if now == (o.replicas, o.min_workers, list(o.workers_to_delete), o.suspend):
            return
        patch: Any = [
            {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": o.replicas},
            {
                "op": "replace",
                "path": "/spec/workerGroupSpecs/0/minReplicas",
                "value": o.min_workers,
            },
            {"op": "add", "path": "/spec/suspend", "value": o.suspend},
            {
                "op": "add",
                "path": "/spec/workerGroupSpecs/0/scaleStrategy",
                "value": {"workersToDelete": list(o.workers_to_delete)},
            },
        ]
        self._custom.patch_namespaced_custom_object(
            ko.GROUP,
            ko.VERSION,
            namespace,
            ko.PLURAL,
            name,
            patch,
            _content_type="application/json-patch+json",
        )
        log.info(
            "ray: %s/%s to %d workers%s", namespace, name, o.replicas, " (suspended)" * o.suspend
        )

    def _create(self, o: ko.RayClusterObjects) -> None:
        namespace = self._settings.namespace(o.tenant)
        secret: Any = ko.token_secret_manifest(
            o.cluster_id, o.tenant, self._tokens.token(o.cluster_id), self._settings
        )
        try:
            drain(self._core.create_namespaced_secret(namespace, secret, _preload_content=False))
        except ApiException as e:
            if e.status != 409:  # made by an earlier round
                raise
        body: Any = ko.raycluster_manifest(o, self._settings)
        self._custom.create_namespaced_custom_object(
            ko.GROUP, ko.VERSION, namespace, ko.PLURAL, body
        )
        log.info("ray: created RayCluster %s/%s", namespace, body["metadata"]["name"])

    def _mark(self, mark: ko.Mark) -> None:
        values = {self._keys.workload: mark.workload_id, self._keys.allocation: mark.allocation_id}
        patch: Any = {
            "metadata": {"uid": mark.pod.uid, "labels": values, "annotations": values},
        }
        try:
            drain(
                self._core.patch_namespaced_pod(
                    mark.pod.name,
                    mark.pod.namespace,
                    patch,
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                )
            )
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or re-created under this name
                raise

    def _bind(self, pod: PodView, node: str) -> None:
        body: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            drain(
                self._core.create_namespaced_pod_binding(
                    pod.name, pod.namespace, body, _preload_content=False
                )
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise
            return
        log.info("ray: bound head %s to %s", pod, node)

    def _remove(self, cluster_id: str, tenant: str) -> None:
        if cluster_id in self._removed:
            return
        namespace = self._settings.namespace(tenant)
        calls: list[Callable[[], object]] = [
            lambda: self._custom.delete_namespaced_custom_object(
                ko.GROUP,
                ko.VERSION,
                namespace,
                ko.PLURAL,
                ko.cluster_name(cluster_id),
                propagation_policy="Background",
            ),
            lambda: self._core.delete_namespaced_secret(
                ko.token_secret_name(cluster_id), namespace, _preload_content=False
            ),
        ]
        for call in calls:
            try:
                call()
            except ApiException as e:
                if e.status != 404:
                    raise
        self._removed.add(cluster_id)


def _name(obj: Any) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")
