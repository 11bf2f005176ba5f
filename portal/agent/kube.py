"""The agent's Kubernetes side: the topology annotation on its Node, and its node's pods by UID.

The DaemonSet's service account needs ``patch`` on ``nodes`` and ``list`` on ``pods`` (the field
selector keeps what it reads to its own node).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from policies.inventory import Node
from portal.agent.attribution import WORKLOAD_LABEL, PodRef
from portal.inventory import annotation

log = logging.getLogger(__name__)


def write_annotation(core: CoreV1Api, node: Node) -> bool:
    """Set ``gpuportal.io/topology`` on the Node named ``node.name``; False when it failed.

    A strategic merge patch of that one annotation: other annotations and labels stay.
    """
    body = {"metadata": {"annotations": {annotation.ANNOTATION: annotation.encode(node)}}}
    try:
        core.patch_node(node.name, body)
    except ApiException as e:
        log.error(
            "could not write %s on node %s: %s %s",
            annotation.ANNOTATION,
            node.name,
            e.status,
            e.reason,
        )
        return False
    return True


class NodePods:
    """Pod UID → pod, for the pods scheduled on one node; a ``PodLookup``.

    Lists the node's pods (field selector ``spec.nodeName``) when asked for a UID it has not
    seen, at most once per ``min_refresh_s`` so a process of an unknown pod cannot make it
    list on every sample.
    """

    def __init__(
        self,
        core: CoreV1Api,
        node_name: str,
        *,
        min_refresh_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = core
        self._node = node_name
        self._min_refresh_s = min_refresh_s
        self._clock = clock
        self._pods: dict[str, PodRef] = {}
        self._listed_at: float | None = None

    def __call__(self, uid: str) -> PodRef | None:
        if uid not in self._pods and self._may_refresh():
            self._refresh()
        return self._pods.get(uid)

    def _may_refresh(self) -> bool:
        return self._listed_at is None or (self._clock() - self._listed_at >= self._min_refresh_s)

    def _refresh(self) -> None:
        self._listed_at = self._clock()
        try:
            listed: Any = self._core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self._node}"
            )
        except ApiException as e:
            log.warning("could not list pods of node %s: %s %s", self._node, e.status, e.reason)
            return
        pods = {}
        for pod in listed.items:
            meta = pod.metadata
            labels = meta.labels or {}
            pods[meta.uid] = PodRef(
                namespace=meta.namespace, name=meta.name, workload_id=labels.get(WORKLOAD_LABEL)
            )
        self._pods = pods
