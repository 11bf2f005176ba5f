"""``gpuportal serve --inventory kubernetes`` against a real kube-apiserver: the GPU nodes it
lists at start, and the ones added and deleted while it runs."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes import client as k8s_client

from tests.portal.service.conftest import ServiceFactory
from tests.support import gpu_nodes
from tests.support.k8s import K8sCluster

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def eventually(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    pytest.fail(f"not reached in {timeout_s} s: {what}")


def test_the_service_follows_the_clusters_gpu_nodes(
    k8s_cluster: K8sCluster, service_factory: ServiceFactory
) -> None:
    k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node("serve-h100-0"))
    svc = service_factory(
        inventory="kubernetes",
        extra_env={"KUBECONFIG": str(k8s_cluster.kubeconfig_for("admin"))},
    )
    svc.start(seed=None)
    with svc.client() as c:

        def nodes() -> set[str]:
            return {
                n["name"] for n in c.get("/api/v1/nodes", params={"limit": 500}).json()["items"]
            }

        assert "serve-h100-0" in nodes()
        k8s_cluster.add_gpu_node(gpu_nodes.t4_pcie_node("serve-t4-0"))
        eventually(lambda: "serve-t4-0" in nodes(), "the added node listed")
        with k8s_cluster.api_client() as api:
            k8s_client.CoreV1Api(api).delete_node("serve-h100-0")
        eventually(lambda: "serve-h100-0" not in nodes(), "the deleted node gone")
    assert svc.terminate() == 0, svc.tail()
    assert "Traceback" not in svc.tail(500)
