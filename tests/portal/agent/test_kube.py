"""The agent's Kubernetes side against a real kube-apiserver (kwok nodes and pods)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s

from portal.agent.attribution import PodRef, ProcessAttributor
from portal.agent.kube import NodePods, write_annotation
from portal.inventory import annotation, nvml
from portal.inventory.kubernetes import to_node
from tests.support import fake_nvml, gpu_nodes
from tests.support.k8s import K8sCluster

pytestmark = pytest.mark.k8s

NODE = "agent-a100-1"
NAMESPACE = "agent-pods"


class Seconds:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def core(k8s_cluster: K8sCluster) -> Iterator[k8s.CoreV1Api]:
    k8s_cluster.add_gpu_node(gpu_nodes.a100_mig_mixed_node(NODE))
    k8s_cluster.add_gpu_node(gpu_nodes.t4_pcie_node("agent-t4-1"))
    k8s_cluster.create_namespace(NAMESPACE)
    with k8s_cluster.api_client() as api:
        yield k8s.CoreV1Api(api)


def pod(core: k8s.CoreV1Api, name: str, node: str, labels: dict[str, str]) -> str:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
    }
    created = core.create_namespaced_pod(NAMESPACE, cast(Any, body))
    return str(core.api_client.sanitize_for_serialization(created)["metadata"]["uid"])


def test_the_annotation_on_the_node_is_what_nvml_discovered(
    monkeypatch: pytest.MonkeyPatch, core: k8s.CoreV1Api
) -> None:
    fake_nvml.install(monkeypatch, fake_nvml.a100_mig())
    discovered = nvml.discover(NODE)

    assert write_annotation(core, discovered)

    stored = core.api_client.sanitize_for_serialization(core.read_node(NODE))
    assert stored["metadata"]["annotations"][annotation.ANNOTATION] == annotation.encode(discovered)
    # Other metadata stays; the inventory now reads the exact GPUs, UUIDs and MIG layout.
    assert stored["metadata"]["labels"]["nvidia.com/gpu.product"]
    node = to_node(stored)
    assert node is not None
    assert node.gpus == discovered.gpus
    assert node.topology == discovered.topology


def test_writing_the_annotation_on_a_missing_node_is_false_and_logged(
    monkeypatch: pytest.MonkeyPatch, core: k8s.CoreV1Api, caplog: pytest.LogCaptureFixture
) -> None:
    fake_nvml.install(monkeypatch, fake_nvml.t4_two_sockets())
    assert not write_annotation(core, nvml.discover("no-such-node"))
    assert "could not write gpuportal.io/topology on node no-such-node: 404" in caplog.text


def test_pods_of_this_node_by_uid_and_a_process_in_one_attributed(
    core: k8s.CoreV1Api, tmp_path: Path
) -> None:
    mine = pod(core, "jupyter-alice", NODE, {"gpuportal.io/workload": "wl-42"})
    unlabelled = pod(core, "sidecar-job", NODE, {})
    elsewhere = pod(core, "other-node", "agent-t4-1", {"gpuportal.io/workload": "wl-7"})
    clock = Seconds()
    pods = NodePods(core, NODE, min_refresh_s=10, clock=clock)

    assert pods(mine) == PodRef(NAMESPACE, "jupyter-alice", "wl-42")
    assert pods(unlabelled) == PodRef(NAMESPACE, "sidecar-job", None)
    assert pods(elsewhere) is None  # another node's pod is not listed

    # A pod created later is found once the refresh interval has passed.
    later = pod(core, "late", NODE, {"gpuportal.io/workload": "wl-43"})
    assert pods(later) is None
    clock.t += 10
    assert pods(later) == PodRef(NAMESPACE, "late", "wl-43")

    proc = tmp_path / "555"
    proc.mkdir()
    proc.joinpath("cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        + mine.replace("-", "_")
        + ".slice/cri-containerd-abc.scope\n"
    )
    who = ProcessAttributor(tmp_path, pods)(555)
    assert who is not None
    assert (who.workload_id, who.namespace, who.pod) == ("wl-42", NAMESPACE, "jupyter-alice")
