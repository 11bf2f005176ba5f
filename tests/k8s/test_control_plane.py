"""The real control plane started by ``k8s_cluster``: what the portal relies on it to enforce."""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import subprocess
from collections.abc import Iterator
from functools import partial
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support import gpu_nodes
from tests.support.k8s import POD_CIDR, REPO_ROOT, K8sCluster
from tests.support.waiting import eventually

pytestmark = pytest.mark.k8s

IMAGE = "registry.invalid/gpuportal/never-pulled:0"  # kwok runs no containers


@pytest.fixture(scope="module")
def core(k8s_cluster: K8sCluster) -> Iterator[client.CoreV1Api]:
    with k8s_cluster.api_client() as api:
        yield client.CoreV1Api(api)


def status_message(error: ApiException) -> str:
    """The ``message`` of the apiserver's Status body."""
    return str(json.loads(error.body or "{}").get("message", error.body))


def body(manifest: dict[str, Any]) -> Any:
    """A plain-dict request body: the client sends dicts as they are, its hints name models."""
    return manifest


def gpu_pod(name: str, resources: dict[str, str], node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": IMAGE, "resources": {"limits": resources}}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_gpu_pod_on_a_kwok_h100_node_runs_with_a_loopback_pod_ip(
    k8s_cluster: K8sCluster, core: client.CoreV1Api
) -> None:
    node = k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node("h100-run-0"))
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    k8s_cluster.create_namespace("gpu-run")
    core.create_namespaced_pod(
        "gpu-run", body(gpu_pod("train", {"nvidia.com/gpu": "1"}, "h100-run-0"))
    )

    def running() -> client.V1Pod | None:
        pod = core.read_namespaced_pod("train", "gpu-run")
        return pod if pod.status and pod.status.phase == "Running" and pod.status.pod_ip else None

    pod = eventually(running, "pod gpu-run/train reaching Running with a pod IP")
    assert pod.status is not None
    ip = ipaddress.ip_address(str(pod.status.pod_ip))
    assert ip in ipaddress.ip_network("127.0.0.0/8")
    assert ip in ipaddress.ip_network(POD_CIDR)
    assert pod.status.host_ip == "127.0.0.1"
    # Why the CIDR is on loopback: a test can serve what the "pod" would, at the pod's own IP.
    with socket.create_server((str(ip), 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection((str(ip), port), timeout=5) as conn:
            accepted, _ = server.accept()
            accepted.close()
            assert conn.getpeername() == (str(ip), port)


def test_mig_slice_pod_runs_on_the_a100_mixed_node(
    k8s_cluster: K8sCluster, core: client.CoreV1Api
) -> None:
    k8s_cluster.add_gpu_node(gpu_nodes.a100_mig_mixed_node("a100-mig-0"))
    k8s_cluster.create_namespace("gpu-mig")
    pod = gpu_pod("slice", {"nvidia.com/mig-3g.40gb": "1"}, "a100-mig-0")
    core.create_namespaced_pod("gpu-mig", body(pod))
    eventually(
        lambda: (
            True
            if (p := core.read_namespaced_pod("slice", "gpu-mig")).status
            and p.status.phase == "Running"
            else None
        ),
        "MIG pod reaching Running",
    )


def test_resource_quota_makes_the_apiserver_refuse_a_third_gpu(
    k8s_cluster: K8sCluster, core: client.CoreV1Api
) -> None:
    k8s_cluster.create_namespace("tenant-quota")
    quota: dict[str, Any] = {
        "metadata": {"name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "2"}},
    }
    core.create_namespaced_resource_quota("tenant-quota", body(quota))
    # Quota admission refuses everything until the controller has published the quota's status.
    eventually(
        lambda: (
            True
            if (q := core.read_namespaced_resource_quota("gpus", "tenant-quota")).status
            and q.status.hard
            else None
        ),
        "kube-controller-manager filling in the ResourceQuota status",
    )

    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("tenant-quota", body(gpu_pod("three", {"nvidia.com/gpu": "3"})))
    assert refused.value.status == 403
    assert "exceeded quota: gpus" in status_message(refused.value)
    assert "requested: requests.nvidia.com/gpu=3" in status_message(refused.value)

    two = body(gpu_pod("two", {"nvidia.com/gpu": "2"}))
    created = core.create_namespaced_pod("tenant-quota", two)
    assert created.metadata is not None and created.metadata.name == "two"


def grant_view(cluster: K8sCluster, namespace: str, kind: str, subject: str) -> None:
    """Bind the built-in ``view`` ClusterRole to a User or Group in ``namespace``."""
    group = "rbac.authorization.k8s.io"
    binding = {
        "metadata": {"name": f"view-{kind.lower()}-{subject.replace(':', '-')}"},
        "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": group, "kind": kind, "name": subject}],
    }
    with cluster.api_client() as api:
        client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(namespace, body(binding))


def test_rbac_denies_a_user_without_binding_and_allows_after_a_role_binding(
    k8s_cluster: K8sCluster,
) -> None:
    k8s_cluster.create_namespace("tenant-rbac")
    with k8s_cluster.api_client("alice") as api:
        alice = client.CoreV1Api(api)
        with pytest.raises(ApiException) as denied:
            alice.list_namespaced_pod("tenant-rbac")
        assert denied.value.status == 403
        assert 'User "alice" cannot list resource "pods"' in status_message(denied.value)

        grant_view(k8s_cluster, "tenant-rbac", "User", "alice")

        def allowed() -> bool | None:
            try:
                alice.list_namespaced_pod("tenant-rbac")
            except ApiException as e:
                if e.status != 403:
                    raise
                return None
            return True

        eventually(allowed, "alice listing pods after the RoleBinding")

    # The binding names alice only: bob is still refused.
    with k8s_cluster.api_client("bob") as api, pytest.raises(ApiException) as still_denied:
        client.CoreV1Api(api).list_namespaced_pod("tenant-rbac")
    assert still_denied.value.status == 403


def test_group_role_binding_covers_every_member_of_the_group(k8s_cluster: K8sCluster) -> None:
    k8s_cluster.create_namespace("tenant-group")
    grant_view(k8s_cluster, "tenant-group", "Group", "gpuportal:tenant-a")
    statuses = {}
    for user in ("alice", "carol", "bob"):
        with k8s_cluster.api_client(user) as api:
            # RBAC caches are eventually consistent: wait for the grant, then read once more.
            if user != "bob":
                eventually(partial(_allowed, api, "tenant-group"), f"{user} listing pods")
            statuses[user] = _status_of_list(api, "tenant-group")
    # alice and carol are in gpuportal:tenant-a; bob is in tenant-b only.
    assert statuses == {"alice": 200, "carol": 200, "bob": 403}


def _allowed(api: client.ApiClient, namespace: str) -> bool | None:
    return True if _status_of_list(api, namespace) == 200 else None


def _status_of_list(api: client.ApiClient, namespace: str) -> int:
    try:
        client.CoreV1Api(api).list_namespaced_pod(namespace)
    except ApiException as e:
        return int(e.status)
    return 200


def test_pod_security_restricted_namespace_rejects_a_privileged_pod(
    k8s_cluster: K8sCluster, core: client.CoreV1Api
) -> None:
    k8s_cluster.create_namespace(
        "tenant-restricted", labels={"pod-security.kubernetes.io/enforce": "restricted"}
    )
    privileged = gpu_pod("root", {"nvidia.com/gpu": "1"})
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("tenant-restricted", body(privileged))
    assert refused.value.status == 403
    message = status_message(refused.value)
    assert 'violates PodSecurity "restricted:latest"' in message
    assert "privileged" in message

    compliant = gpu_pod("ok", {"nvidia.com/gpu": "1"})
    compliant["spec"]["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    compliant["spec"]["containers"][0]["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    core.create_namespaced_pod("tenant-restricted", body(compliant))


def _pinned_kubernetes_version() -> str:
    go_mod = (REPO_ROOT / "tools" / "kubernetes" / "go.mod").read_text()
    match = re.search(
        r"^\s*(?:require )?k8s\.io/kubernetes (v\d+\.\d+\.\d+)\b", go_mod, re.MULTILINE
    )
    assert match, "tools/kubernetes/go.mod requires no k8s.io/kubernetes vX.Y.Z"
    return match.group(1)


def test_binaries_and_server_report_the_pinned_version(k8s_cluster: K8sCluster) -> None:
    pinned = _pinned_kubernetes_version()
    for binary in ("kube-apiserver", "kube-controller-manager"):
        out = subprocess.run(
            [str(k8s_cluster.bin_dir / binary), "--version"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.strip() == f"Kubernetes {pinned}"
    with k8s_cluster.api_client() as api:
        info = client.VersionApi(api).get_code()
    assert info.git_version == pinned
    assert (info.major, info.minor) == tuple(pinned[1:].split(".")[:2])


def test_dynamic_resource_allocation_v1_is_served(k8s_cluster: K8sCluster) -> None:
    with k8s_cluster.api_client() as api:
        groups = client.ApisApi(api).get_api_versions().groups
        resource_group = next(g for g in groups if g.name == "resource.k8s.io")
        assert "v1" in [v.version for v in resource_group.versions]
        resources = client.CustomObjectsApi(api).get_api_resources("resource.k8s.io", "v1")
    names = {r.name for r in resources.resources}
    assert {"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"} <= names


def test_resource_claims_can_be_created_against_a_device_class(k8s_cluster: K8sCluster) -> None:
    k8s_cluster.create_namespace("tenant-dra")
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]},
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "one-gpu"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
                ]
            }
        },
    }
    with k8s_cluster.api_client() as api:
        custom = client.CustomObjectsApi(api)
        custom.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", device_class)
        custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", "tenant-dra", "resourceclaims", claim
        )
        stored = cast(
            dict[str, Any],
            custom.get_namespaced_custom_object(
                "resource.k8s.io", "v1", "tenant-dra", "resourceclaims", "one-gpu"
            ),
        )
        # The apiserver compiles CEL selectors: a broken one is refused, not stored.
        broken = dict(device_class, metadata={"name": "broken"})
        broken["spec"] = {"selectors": [{"cel": {"expression": "device.driver =="}}]}
        with pytest.raises(ApiException) as refused:
            custom.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", broken)
    assert stored["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == (
        "gpu.nvidia.com"
    )
    assert refused.value.status == 422


async def test_configure_authenticates_sync_and_asyncio_clients_as_the_user(
    k8s_cluster: K8sCluster,
) -> None:
    import kubernetes_asyncio.client as async_client

    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    with k8s_cluster.api_client("carol") as api:
        sync_user = client.AuthenticationV1Api(api).create_self_subject_review(body(review))
    config = k8s_cluster.configure(async_client.Configuration(), "carol")
    async with async_client.ApiClient(config) as api:
        async_user = await async_client.AuthenticationV1Api(api).create_self_subject_review(
            body(review)
        )
    results: list[Any] = [sync_user, async_user]
    for result in results:
        user = result.status.user_info
        assert user.username == "carol"
        assert {"gpuportal:tenant-a", "gpuportal:tenant-admins", "system:authenticated"} <= set(
            user.groups
        )
