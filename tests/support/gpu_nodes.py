"""Fake GPU nodes for kwok: Node manifests as a cluster running the NVIDIA GPU Operator shows them.

Pure functions over frozen inputs that return plain dicts (the JSON the apiserver accepts), so the
tests can compare them with literal manifests and ``k8s_cluster.add_gpu_node`` can create them.

What the operator would have put on a real node, and where it comes from:

- GPU Feature Discovery labels: ``nvidia.com/gpu.product`` (the product name with spaces as
  dashes), ``gpu.count``, ``gpu.memory`` (MiB per GPU), ``gpu.family``,
  ``gpu.compute.major/minor``, ``gpu.replicas``, ``gpu.sharing-strategy``, ``mig.capable``,
  ``mig.strategy``, ``cuda.driver.major/minor/rev`` (and the newer ``cuda.driver-version.*``),
  ``cuda.runtime.major/minor``; under the single MIG strategy ``gpu.count``, ``gpu.memory``
  and ``gpu.slices.*`` describe the MIG devices instead, under mixed there are per-profile
  ``mig-<profile>.count/.memory/.slices.gi/.slices.ci``; ``gpu.clique`` on nodes inside an
  NVLink domain;
- NVIDIA device plugin resources in capacity/allocatable: ``nvidia.com/gpu`` for whole GPUs
  (and for MIG devices under the single strategy), ``nvidia.com/mig-<profile>`` under mixed;
- MIG manager labels: ``nvidia.com/mig.config`` and ``nvidia.com/mig.config.state``;
- the cluster's own labels: ``topology.kubernetes.io/zone`` and our rack label.

kwok only manages nodes carrying ``kwok.x-k8s.io/node: fake`` (the fixture starts it with that
annotation selector), so every manifest has it. kwok needs no taint; ``KWOK_TAINT`` exists for
clusters where a real scheduler must keep its pods off fake nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from policies import mig
from policies.topology import LinkClass

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
KWOK_TAINT: Mapping[str, str] = {"key": KWOK_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
RACK_LABEL = "gpuportal.io/rack"
ZONE_LABEL = "topology.kubernetes.io/zone"
# Best link between the node's GPUs, as our node agent reports it (policies.topology.LinkClass).
LINK_LABEL = "gpuportal.io/gpu.link"
GPU_RESOURCE = "nvidia.com/gpu"


class MigStrategy(StrEnum):
    """The device plugin's and GFD's ``--mig-strategy``."""

    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU product as GFD describes it."""

    model: str  # our flavor model name (policies.flavors), e.g. "H100-80GB"
    product: str  # nvidia.com/gpu.product
    memory_mib: int  # nvidia.com/gpu.memory, what NVML reports as total memory
    family: str
    compute_capability: tuple[int, int]

    @property
    def mig_capable(self) -> bool:
        return mig.is_mig_capable(self.model)


H100_80GB_HBM3 = GpuModel("H100-80GB", "NVIDIA-H100-80GB-HBM3", 81559, "hopper", (9, 0))
A100_SXM4_80GB = GpuModel("A100-80GB", "NVIDIA-A100-SXM4-80GB", 81920, "ampere", (8, 0))
TESLA_T4 = GpuModel("T4", "Tesla-T4", 15360, "turing", (7, 5))

# NVIDIA's "all-balanced" mig-parted layout for the 80 GB A100/H100, placed as nvidia-smi does:
# 2g.20gb on memory slices 0-1, two 1g.10gb on 2 and 3, 3g.40gb on 4-7 (7 of 7 compute slices).
ALL_BALANCED_80GB: tuple[mig.MigInstance, ...] = (
    mig.MigInstance("2g.20gb", 0),
    mig.MigInstance("1g.10gb", 2),
    mig.MigInstance("1g.10gb", 3),
    mig.MigInstance("3g.40gb", 4),
)


@dataclass(frozen=True, slots=True)
class GpuNodeSpec:
    """Everything that distinguishes one fake GPU node. Every GPU has the same MIG layout."""

    name: str
    gpu: GpuModel
    gpu_count: int
    link: LinkClass
    zone: str
    rack: str
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110
    mig_strategy: MigStrategy = MigStrategy.NONE
    mig_layout: tuple[mig.MigInstance, ...] = ()
    mig_config: str = "all-disabled"
    clique: str | None = None
    driver: tuple[int, int, int] = (570, 124, 6)
    cuda_runtime: tuple[int, int] = (12, 8)
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.gpu_count < 1:
            raise ValueError(f"gpu_count of {self.name!r} is {self.gpu_count}; expected >= 1")
        if self.mig_layout and not self.gpu.mig_capable:
            raise ValueError(f"{self.gpu.model} has no MIG; expected an empty mig_layout")
        if self.mig_layout:
            mig.validate_layout(mig.geometry(self.gpu.model), self.mig_layout)
        if (self.mig_strategy is MigStrategy.NONE) != (not self.mig_layout):
            raise ValueError(
                f"mig_strategy {self.mig_strategy} with {len(self.mig_layout)} MIG instances; "
                "expected a layout exactly when the strategy is 'single' or 'mixed'"
            )
        if (
            self.mig_strategy is MigStrategy.SINGLE
            and len({i.profile for i in self.mig_layout}) > 1
        ):
            raise ValueError("the 'single' MIG strategy needs one profile for every instance")


def _mig_profiles(spec: GpuNodeSpec) -> dict[str, int]:
    """Instances per profile on the whole node, in the layout's order."""
    per_gpu = Counter(i.profile for i in spec.mig_layout)
    return {profile: n * spec.gpu_count for profile, n in per_gpu.items()}


def gfd_labels(spec: GpuNodeSpec) -> dict[str, str]:
    """The ``nvidia.com/*`` labels GPU Feature Discovery and the MIG manager set on the node."""
    drv_major, drv_minor, drv_rev = spec.driver
    rt_major, rt_minor = spec.cuda_runtime
    product = spec.gpu.product
    if spec.mig_strategy is MigStrategy.SINGLE:
        # GFD's single strategy names the product after the one MIG profile it exposes.
        product = f"{product}-MIG-{spec.mig_layout[0].profile}"
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(spec.gpu_count),
        "nvidia.com/gpu.memory": str(spec.gpu.memory_mib),
        "nvidia.com/gpu.family": spec.gpu.family,
        "nvidia.com/gpu.compute.major": str(spec.gpu.compute_capability[0]),
        "nvidia.com/gpu.compute.minor": str(spec.gpu.compute_capability[1]),
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": str(spec.gpu.mig_capable).lower(),
        "nvidia.com/mig.strategy": str(spec.mig_strategy),
        "nvidia.com/cuda.driver.major": str(drv_major),
        "nvidia.com/cuda.driver.minor": str(drv_minor),
        "nvidia.com/cuda.driver.rev": str(drv_rev),
        "nvidia.com/cuda.driver-version.major": str(drv_major),
        "nvidia.com/cuda.driver-version.minor": str(drv_minor),
        "nvidia.com/cuda.driver-version.revision": str(drv_rev),
        "nvidia.com/cuda.runtime.major": str(rt_major),
        "nvidia.com/cuda.runtime.minor": str(rt_minor),
    }
    if spec.gpu.mig_capable:
        labels["nvidia.com/mig.config"] = spec.mig_config
        labels["nvidia.com/mig.config.state"] = "success"
    if spec.mig_strategy is MigStrategy.SINGLE:
        # Under "single" GFD describes the MIG devices as if they were the node's GPUs.
        p = mig.geometry(spec.gpu.model).profile(spec.mig_layout[0].profile)
        labels["nvidia.com/gpu.count"] = str(len(spec.mig_layout) * spec.gpu_count)
        labels["nvidia.com/gpu.memory"] = str(p.memory_mib)
        labels["nvidia.com/gpu.slices.gi"] = str(p.compute_slices)
        labels["nvidia.com/gpu.slices.ci"] = str(p.compute_slices)
    if spec.mig_strategy is MigStrategy.MIXED:
        geom = mig.geometry(spec.gpu.model)
        for profile, count in _mig_profiles(spec).items():
            p = geom.profile(profile)
            prefix = f"nvidia.com/mig-{profile}"
            labels[f"{prefix}.count"] = str(count)
            labels[f"{prefix}.memory"] = str(p.memory_mib)
            labels[f"{prefix}.slices.gi"] = str(p.compute_slices)
            labels[f"{prefix}.slices.ci"] = str(p.compute_slices)
    if spec.clique is not None:
        labels["nvidia.com/gpu.clique"] = spec.clique
    return labels


def gpu_resources(spec: GpuNodeSpec) -> dict[str, str]:
    """Extended resources the NVIDIA device plugin advertises for the node."""
    if spec.mig_strategy is MigStrategy.MIXED:
        return {f"nvidia.com/mig-{p}": str(n) for p, n in _mig_profiles(spec).items()}
    if spec.mig_strategy is MigStrategy.SINGLE:
        return {GPU_RESOURCE: str(len(spec.mig_layout) * spec.gpu_count)}
    return {GPU_RESOURCE: str(spec.gpu_count)}


def node_manifest(spec: GpuNodeSpec) -> dict[str, Any]:
    """The v1 Node with capacity and allocatable (the apiserver keeps a new Node's status;
    kwok's node-initialize stage adds conditions, addresses and nodeInfo)."""
    labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        ZONE_LABEL: spec.zone,
        RACK_LABEL: spec.rack,
        LINK_LABEL: spec.link.name.lower().replace("_", "-"),
        **gfd_labels(spec),
        **spec.labels,
    }
    capacity = {"cpu": spec.cpu, "memory": spec.memory, "pods": str(spec.pods)}
    capacity.update(gpu_resources(spec))
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
        },
        "spec": {},
        "status": {
            "capacity": dict(capacity),
            "allocatable": dict(capacity),
        },
    }
    if spec.taints:
        node["spec"]["taints"] = [dict(t) for t in spec.taints]
    return node


def h100_nvswitch_node(
    name: str, *, zone: str = "zone-a", rack: str = "rack-1", clique: str | None = None
) -> dict[str, Any]:
    """An HGX H100 (8x H100-80GB HBM3 on NVSwitch), whole GPUs, MIG off."""
    return node_manifest(
        GpuNodeSpec(
            name=name,
            gpu=H100_80GB_HBM3,
            gpu_count=8,
            link=LinkClass.NVSWITCH,
            zone=zone,
            rack=rack,
            cpu="224",
            memory="2Ti",
            clique=clique,
        )
    )


def a100_mig_mixed_node(name: str, *, zone: str = "zone-a", rack: str = "rack-2") -> dict[str, Any]:
    """4x A100-SXM4-80GB (NVLink), every GPU split "all-balanced" under the mixed strategy."""
    return node_manifest(
        GpuNodeSpec(
            name=name,
            gpu=A100_SXM4_80GB,
            gpu_count=4,
            link=LinkClass.NVLINK,
            zone=zone,
            rack=rack,
            cpu="128",
            memory="1Ti",
            mig_strategy=MigStrategy.MIXED,
            mig_layout=ALL_BALANCED_80GB,
            mig_config="all-balanced",
        )
    )


def t4_pcie_node(name: str, *, zone: str = "zone-b", rack: str = "rack-3") -> dict[str, Any]:
    """2x Tesla T4 on PCIe under one CPU socket."""
    return node_manifest(
        GpuNodeSpec(
            name=name,
            gpu=TESLA_T4,
            gpu_count=2,
            link=LinkClass.SAME_NUMA,
            zone=zone,
            rack=rack,
            cpu="32",
            memory="128Gi",
        )
    )
