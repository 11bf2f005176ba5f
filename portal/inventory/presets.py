"""Node presets: typical GPU servers, for the simulated inventory and benchmarks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from policies.topology import LinkClass, Topology


@dataclass(frozen=True, slots=True)
class Preset:
    """A kind of machine: its GPUs, how they are connected, and its host CPU and memory."""

    name: str
    description: str
    gpu_count: int
    model: str
    gpu_memory_mib: int
    topology: Callable[[], Topology]
    cpu_milli: int
    memory_mib: int
    shareable: bool = False
    mig_reconfigurable: bool = False


def _hgx8() -> Topology:
    """HGX H100: every GPU reaches every other through NVSwitch (NV18 in nvidia-smi)."""
    n = 8
    topo = Topology.uniform(n, LinkClass.NVSWITCH, numa=[0, 0, 0, 0, 1, 1, 1, 1])
    lanes = tuple(tuple(0 if i == j else 18 for j in range(n)) for i in range(n))
    return Topology(links=topo.links, numa=topo.numa, nvlink_lanes=lanes)


def _nvlink_pairs4() -> Topology:
    """4 PCIe cards, NVLink bridges joining 0-1 and 2-3 (NV12), one pair per socket."""
    numa = (0, 0, 1, 1)
    links = []
    lanes = []
    for i in range(4):
        row = []
        lane_row = []
        for j in range(4):
            paired = i // 2 == j // 2
            row.append(LinkClass.NVLINK if paired else LinkClass.CROSS_SOCKET)
            lane_row.append(12 if paired and i != j else 0)
        links.append(tuple(row))
        lanes.append(tuple(lane_row))
    return Topology(links=tuple(links), numa=numa, nvlink_lanes=tuple(lanes))


def _pcie_2socket8() -> Topology:
    """8 PCIe cards, 4 per socket, 2 behind each PCIe switch."""
    numa = tuple(i // 4 for i in range(8))

    def link(i: int, j: int) -> LinkClass:
        if i // 2 == j // 2:
            return LinkClass.SAME_PCIE_SWITCH
        if numa[i] == numa[j]:
            return LinkClass.SAME_NUMA
        return LinkClass.CROSS_SOCKET

    return Topology(links=tuple(tuple(link(i, j) for j in range(8)) for i in range(8)), numa=numa)


def _t4_2() -> Topology:
    return Topology.uniform(2, LinkClass.SAME_HOST_BRIDGE)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="hgx-h100-8",
            description="8x H100-80GB SXM on NVSwitch, 2 sockets / NUMA nodes",
            gpu_count=8,
            model="H100-80GB",
            gpu_memory_mib=81559,
            topology=_hgx8,
            cpu_milli=224_000,
            memory_mib=2 * 1024 * 1024,
            mig_reconfigurable=True,
        ),
        Preset(
            name="a100-pcie-4-nvlink-pairs",
            description="4x A100-80GB PCIe, NVLink bridges in pairs (0-1, 2-3), MIG optional",
            gpu_count=4,
            model="A100-80GB",
            gpu_memory_mib=81920,
            topology=_nvlink_pairs4,
            cpu_milli=128_000,
            memory_mib=1024 * 1024,
            mig_reconfigurable=True,
        ),
        Preset(
            name="t4-2",
            description="2x T4 PCIe on one host bridge, shareable (fractional GPUs)",
            gpu_count=2,
            model="T4",
            gpu_memory_mib=15360,
            topology=_t4_2,
            cpu_milli=32_000,
            memory_mib=128 * 1024,
            shareable=True,
        ),
        Preset(
            name="pcie-2socket-8",
            description="8x L40S PCIe over 2 sockets, 2 GPUs per PCIe switch",
            gpu_count=8,
            model="L40S",
            gpu_memory_mib=46068,
            topology=_pcie_2socket8,
            cpu_milli=128_000,
            memory_mib=1024 * 1024,
        ),
    )
}
