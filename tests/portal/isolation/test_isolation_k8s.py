"""Tenant isolation on the real apiserver: what Pod Security, ResourceQuota and RBAC refuse once
the reconciler has applied a tenant, drift repair, idempotence and guarded deletion."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.isolation import IsolationSettings, TenantSpec, tenant_manifests
from portal.isolation import ObjectRef, TenantHasPods, reconcile
from tests.support import gpu_nodes
from tests.support.k8s import SERVICE_CIDR, USERS, K8sCluster
from tests.support.waiting import eventually

pytestmark = pytest.mark.k8s

IMAGE = "registry.invalid/gpuportal/never-pulled:0"  # kwok runs no containers

# The fixture's users: alice and carol are in gpuportal:tenant-a, bob in gpuportal:tenant-b.
SETTINGS = IsolationSettings(
    admin_group_template="gpuportal:{tenant}",
    api_server_cidrs=(SERVICE_CIDR.replace(".0/24", ".1/32"),),
)
A = TenantSpec("tenant-a", {"T4": 1}, cpu_millis=4000, memory_mib=8192, pods=10)
B = TenantSpec("tenant-b", {"T4": 2}, cpu_millis=4000, memory_mib=8192, pods=10)
C = TenantSpec("tenant-c", {"T4": 1}, cpu_millis=4000, memory_mib=8192, pods=10)
NS_A, NS_B, NS_C = (SETTINGS.namespace(t.name) for t in (A, B, C))


def notebook_pod(name: str, **changes: Any) -> dict[str, Any]:
    """A pod that satisfies Pod Security ``restricted``; ``changes`` go into its container's
    securityContext (``None`` removes a key)."""
    security: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for key, value in changes.items():
        if value is None:
            security.pop(key, None)
        else:
            security[key] = value
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": SETTINGS.jobs_service_account,
            "automountServiceAccountToken": False,
            "containers": [{"name": "notebook", "image": IMAGE, "securityContext": security}],
        },
    }


def wait_for_quota(core: client.CoreV1Api, namespace: str) -> None:
    """Quota admission refuses every pod until the controller has published the status."""

    def ready() -> bool | None:
        quota = core.read_namespaced_resource_quota("tenant-quota", namespace)
        return True if quota.status and quota.status.hard else None

    eventually(ready, f"ResourceQuota status in {namespace}")


def status_of(call: Callable[[], object]) -> int:
    try:
        call()
    except ApiException as e:
        return int(e.status)
    return 200


@pytest.fixture(scope="module")
def admin(k8s_cluster: K8sCluster) -> Iterator[client.ApiClient]:
    with k8s_cluster.api_client() as api:
        yield api


@pytest.fixture(scope="module")
def core(admin: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(admin)


@pytest.fixture(scope="module")
def tenants(admin: client.ApiClient, core: client.CoreV1Api) -> Iterator[tuple[TenantSpec, ...]]:
    """Tenants A and B reconciled once, with a notebook pod in each namespace; at the end every
    tenant namespace of this module is deleted, pods first, so later modules reconciling their
    own tenants on the same cluster find nothing of these (the reconciler would refuse to delete
    namespaces that still run pods)."""
    first = reconcile([A, B], SETTINGS, admin)
    assert first.created and not (first.updated or first.deleted)
    for ns in (NS_A, NS_B):
        wait_for_quota(core, ns)
        core.create_namespaced_pod(ns, notebook_pod("nb"))  # type: ignore[arg-type]
    yield (A, B)
    for ns in (NS_A, NS_B, NS_C):
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    reconcile([], SETTINGS, admin, force=True)

    def gone() -> bool | None:
        names = {n.metadata.name for n in core.list_namespace().items if n.metadata}
        return True if not names & {NS_A, NS_B, NS_C} else None

    eventually(gone, "the tenant namespaces deleted", timeout_s=90)


def test_reconcile_creates_every_object_and_a_second_run_changes_nothing(
    admin: client.ApiClient, tenants: tuple[TenantSpec, ...]
) -> None:
    again = reconcile(tenants, SETTINGS, admin)
    assert not again.changed, again
    assert ObjectRef("Namespace", None, NS_A) in again.unchanged
    assert ObjectRef("NetworkPolicy", NS_B, "default-deny") in again.unchanged
    assert len(again.unchanged) == sum(len(tenant_manifests(t, SETTINGS)) for t in tenants) == 24
    ns = client.CoreV1Api(admin).read_namespace(NS_A)
    assert ns.metadata is not None and ns.metadata.labels is not None
    assert ns.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert ns.metadata.labels["gpuportal.io/tenant"] == "tenant-a"


@pytest.mark.parametrize(
    ("name", "changes", "violation"),
    [
        # privileged with allowPrivilegeEscalation false would fail validation (422) first.
        (
            "privileged",
            {"privileged": True, "allowPrivilegeEscalation": None},
            'privileged (container "notebook" must not set',
        ),
        ("root", {"runAsNonRoot": None, "runAsUser": 0}, "runAsUser=0"),
        ("escalating", {"allowPrivilegeEscalation": None}, "allowPrivilegeEscalation != false"),
        ("caps", {"capabilities": None}, "unrestricted capabilities"),
    ],
)
def test_pod_security_restricted_refuses_unsafe_pods(
    core: client.CoreV1Api,
    tenants: tuple[TenantSpec, ...],
    name: str,
    changes: dict[str, Any],
    violation: str,
) -> None:
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(NS_A, notebook_pod(name, **changes))  # type: ignore[arg-type]
    assert refused.value.status == 403
    message = json.loads(str(refused.value.body))["message"]
    assert message.startswith(
        f'pods "{name}" is forbidden: violates PodSecurity "restricted:latest"'
    )
    assert violation in message


def test_a_restricted_notebook_pod_is_accepted_with_limit_range_defaults(
    core: client.CoreV1Api, tenants: tuple[TenantSpec, ...]
) -> None:
    pod = core.read_namespaced_pod("nb", NS_A)
    assert pod.spec is not None
    resources = pod.spec.containers[0].resources
    assert resources is not None
    assert resources.requests == {"cpu": "100m", "memory": "256Mi"}
    assert resources.limits == {"cpu": "1", "memory": "1Gi"}


def test_a_pod_above_the_tenant_gpu_limit_is_refused_by_quota(
    core: client.CoreV1Api, tenants: tuple[TenantSpec, ...]
) -> None:
    pod = notebook_pod("greedy")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(NS_A, pod)  # type: ignore[arg-type]
    assert refused.value.status == 403
    body = str(refused.value.body)
    assert "exceeded quota: tenant-quota" in body
    assert "requested: requests.nvidia.com/gpu=2" in body
    assert "limited: requests.nvidia.com/gpu=1" in body


def gpu_claim(name: str, devices: int, device_class: str = "gpu.nvidia.com") -> dict[str, Any]:
    """A ResourceClaim asking for ``devices`` devices of ``device_class``, one request each,
    like the spawner's (which selects each GPU by UUID; the quota counts requests)."""
    requests = [
        {"name": f"gpu-{i}", "exactly": {"deviceClassName": device_class, "count": 1}}
        for i in range(devices)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": requests}},
    }


def test_dra_claims_above_the_tenant_gpu_limit_are_refused_by_quota(
    admin: client.ApiClient, tenants: tuple[TenantSpec, ...]
) -> None:
    # Pods whose GPUs are pinned by a claim ask for no counted GPU resource: the quota caps
    # the devices their claims request per DeviceClass instead (tenant A: 1 whole GPU, no MIG).
    custom = client.CustomObjectsApi(admin)

    def create(body: dict[str, Any]) -> Any:
        return custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", NS_A, "resourceclaims", body
        )

    with pytest.raises(ApiException) as refused:
        create(gpu_claim("two-gpus", 2))
    assert refused.value.status == 403
    body = str(refused.value.body)
    assert "exceeded quota: tenant-quota" in body
    assert "requested: gpu.nvidia.com.deviceclass.resource.k8s.io/devices=2" in body
    assert "limited: gpu.nvidia.com.deviceclass.resource.k8s.io/devices=1" in body
    with pytest.raises(ApiException) as no_mig:
        create(gpu_claim("one-mig", 1, "mig.nvidia.com"))
    assert no_mig.value.status == 403
    assert "limited: mig.nvidia.com.deviceclass.resource.k8s.io/devices=0" in str(no_mig.value.body)
    create(gpu_claim("one-gpu", 1))  # within the limit
    try:
        with pytest.raises(ApiException) as second:  # the first one counts
            create(gpu_claim("another-gpu", 1))
        assert second.value.status == 403
        assert "used: gpu.nvidia.com.deviceclass.resource.k8s.io/devices=1" in str(
            second.value.body
        )
    finally:
        custom.delete_namespaced_custom_object(
            "resource.k8s.io", "v1", NS_A, "resourceclaims", "one-gpu"
        )


def test_tenant_admins_read_their_pods_only_and_never_secrets(
    k8s_cluster: K8sCluster, tenants: tuple[TenantSpec, ...]
) -> None:
    assert "gpuportal:tenant-a" in USERS["alice"].groups
    with k8s_cluster.api_client("alice") as api:
        alice = client.CoreV1Api(api)
        eventually(
            lambda: True if status_of(lambda: alice.list_namespaced_pod(NS_A)) == 200 else None,
            "alice listing tenant A's pods",
        )
        assert status_of(lambda: alice.read_namespaced_pod("nb", NS_A)) == 200
        denied = {
            "list pods in B": status_of(lambda: alice.list_namespaced_pod(NS_B)),
            "read pod in B": status_of(lambda: alice.read_namespaced_pod("nb", NS_B)),
            "read pod log in B": status_of(lambda: alice.read_namespaced_pod_log("nb", NS_B)),
            "list secrets in B": status_of(lambda: alice.list_namespaced_secret(NS_B)),
            "read secret in B": status_of(lambda: alice.read_namespaced_secret("any", NS_B)),
            "list secrets in A": status_of(lambda: alice.list_namespaced_secret(NS_A)),
            "read secret in A": status_of(lambda: alice.read_namespaced_secret("any", NS_A)),
            "delete pod in A": status_of(lambda: alice.delete_namespaced_pod("nb", NS_A)),
        }
    assert denied == dict.fromkeys(denied, 403)
    with k8s_cluster.api_client("bob") as api:
        bob = client.CoreV1Api(api)
        eventually(
            lambda: True if status_of(lambda: bob.list_namespaced_pod(NS_B)) == 200 else None,
            "bob listing tenant B's pods",
        )
        assert status_of(lambda: bob.list_namespaced_pod(NS_A)) == 403


def test_drift_is_repaired_and_reported(
    admin: client.ApiClient, tenants: tuple[TenantSpec, ...]
) -> None:
    networking = client.NetworkingV1Api(admin)
    networking.delete_namespaced_network_policy("default-deny", NS_A)
    core = client.CoreV1Api(admin)
    core.patch_namespaced_resource_quota(
        "tenant-quota",
        NS_B,
        {"spec": {"hard": {"requests.nvidia.com/gpu": "99"}}},  # type: ignore[arg-type]
    )

    repaired = reconcile(tenants, SETTINGS, admin)
    assert repaired.created == (ObjectRef("NetworkPolicy", NS_A, "default-deny"),)
    assert repaired.updated == (ObjectRef("ResourceQuota", NS_B, "tenant-quota"),)
    assert repaired.deleted == ()
    policy = networking.read_namespaced_network_policy("default-deny", NS_A)
    assert policy.spec is not None and policy.spec.policy_types == ["Ingress", "Egress"]
    quota = core.read_namespaced_resource_quota("tenant-quota", NS_B)
    assert quota.spec is not None and quota.spec.hard is not None
    assert quota.spec.hard["requests.nvidia.com/gpu"] == "2"

    assert not reconcile(tenants, SETTINGS, admin).changed


def test_a_tenant_with_a_running_pod_is_deleted_only_with_force(
    k8s_cluster: K8sCluster,
    admin: client.ApiClient,
    core: client.CoreV1Api,
    tenants: tuple[TenantSpec, ...],
) -> None:
    node = "t4-isolation-0"
    k8s_cluster.add_gpu_node(gpu_nodes.t4_pcie_node(node))
    assert reconcile([*tenants, C], SETTINGS, admin).created
    wait_for_quota(core, NS_C)
    pod = notebook_pod("busy")
    pod["spec"]["nodeName"] = node
    core.create_namespaced_pod(NS_C, pod)  # type: ignore[arg-type]
    eventually(
        lambda: (
            True
            if (p := core.read_namespaced_pod("busy", NS_C)).status and p.status.phase == "Running"
            else None
        ),
        "the tenant-c pod running",
    )

    with pytest.raises(TenantHasPods) as refused:
        reconcile(tenants, SETTINGS, admin)
    assert refused.value.pods == (f"{NS_C}/busy",)
    assert f"still have 1 pod(s): {NS_C}/busy" in str(refused.value)
    # Refused before any change: the namespace and its policies are still there.
    assert core.read_namespace(NS_C).status.phase == "Active"  # type: ignore[union-attr]
    client.NetworkingV1Api(admin).read_namespaced_network_policy("default-deny", NS_C)

    result = reconcile(tenants, SETTINGS, admin, force=True)
    assert ObjectRef("Namespace", None, NS_C) in result.deleted
    assert all(ref.namespace in (None, NS_C) for ref in result.deleted)
    assert {ref.name for ref in result.deleted if ref.kind == "Namespace"} == {NS_C}
    assert not result.created and not result.updated
    namespace = core.read_namespace(NS_C)
    assert namespace.metadata is not None and namespace.metadata.deletion_timestamp is not None
