"""``spawner.pod``: the pod (and DRA claim) an allocation makes, against literal golden files."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.errors import InvalidRequest
from policies.isolation import IsolationSettings
from portal.store.records import AllocationRecord
from spawner.pod import (
    DraSettings,
    PodPlacement,
    PodSettings,
    gpu_resources,
    place_pod,
    resource_claim,
    tenant_pod,
)

GOLDEN = Path(__file__).parent / "golden"
SETTINGS = PodSettings()
DRA = PodSettings(dra=DraSettings())
H100_UUIDS = (
    "GPU-5f1c2a7e-0d3b-4c8e-9a21-7b6e5d4c3b2a",
    "GPU-8e7d6c5b-4a39-4281-b7c6-d5e4f3a2b1c0",
)

TWO_H100 = PodPlacement(
    tenant="vision",
    workload_id="3f2a9c0d1e4b4f6a8b7c6d5e4f3a2b1c",
    allocation_id="a1b2c3d4e5f60718293a4b5c6d7e8f90",
    node="h100-node-0",
    flavor="H100-80GB",
    gpus=(2, 3),
    gpu_uuids=H100_UUIDS,
)
MIG = PodPlacement(
    tenant="vision",
    workload_id="0c1d2e3f405162738495a6b7c8d9eaf0",
    allocation_id="f0e1d2c3b4a5968778695a4b3c2d1e0f",
    node="a100-mig-0",
    flavor="A100-80GB/3g.40gb",
    gpus=(1,),
    gpu_uuids=("GPU-11111111-2222-3333-4444-555555555555",),
)
SHARE = PodPlacement(
    tenant="audit",
    workload_id="9a8b7c6d5e4f30211203f4e5d6c7b8a9",
    allocation_id="1a2b3c4d5e6f70819203a4b5c6d7e8f9",
    node="t4-node-0",
    flavor="T4/share",
    gpus=(0,),
    milli=250,
)


def golden(name: str) -> Any:
    return yaml.safe_load((GOLDEN / name).read_text())


def kubespawner_pod() -> dict[str, Any]:
    pod: dict[str, Any] = golden("kubespawner-pod.yaml")
    return pod


@pytest.mark.parametrize(
    ("placement", "settings", "file"),
    [
        (TWO_H100, SETTINGS, "pod-two-h100.yaml"),
        (MIG, SETTINGS, "pod-mig-3g40gb.yaml"),
        (SHARE, SETTINGS, "pod-t4-share.yaml"),
        (TWO_H100, DRA, "pod-two-h100-dra.yaml"),
    ],
    ids=["whole-gpus", "mig", "share", "whole-gpus-dra"],
)
def test_place_pod_matches_the_golden_file(
    placement: PodPlacement, settings: PodSettings, file: str
) -> None:
    assert place_pod(kubespawner_pod(), placement, settings) == golden(file)


@pytest.mark.parametrize(
    ("placement", "file"),
    [(TWO_H100, "claim-two-h100.yaml"), (MIG, "claim-mig-3g40gb.yaml")],
    ids=["whole-gpus", "mig"],
)
def test_resource_claim_matches_the_golden_file(placement: PodPlacement, file: str) -> None:
    assert resource_claim(placement, DRA) == golden(file)


def test_place_pod_leaves_its_input_alone() -> None:
    pod = kubespawner_pod()
    before = copy.deepcopy(pod)
    place_pod(pod, TWO_H100, SETTINGS)
    assert pod == before


def test_resources_per_flavor_kind() -> None:
    assert gpu_resources(TWO_H100, SETTINGS) == {"nvidia.com/gpu": "2"}
    assert gpu_resources(MIG, SETTINGS) == {"nvidia.com/mig-3g.40gb": "1"}
    # 250 milli-GPU with the default 10 replicas per GPU: 2.5 replicas, rounded up to 3, the
    # same rounding as the tenant's ResourceQuota.
    assert gpu_resources(SHARE, SETTINGS) == {"nvidia.com/gpu.shared": "3"}
    four = PodSettings(isolation=IsolationSettings(shared_gpu_replicas=4))
    assert gpu_resources(SHARE, four) == {"nvidia.com/gpu.shared": "1"}


def test_namespace_and_labels_follow_the_isolation_settings() -> None:
    settings = PodSettings(
        isolation=IsolationSettings(namespace_prefix="t-", label_prefix="example.org/")
    )
    pod = place_pod(kubespawner_pod(), SHARE, settings)
    assert pod["metadata"]["namespace"] == "t-audit"
    assert pod["metadata"]["labels"]["example.org/workload"] == SHARE.workload_id
    assert pod["metadata"]["labels"]["example.org/tenant"] == "audit"


def test_dra_keeps_shares_on_the_counted_resource() -> None:
    pod = place_pod(kubespawner_pod(), SHARE, DRA)
    assert pod["spec"]["schedulerName"] == "gpuportal"
    assert "resourceClaims" not in pod["spec"]
    with pytest.raises(InvalidRequest, match="shares use the counted resource"):
        resource_claim(SHARE, DRA)


def test_dra_claim_needs_uuids_and_settings() -> None:
    no_uuids = PodPlacement(
        tenant="vision",
        workload_id="w1",
        allocation_id="a1",
        node="n1",
        flavor="H100-80GB",
        gpus=(0,),
    )
    with pytest.raises(InvalidRequest, match="pin devices by UUID"):
        resource_claim(no_uuids, DRA)
    with pytest.raises(InvalidRequest, match="DRA settings"):
        resource_claim(TWO_H100, SETTINGS)


def test_node_pin_is_anded_into_every_existing_affinity_term() -> None:
    pod = kubespawner_pod()
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}
    rack = {"key": "gpuportal.io/rack", "operator": "In", "values": ["rack-1"]}
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchExpressions": [rack]}]
            }
        }
    }
    placed = place_pod(pod, TWO_H100, DRA)
    terms = placed["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    pin = {"key": "metadata.name", "operator": "In", "values": ["h100-node-0"]}
    # Terms are ORed: appending a term would let the pod onto any node matching the others.
    assert terms == [
        {"matchExpressions": [zone], "matchFields": [pin]},
        {"matchExpressions": [rack], "matchFields": [pin]},
    ]


def test_another_container_asking_for_a_gpu_is_refused() -> None:
    pod = kubespawner_pod()
    pod["spec"]["containers"].append(
        {"name": "sidecar", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    )
    with pytest.raises(InvalidRequest) as refused:
        place_pod(pod, TWO_H100, SETTINGS)
    assert refused.value.message == (
        "invalid resources of container 'sidecar' nvidia.com/gpu: expected no GPU resources "
        "outside container 'notebook', the one the allocation is for"
    )


def test_a_pod_without_the_gpu_container_is_refused() -> None:
    pod = kubespawner_pod()
    pod["spec"]["containers"][0]["name"] = "lab"
    with pytest.raises(InvalidRequest) as refused:
        place_pod(pod, TWO_H100, SETTINGS)
    assert refused.value.message == (
        "invalid GPU container 'notebook': expected the name of one of the pod's containers: lab"
    )


BASE: dict[str, Any] = {
    "tenant": "vision",
    "workload_id": "w1",
    "allocation_id": "a1",
    "node": "n1",
    "flavor": "H100-80GB",
    "gpus": (0,),
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tenant": "Vision"}, "invalid tenant 'Vision'"),
        ({"workload_id": "-x"}, "invalid workload id '-x'"),
        ({"allocation_id": "a" * 64}, "invalid allocation id"),
        ({"node": "Node_1"}, "invalid node 'Node_1': expected a Kubernetes node name"),
        ({"flavor": "H100-80GB/9g.99gb"}, "invalid MIG profile"),
        ({"gpus": ()}, "invalid gpus (): expected one or more GPU indices"),
        ({"gpus": (1, 1)}, "expected distinct GPU indices"),
        ({"gpu_uuids": ("GPU-a", "GPU-b")}, "expected 1 UUIDs (one per GPU) or none"),
        ({"gpu_uuids": ('GPU-a" || true',)}, "invalid GPU UUID"),
        ({"flavor": "T4/share", "gpus": (0, 1), "milli": 500}, "exactly one GPU for a share"),
        ({"flavor": "T4/share", "milli": 1000}, "invalid milli 1000: expected 1 to 999"),
        ({"milli": 500}, "invalid milli 500: expected 1000 for a whole GPU or MIG"),
    ],
)
def test_bad_placements_are_refused_with_what_would_be_valid(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        PodPlacement(**{**BASE, **change})
    assert message in refused.value.message


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"run_as_user": 0}, "invalid run_as_user 0: expected a non-root id"),
        ({"container": ""}, "invalid container ''"),
    ],
)
def test_bad_pod_settings_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        PodSettings(**change)
    assert message in refused.value.message


def test_a_cpu_only_pod_is_isolated_but_not_placed_by_the_portal() -> None:
    pod = kubespawner_pod()
    del pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    out = tenant_pod(pod, "audit", SETTINGS)
    spec = out["spec"]
    assert out["metadata"]["namespace"] == "gp-audit"
    assert out["metadata"]["labels"]["gpuportal.io/tenant"] == "audit"
    assert "gpuportal.io/workload" not in out["metadata"]["labels"]
    assert "schedulerName" not in spec  # the default scheduler places CPU-only pods
    assert spec["serviceAccountName"] == "tenant-jobs"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }


def test_a_cpu_only_pod_asking_for_a_gpu_is_refused() -> None:
    with pytest.raises(InvalidRequest) as refused:
        tenant_pod(kubespawner_pod(), "audit", SETTINGS)
    assert refused.value.message == (
        "invalid resources of container 'notebook' nvidia.com/gpu: expected no GPU resources "
        "in a pod without a GPU allocation"
    )


def test_placement_of_an_allocation_record() -> None:
    mig = AllocationRecord(
        "a1", "w1", 0, "a100-0", "A100-80GB/3g.40gb", 1, 3 / 7, gpus=(2,), gpu_uuids=("",)
    )
    placed = PodPlacement.of("vision", "w1", mig)
    # The allocator records no milli for MIG, and no UUID when the inventory knows none.
    assert (placed.milli, placed.gpu_uuids, placed.mig_profile) == (1000, (), "3g.40gb")
    share = AllocationRecord("a2", "w2", 0, "t4-0", "T4/share", 250, 0.25, gpus=(0,), milli=250)
    assert PodPlacement.of("audit", "w2", share).milli == 250
