"""The builders' objects as the real apiserver judges them in a restricted tenant namespace."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.isolation import IsolationSettings, TenantSpec
from portal.isolation import reconcile
from portal.kube.binder import Binder
from portal.kube.views import AllocationSource
from spawner.pod import DraSettings, PodPlacement, PodSettings, place_pod, resource_claim
from tests.support.k8s import K8sCluster
from tests.support.k8s_tenants import delete_tenant_namespaces

pytestmark = pytest.mark.k8s

SETTINGS = IsolationSettings()
DRA = PodSettings(isolation=SETTINGS, dra=DraSettings())
TENANT = TenantSpec(
    name="dratenant",
    gpu_limits={"H100-80GB": 2, "A100-80GB/3g.40gb": 1},
    cpu_millis=4000,
    memory_mib=8192,
    pods=5,
)
PLACEMENT = PodPlacement(
    tenant="dratenant",
    workload_id="5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b",
    allocation_id="0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d",
    node="dra-h100-0",
    flavor="H100-80GB",
    gpus=(0, 1),
    gpu_uuids=(
        "GPU-00000000-1111-2222-3333-444444444444",
        "GPU-55555555-6666-7777-8888-999999999999",
    ),
)
MIG = PodPlacement(
    tenant="dratenant",
    workload_id="w-mig",
    allocation_id="a-mig",
    node="dra-a100-0",
    flavor="A100-80GB/3g.40gb",
    gpus=(2,),
    gpu_uuids=("GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",),
)


@pytest.fixture(scope="module")
def api(k8s_cluster: K8sCluster) -> Iterator[client.ApiClient]:
    with k8s_cluster.api_client() as api_client:
        reconcile([TENANT], SETTINGS, api_client)
        # Quota admission refuses claims until the controller has published the quota's status.
        core = client.CoreV1Api(api_client)
        deadline = time.monotonic() + 30
        while True:
            quota = core.read_namespaced_resource_quota(
                "tenant-quota", SETTINGS.namespace("dratenant")
            )
            if quota.status and quota.status.hard:
                break
            assert time.monotonic() < deadline, "the tenant quota's status was never published"
            time.sleep(0.2)
        custom = client.CustomObjectsApi(api_client)
        for name, cel in (
            ("gpu.nvidia.com", 'device.driver == "gpu.nvidia.com"'),
            ("mig.nvidia.com", 'device.driver == "gpu.nvidia.com"'),
        ):
            device_class = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": cel}}]},
            }
            try:
                custom.create_cluster_custom_object(
                    "resource.k8s.io", "v1", "deviceclasses", device_class
                )
            except ApiException as e:
                if e.status != 409:  # another test module made it first
                    raise
        yield api_client
        # Later modules reconcile their own tenants.
        delete_tenant_namespaces(api_client, SETTINGS, [SETTINGS.namespace(TENANT.name)])


def notebook_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "jupyter-dra"},
        "spec": {"containers": [{"name": "notebook", "image": "registry.invalid/nb:0"}]},
    }


def test_the_dra_claims_and_pod_are_accepted_and_left_to_the_default_scheduler(
    api: client.ApiClient,
) -> None:
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    namespace = SETTINGS.namespace("dratenant")
    for placement in (PLACEMENT, MIG):
        claim = resource_claim(placement, DRA)
        # The apiserver compiles the CEL selectors: a malformed one would be refused (422).
        custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", namespace, "resourceclaims", claim
        )
    stored = custom.get_namespaced_custom_object(
        "resource.k8s.io",
        "v1",
        namespace,
        "resourceclaims",
        "gpus-0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d",
    )
    requests = stored["spec"]["devices"]["requests"]
    assert [r["exactly"]["selectors"][0]["cel"]["expression"] for r in requests] == [
        'device.attributes["gpu.nvidia.com"].uuid == "GPU-00000000-1111-2222-3333-444444444444"',
        'device.attributes["gpu.nvidia.com"].uuid == "GPU-55555555-6666-7777-8888-999999999999"',
    ]

    pod = place_pod(notebook_pod(), PLACEMENT, DRA)
    # Accepted by restricted Pod Security and by the tenant's quota (no counted GPUs asked).
    created = core.create_namespaced_pod(namespace, pod)
    assert created.spec.scheduler_name == "default-scheduler"
    assert created.spec.resource_claims[0].resource_claim_name == claim_name_of(PLACEMENT)
    assert created.spec.containers[0].resources.claims[0].name == "gpus"
    pin = created.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    assert pin.node_selector_terms[0].match_fields[0].values == ["dra-h100-0"]
    # Not the binder's pod: the kube-scheduler's DRA plugin allocates the claim and binds.
    unused: AllocationSource = None  # type: ignore[assignment]
    assert all(p.name != "jupyter-dra" for p in Binder(api, unused, SETTINGS).pending())
    # Leave no pod behind: a tenant namespace with pods cannot be reconciled away.
    core.delete_namespaced_pod("jupyter-dra", namespace, grace_period_seconds=0)


def claim_name_of(placement: PodPlacement) -> str:
    return f"gpus-{placement.allocation_id}"


def test_a_claim_selector_with_a_typo_is_refused_by_the_apiserver(api: client.ApiClient) -> None:
    """The golden CEL is not just text: the same shape with a broken expression is refused."""
    claim = resource_claim(PLACEMENT, DRA)
    claim["metadata"]["name"] = "broken"
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"] = (
        'device.attributes["gpu.nvidia.com"].uuid =='
    )
    with pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "resource.k8s.io", "v1", SETTINGS.namespace("dratenant"), "resourceclaims", claim
        )
    assert refused.value.status == 422
