"""``GPUKubeSpawner.create_claim`` against the real apiserver: the DRA claim of a started pod,
owned by the pod and collected with it.

The test cluster runs no kube-scheduler, so a DRA pod is never allocated and bound here; what is
checked is the spawner's part: the claim it creates, its owner, and its lifetime.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes_asyncio import client as async_client
from kubernetes_asyncio.config import kube_config

from spawner.kube import GPUKubeSpawner
from spawner.pod import PodPlacement, place_pod
from tests.support.k8s import K8sCluster

pytestmark = pytest.mark.k8s

PLACEMENT = PodPlacement(
    tenant="dspawn",
    workload_id="w-dspawn",
    allocation_id="a-dspawn",
    node="dra-node-0",
    flavor="H100-80GB",
    gpus=(3,),
    gpu_uuids=("GPU-12345678-abcd-ef01-2345-6789abcdef01",),
)
NAMESPACE = "gp-dspawn"


@pytest.fixture
def kube_default(k8s_cluster: K8sCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """KubeSpawner configures kubernetes_asyncio's process-wide default from the kubeconfig;
    point it at the test cluster's admin, and put the default back afterwards."""
    before = async_client.Configuration.get_default_copy()
    monkeypatch.setattr(
        kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(k8s_cluster.admin_kubeconfig)
    )
    yield
    async_client.Configuration.set_default(before)


def claim_or_none(custom: client.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = custom.get_namespaced_custom_object(
            "resource.k8s.io", "v1", NAMESPACE, "resourceclaims", name
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return found


async def test_the_claim_is_owned_by_the_pod_and_goes_with_it(
    k8s_cluster: K8sCluster, kube_default: None
) -> None:
    k8s_cluster.create_namespace(NAMESPACE)
    with k8s_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        core.create_namespaced_service_account(
            NAMESPACE, {"metadata": {"name": "tenant-jobs"}, "automountServiceAccountToken": False}
        )
        spawner = GPUKubeSpawner(_mock=True, pin_devices_with_dra=True)
        spawner.placed = PLACEMENT
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "jupyter-dra-spawn"},
            "spec": {"containers": [{"name": "notebook", "image": "registry.invalid/nb:0"}]},
        }
        created = core.create_namespaced_pod(
            NAMESPACE, place_pod(pod, PLACEMENT, spawner.pod_settings())
        )
        as_dict = api.sanitize_for_serialization(created)

        await spawner.create_claim(as_dict)
        await spawner.create_claim(as_dict)  # a retried start keeps the claim

        claim = claim_or_none(custom, "gpus-a-dspawn")
        assert claim is not None
        (owner,) = claim["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "Pod",
            "jupyter-dra-spawn",
            created.metadata.uid,
        )
        (request,) = claim["spec"]["devices"]["requests"]
        assert request["exactly"]["selectors"][0]["cel"]["expression"] == (
            'device.attributes["gpu.nvidia.com"].uuid == "GPU-12345678-abcd-ef01-2345-6789abcdef01"'
        )
        assert created.spec.resource_claims[0].resource_claim_name == "gpus-a-dspawn"

        core.delete_namespaced_pod("jupyter-dra-spawn", NAMESPACE, grace_period_seconds=0)
        deadline = time.monotonic() + 60
        # kube-controller-manager's garbage collector deletes what the pod owned.
        while claim_or_none(custom, "gpus-a-dspawn") is not None:
            assert time.monotonic() < deadline, "the claim outlived its pod"
            time.sleep(0.5)


async def test_without_dra_no_claim_is_made(kube_default: None) -> None:
    spawner = GPUKubeSpawner(_mock=True)
    assert spawner.pod_settings().dra is None
    assert spawner.placed is None
    # Nothing to create: the hook returns without calling the apiserver.
    await spawner.create_claim({"metadata": {"name": "x", "uid": "y"}})
