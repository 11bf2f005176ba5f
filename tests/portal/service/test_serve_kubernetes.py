"""``gpuportal serve --inventory kubernetes`` against a real kube-apiserver: the GPU nodes it
lists at start, and the ones added and deleted while it runs."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from tests.portal.service.conftest import ALICE, ServiceFactory
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


def test_the_service_runs_jobs_as_indexed_jobs_and_admits_kubectl_jobs(
    k8s_cluster: K8sCluster, service_factory: ServiceFactory
) -> None:
    """The Kubernetes job backend inside ``gpuportal serve``: a job submitted over the API
    becomes an indexed Job whose pods the service's binder binds; a Job created with kubectl
    in the tenant's namespace is admitted as that tenant's."""
    node = "serve-jobs-h100"
    k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node(node))
    svc = service_factory(
        inventory="kubernetes",
        extra_env={"KUBECONFIG": str(k8s_cluster.kubeconfig_for("admin"))},
    )
    svc.start()
    with k8s_cluster.api_client() as api, svc.client(ALICE) as alice, svc.client() as ops:
        core, batch = k8s_client.CoreV1Api(api), k8s_client.BatchV1Api(api)

        def quota_ready() -> bool:
            try:
                q = core.read_namespaced_resource_quota("tenant-quota", "gp-team-a")
            except ApiException:
                return False
            return bool(q.status and q.status.hard)

        eventually(quota_ready, "the isolation loop making team-a's namespace")
        eventually(
            lambda: node in {n["name"] for n in ops.get("/api/v1/nodes").json()["items"]},
            "the node listed",
        )
        body = {
            "tenant": "team-a",
            "name": "train",
            "members": 2,
            "devices": {"kind": "gpu", "count": 2, "models": ["H100-80GB"]},
            "image": "registry.invalid/gpuportal/train:0",
        }
        created = alice.post("/api/v1/jobs", json=body)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]

        def job_state() -> str:
            return str(alice.get(f"/api/v1/jobs/{job_id}").json()["state"])

        eventually(lambda: job_state() == "succeeded", "the job succeeding (kwok completes it)")
        pods = core.list_namespaced_pod(
            "gp-team-a", label_selector=f"gpuportal.io/job={job_id}"
        ).items
        # Bound where the allocator placed them (other tests' nodes may be there too).
        (attempt,) = alice.get(f"/api/v1/jobs/{job_id}/attempts").json()["items"]
        assert len(pods) == 2 and {p.spec.node_name for p in pods} == set(attempt["nodes"])
        assert attempt["exit_reason"] == "completed"
        logs = alice.get(f"/api/v1/jobs/{job_id}/logs").json()
        assert logs["text"] == "" and logs["unavailable"]

        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "from-kubectl", "namespace": "gp-team-a"},
            "spec": {
                "completionMode": "Indexed",
                "completions": 1,
                "parallelism": 1,
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "schedulerName": "gpuportal",
                        "restartPolicy": "Never",
                        "serviceAccountName": "tenant-jobs",
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [
                            {
                                "name": "train",
                                "image": "registry.invalid/gpuportal/train:0",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                            }
                        ],
                    }
                },
            },
        }
        batch.create_namespaced_job("gp-team-a", job)

        def admitted() -> list[dict[str, object]]:
            items = alice.get("/api/v1/jobs", params={"tenant": "team-a"}).json()["items"]
            return [j for j in items if j["name"] == "gp-team-a/from-kubectl"]

        eventually(lambda: bool(admitted()), "the kubectl Job admitted")
        eventually(lambda: admitted()[0]["state"] == "succeeded", "the kubectl Job succeeding")
        for j in batch.list_namespaced_job("gp-team-a").items:
            batch.delete_namespaced_job(
                j.metadata.name, "gp-team-a", propagation_policy="Background"
            )
        core.delete_node(node)
    assert svc.terminate() == 0, svc.tail()
    assert "Traceback" not in svc.tail(500)
