"""The portal Deployment's rolling update strategy under the real kube-controller-manager.

An elected standby is not ready until it leads, and it cannot lead while the old leader runs.
The test stands that in with pods kwok never runs: the old revision's pods are placed on a kwok
node (Running and Ready), the new revision's are placed nowhere (no scheduler runs here), so
they stay not ready. With the chart's strategy the controller takes the old pods away anyway,
which is what lets the old leader hand the Lease over; with ``maxUnavailable: 0`` it keeps
them until the rollout's progress deadline, and the upgrade never happens."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.helm.chart import Helm, named
from tests.helm.test_chart import HA
from tests.support import gpu_nodes
from tests.support.k8s import K8sCluster

pytestmark = pytest.mark.k8s

IMAGE = "registry.invalid/gpuportal/portal:0"  # kwok pulls nothing


@pytest.fixture
def apps(k8s_cluster: K8sCluster) -> Iterator[tuple[Any, str, str]]:
    """(AppsV1Api, a namespace, a kwok node); both deleted at the end."""
    suffix = uuid.uuid4().hex[:6]
    namespace, node = f"rollout-{suffix}", f"rollout-node-{suffix}"
    k8s_cluster.create_namespace(namespace)
    k8s_cluster.add_gpu_node(gpu_nodes.t4_pcie_node(node))
    with k8s_cluster.api_client() as api:
        core: Any = client.CoreV1Api(api)
        try:
            yield client.AppsV1Api(api), namespace, node
        finally:
            with contextlib.suppress(ApiException):
                core.delete_namespace(namespace)
            with contextlib.suppress(ApiException):
                core.delete_node(node)


def eventually(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.2)


def deployment(name: str, strategy: dict[str, Any], node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "portal", "image": IMAGE}]}
    if node is not None:
        spec["nodeName"] = node
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "strategy": strategy,
            # Short, so that a stuck rollout says so soon.
            "progressDeadlineSeconds": 5,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def replica_sets(apps_api: Any, namespace: str, name: str) -> dict[bool, int]:
    """Replicas asked of the old (False) and the new (True) revision's ReplicaSets."""
    found = apps_api.list_namespaced_replica_set(namespace, label_selector=f"app={name}").items
    placed = {False: 0, True: 0}
    for rs in found:
        placed[rs.spec.template.spec.node_name is None] += rs.spec.replicas or 0
    return placed


@pytest.mark.parametrize("chart_strategy", [True, False], ids=["chart", "max-unavailable-0"])
def test_the_chart_strategy_replaces_a_leader_whose_successors_are_not_ready(
    helm: Helm, apps: tuple[Any, str, str], chart_strategy: bool
) -> None:
    apps_api, namespace, node = apps
    rendered = named(helm.render(sets=HA), "Deployment", "gpuportal")["spec"]["strategy"]
    strategy = (
        rendered
        if chart_strategy
        else {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    )
    name = "portal"
    apps_api.create_namespaced_deployment(namespace, deployment(name, strategy, node))

    def ready() -> int:
        return int(apps_api.read_namespaced_deployment(name, namespace).status.ready_replicas or 0)

    eventually(lambda: ready() == 2, "the old revision's two pods ready")

    # The upgrade: a new revision whose pods are never ready (no scheduler places them).
    apps_api.replace_namespaced_deployment(name, namespace, deployment(name, strategy, None))
    if chart_strategy:
        eventually(
            lambda: replica_sets(apps_api, namespace, name) == {False: 0, True: 2},
            "the old pods scaled away, the new revision at full size",
        )
    else:

        def stuck() -> bool:
            status = apps_api.read_namespaced_deployment(name, namespace).status
            return any(
                c.type == "Progressing" and c.reason == "ProgressDeadlineExceeded"
                for c in status.conditions or []
            )

        eventually(stuck, "the rollout past its progress deadline")
        # The old leader was never asked to go: no hand-over could happen.
        assert replica_sets(apps_api, namespace, name) == {False: 2, True: 1}
        assert ready() == 2
