"""Kubernetes Node → inventory Node, from literal manifests as GPU Feature Discovery labels them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client as k8s

from policies.errors import InvalidRequest
from policies.inventory import GPU, Taint, TaintEffect
from policies.mig import MigInstance
from policies.topology import LinkClass
from portal.inventory import annotation, simulated
from portal.inventory.kubernetes import to_node
from tests.support import gpu_nodes

BALANCED = (
    MigInstance("2g.20gb", 0),
    MigInstance("1g.10gb", 2),
    MigInstance("1g.10gb", 3),
    MigInstance("3g.40gb", 4),
)


def manifest(labels: dict[str, str], allocatable: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": labels, "resourceVersion": "7"},
        "spec": spec,
        "status": {"allocatable": {"cpu": "63500m", "memory": "500Gi", **allocatable}},
    }


def test_t4_node_with_sharing_taints_and_cordon() -> None:
    node = to_node(
        manifest(
            {
                "nvidia.com/gpu.product": "Tesla-T4",
                "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.memory": "15360",
                "gpuportal.io/gpu-sharing": "true",
                "gpuportal.io/pool": "inference",
                "topology.kubernetes.io/zone": "zone-b",
            },
            {"nvidia.com/gpu": "2"},
            taints=[{"key": "gpu", "value": "t4", "effect": "NoSchedule"}],
            unschedulable=True,
        )
    )

    assert node is not None
    assert node.gpus == (
        GPU(0, "T4", 15360, shareable=True),
        GPU(1, "T4", 15360, shareable=True),
    )
    assert (node.cpu_milli, node.memory_mib) == (63_500, 512_000)
    assert (node.pool, node.zone, node.schedulable) == ("inference", "zone-b", False)
    assert node.taints == (Taint("gpu", "t4", TaintEffect.NO_SCHEDULE),)
    assert node.topology is None


def test_h100_from_the_gpu_node_factory() -> None:
    node = to_node(gpu_nodes.h100_nvswitch_node("h1", clique="c7"))

    assert node is not None
    assert [g.model for g in node.gpus] == ["H100-80GB"] * 8
    assert node.gpus[0].memory_mib == 81559
    assert (node.cpu_milli, node.memory_mib, node.rack, node.clique) == (
        224_000,
        2 * 1024 * 1024,
        "rack-1",
        "c7",
    )
    assert node.mig_reconfigurable  # MIG-capable and the MIG manager labels are present


def test_mixed_strategy_counts_become_the_same_valid_layout_on_every_gpu() -> None:
    node = to_node(gpu_nodes.a100_mig_mixed_node("a1"))

    assert node is not None
    assert [g.mig_layout for g in node.gpus] == [BALANCED] * 4


def test_mixed_strategy_with_some_whole_gpus() -> None:
    # 2 of 4 GPUs in MIG mode holding 7 1g.10gb and one 7g.80gb between them.
    node = to_node(
        manifest(
            {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.count": "4",
                "nvidia.com/gpu.memory": "81920",
                "nvidia.com/mig.strategy": "mixed",
                "nvidia.com/mig-1g.10gb.count": "7",
                "nvidia.com/mig-7g.80gb.count": "1",
            },
            {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-7g.80gb": "1"},
        )
    )

    assert node is not None
    assert [g.mig_enabled for g in node.gpus] == [True, True, False, False]
    assert sorted(len(g.mig_layout) for g in node.gpus[:2]) == [1, 7]


def test_single_strategy_fills_whole_gpus_with_the_one_profile() -> None:
    spec = gpu_nodes.GpuNodeSpec(
        name="s1",
        gpu=gpu_nodes.A100_SXM4_80GB,
        gpu_count=2,
        link=LinkClass.NVLINK,
        zone="z",
        rack="r",
        mig_strategy=gpu_nodes.MigStrategy.SINGLE,
        mig_layout=tuple(MigInstance("1g.10gb", s) for s in range(7)),
    )
    node = to_node(gpu_nodes.node_manifest(spec))

    assert node is not None
    assert len(node.gpus) == 2
    assert all(len(g.mig_layout) == 7 and g.memory_mib == 81920 for g in node.gpus)


def test_annotation_gives_the_exact_layout_uuids_and_topology() -> None:
    demo = {n.name: n for n in simulated.load_demo()}["a100-1"]
    raw = manifest(
        {"nvidia.com/gpu.product": "NVIDIA-A100-PCIE-80GB", "nvidia.com/gpu.count": "4"},
        {"nvidia.com/gpu": "2"},
    )
    raw["metadata"]["annotations"] = {annotation.ANNOTATION: annotation.encode(demo)}

    node = to_node(raw)

    assert node is not None
    assert node.gpus == demo.gpus
    assert node.topology == demo.topology


def test_a_broken_annotation_falls_back_to_labels() -> None:
    raw = manifest({"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1"}, {})
    raw["metadata"]["annotations"] = {annotation.ANNOTATION: '{"version": 9}'}

    node = to_node(raw)

    assert node is not None and node.gpus == (GPU(0, "L4", 23034),)


def test_v1node_objects_convert_like_their_dicts() -> None:
    raw = gpu_nodes.t4_pcie_node("t4-0")
    raw["status"].pop("nodeInfo", None)  # a fake nodeInfo may lack fields V1Node requires
    obj = k8s.ApiClient().deserialize(json.dumps(raw), "V1Node", "application/json")
    assert isinstance(obj, k8s.V1Node)

    assert to_node(obj) == to_node(raw)


def test_nodes_without_gpus_are_ignored() -> None:
    assert to_node(manifest({"kubernetes.io/os": "linux"}, {"nvidia.com/gpu": "0"})) is None


def test_unknown_products_keep_a_sanitized_name(caplog: pytest.LogCaptureFixture) -> None:
    node = to_node(
        manifest(
            {"nvidia.com/gpu.product": "NVIDIA-RTX-6000 Ada", "nvidia.com/gpu.memory": "49140"},
            {"nvidia.com/gpu": "1"},
        )
    )
    assert node is not None and node.gpus[0].model == "RTX-6000-ADA"
    assert "unknown GPU product 'NVIDIA-RTX-6000 Ada'" in caplog.text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"allocatable": {"cpu": "lots"}},
            "invalid node n1 allocatable cpu 'lots': expected a Kubernetes quantity",
        ),
        (
            {"labels": {"nvidia.com/gpu.count": "two"}},
            "invalid node n1 label nvidia.com/gpu.count 'two': expected a Kubernetes quantity",
        ),
        (
            {"labels": {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-5g.50gb.count": "1"}},
            "invalid node n1 MIG profile '5g.50gb' for A100-80GB: expected one of",
        ),
        (
            {"labels": {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-7g.80gb.count": "3"}},
            "invalid node n1 MIG instances 3x 7g.80gb: expected instances that fit on 2",
        ),
        (
            {"taints": [{"key": "k", "effect": "Maybe"}]},
            "invalid node n1 taint k effect 'Maybe': expected one of NoSchedule",
        ),
    ],
)
def test_bad_nodes_name_the_node_field_and_value(change: dict[str, Any], message: str) -> None:
    raw = manifest(
        {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.count": "2",
            "nvidia.com/gpu.memory": "81920",
        },
        {},
    )
    raw = copy.deepcopy(raw)
    raw["metadata"]["labels"].update(change.get("labels", {}))
    raw["status"]["allocatable"].update(change.get("allocatable", {}))
    if "taints" in change:
        raw["spec"]["taints"] = change["taints"]
    with pytest.raises(InvalidRequest) as info:
        to_node(raw)
    assert info.value.message.startswith(message), info.value.message


def test_annotation_round_trips_every_demo_node() -> None:
    for node in simulated.load_demo():
        report = annotation.decode(annotation.encode(node))
        assert report.topology == node.link_topology
        assert [g.mig_layout for g in report.gpus] == [g.mig_layout for g in node.gpus]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "invalid A JSON (Expecting property name"),
        ('{"version": 1, "gpus": {}}', "invalid A gpus dict: expected a JSON list"),
        (
            '{"version": 1, "gpus": [], "links": [["warp"]], "numa": []}',
            "invalid A link class warp: expected cross_socket",
        ),
    ],
)
def test_bad_annotations(text: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        annotation.decode(text, where="A")
    assert info.value.message.startswith(message), info.value.message
