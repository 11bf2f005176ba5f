"""The fake GPU node factory: manifests as the GPU Operator would label a real node (no cluster)."""

from __future__ import annotations

import pytest

from policies.errors import InvalidRequest
from policies.mig import MigInstance
from policies.topology import LinkClass
from tests.support import gpu_nodes
from tests.support.gpu_nodes import A100_SXM4_80GB, TESLA_T4, GpuNodeSpec, MigStrategy

DRIVER_AND_CUDA = {
    "nvidia.com/cuda.driver.major": "570",
    "nvidia.com/cuda.driver.minor": "124",
    "nvidia.com/cuda.driver.rev": "6",
    "nvidia.com/cuda.driver-version.major": "570",
    "nvidia.com/cuda.driver-version.minor": "124",
    "nvidia.com/cuda.driver-version.revision": "6",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "8",
}


def test_t4_pcie_node_is_the_literal_manifest() -> None:
    capacity = {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "2"}
    assert gpu_nodes.t4_pcie_node("t4-0") == {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "t4-0",
            "labels": {
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": "t4-0",
                "kubernetes.io/os": "linux",
                "topology.kubernetes.io/zone": "zone-b",
                "gpuportal.io/rack": "rack-3",
                "gpuportal.io/gpu.link": "same-numa",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "Tesla-T4",
                "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.memory": "15360",
                "nvidia.com/gpu.family": "turing",
                "nvidia.com/gpu.compute.major": "7",
                "nvidia.com/gpu.compute.minor": "5",
                "nvidia.com/gpu.replicas": "1",
                "nvidia.com/gpu.sharing-strategy": "none",
                "nvidia.com/mig.capable": "false",
                "nvidia.com/mig.strategy": "none",
                **DRIVER_AND_CUDA,
            },
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
        },
    }


def test_h100_node_has_eight_whole_gpus_on_nvswitch_and_its_clique() -> None:
    node = gpu_nodes.h100_nvswitch_node("h100-0", zone="z1", rack="r7", clique="fabric-1.0")
    labels = node["metadata"]["labels"]
    assert node["status"]["capacity"] == {
        "cpu": "224",
        "memory": "2Ti",
        "pods": "110",
        "nvidia.com/gpu": "8",
    }
    assert {
        k: labels[k] for k in labels if k.startswith(("nvidia.com/gpu.", "nvidia.com/mig"))
    } == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "none",
        "nvidia.com/mig.config": "all-disabled",
        "nvidia.com/mig.config.state": "success",
        "nvidia.com/gpu.clique": "fabric-1.0",
    }
    assert labels["topology.kubernetes.io/zone"] == "z1"
    assert labels["gpuportal.io/rack"] == "r7"
    assert LinkClass.parse(labels["gpuportal.io/gpu.link"]) is LinkClass.NVSWITCH


def test_h100_node_without_clique_has_no_clique_label() -> None:
    assert "nvidia.com/gpu.clique" not in gpu_nodes.h100_nvswitch_node("h")["metadata"]["labels"]


def test_a100_mig_mixed_counts_follow_the_all_balanced_layout_times_four_gpus() -> None:
    node = gpu_nodes.a100_mig_mixed_node("a100-0")
    # Per GPU: 2g.20gb@0 + 1g.10gb@2 + 1g.10gb@3 + 3g.40gb@4 = 2+1+1+3 = 7 compute slices,
    # memory slices 0-1, 2, 3, 4-7 = all 8. Four GPUs: 4x 2g, 8x 1g, 4x 3g; no whole GPUs.
    assert node["status"]["allocatable"] == {
        "cpu": "128",
        "memory": "1Ti",
        "pods": "110",
        "nvidia.com/mig-2g.20gb": "4",
        "nvidia.com/mig-1g.10gb": "8",
        "nvidia.com/mig-3g.40gb": "4",
    }
    labels = node["metadata"]["labels"]
    mig_labels = {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig-")}
    assert mig_labels == {
        "nvidia.com/mig-2g.20gb.count": "4",
        "nvidia.com/mig-2g.20gb.memory": "20480",
        "nvidia.com/mig-2g.20gb.slices.gi": "2",
        "nvidia.com/mig-2g.20gb.slices.ci": "2",
        "nvidia.com/mig-1g.10gb.count": "8",
        "nvidia.com/mig-1g.10gb.memory": "10240",
        "nvidia.com/mig-1g.10gb.slices.gi": "1",
        "nvidia.com/mig-1g.10gb.slices.ci": "1",
        "nvidia.com/mig-3g.40gb.count": "4",
        "nvidia.com/mig-3g.40gb.memory": "40960",
        "nvidia.com/mig-3g.40gb.slices.gi": "3",
        "nvidia.com/mig-3g.40gb.slices.ci": "3",
    }
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/mig.config"] == "all-balanced"


def _spec(**overrides: object) -> GpuNodeSpec:
    base: dict[str, object] = {
        "name": "n",
        "gpu": A100_SXM4_80GB,
        "gpu_count": 2,
        "link": LinkClass.NVLINK,
        "zone": "z",
        "rack": "r",
    }
    base.update(overrides)
    return GpuNodeSpec(**base)  # type: ignore[arg-type]


def test_single_strategy_exposes_mig_devices_as_nvidia_gpu_and_renames_the_product() -> None:
    layout = tuple(MigInstance("1g.10gb", s) for s in range(7))
    node = gpu_nodes.node_manifest(_spec(mig_strategy=MigStrategy.SINGLE, mig_layout=layout))
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "14"
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert not any(k.startswith("nvidia.com/mig-") for k in labels)
    assert labels["nvidia.com/gpu.count"] == "14"
    assert labels["nvidia.com/gpu.memory"] == "10240"
    assert labels["nvidia.com/gpu.slices.gi"] == "1"


def test_taints_and_extra_labels_are_copied() -> None:
    node = gpu_nodes.node_manifest(
        _spec(taints=(gpu_nodes.KWOK_TAINT,), labels={"gpuportal.io/pool": "research"})
    )
    assert node["spec"] == {
        "taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]
    }
    assert node["metadata"]["labels"]["gpuportal.io/pool"] == "research"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gpu_count": 0}, "gpu_count"),
        ({"gpu": TESLA_T4, "mig_strategy": MigStrategy.MIXED,
          "mig_layout": (MigInstance("1g.10gb", 0),)}, "T4 has no MIG"),
        ({"mig_strategy": MigStrategy.MIXED}, "expected a layout"),
        ({"mig_layout": (MigInstance("1g.10gb", 0),)}, "expected a layout"),
        ({"mig_strategy": MigStrategy.SINGLE,
          "mig_layout": (MigInstance("1g.10gb", 0), MigInstance("2g.20gb", 2))}, "one profile"),
    ],
)  # fmt: skip
def test_inconsistent_specs_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _spec(**overrides)


def test_layouts_nvidia_does_not_allow_are_refused() -> None:
    # 7g.80gb takes all 7 compute slices; a 1g.10gb next to it has none left.
    layout = (MigInstance("7g.80gb", 0), MigInstance("1g.10gb", 0))
    with pytest.raises(InvalidRequest, match="MIG layout"):
        _spec(mig_strategy=MigStrategy.MIXED, mig_layout=layout)


def test_builders_do_not_share_mutable_state() -> None:
    first = gpu_nodes.t4_pcie_node("t4-0")
    first["status"]["capacity"]["nvidia.com/gpu"] = "99"
    assert first["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert gpu_nodes.t4_pcie_node("t4-0")["status"]["capacity"]["nvidia.com/gpu"] == "2"
