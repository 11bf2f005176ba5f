"""Intra-node GPU topology: how well each pair of GPUs is connected.

Link classes are ordered best first by their integer value being *higher*; they mirror what
``nvidia-smi topo -m`` reports (NV#, PIX, PXB, PHB, NODE, SYS).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from policies.errors import InvalidRequest


class LinkClass(IntEnum):
    """Connection between two GPUs of one node; a higher value is a better link."""

    CROSS_SOCKET = 1  # SYS: traverses the inter-socket link (QPI/UPI/Infinity Fabric)
    SAME_NUMA = 2  # NODE: same NUMA node, different host bridges
    SAME_HOST_BRIDGE = 3  # PHB: same PCIe host bridge
    SAME_PCIE_SWITCH = 4  # PIX/PXB: behind the same PCIe switch(es)
    NVLINK = 5  # NV#: direct NVLink (bridge or mesh), lanes counted separately
    NVSWITCH = 6  # every GPU reaches every other through NVSwitch at full bandwidth

    @property
    def label(self) -> str:
        return _LABELS[self]

    @classmethod
    def parse(cls, text: str) -> LinkClass:
        try:
            return cls[text.upper().replace("-", "_")]
        except KeyError:
            raise InvalidRequest(
                "link class", text, ", ".join(m.name.lower() for m in cls)
            ) from None


_LABELS = {
    LinkClass.CROSS_SOCKET: "cross-socket",
    LinkClass.SAME_NUMA: "same NUMA node",
    LinkClass.SAME_HOST_BRIDGE: "same host bridge",
    LinkClass.SAME_PCIE_SWITCH: "same PCIe switch",
    LinkClass.NVLINK: "NVLink",
    LinkClass.NVSWITCH: "NVSwitch",
}


@dataclass(frozen=True, slots=True)
class Topology:
    """Link class for every GPU pair of a node, NVLink lane counts, and each GPU's NUMA node.

    ``links[i][j]`` is the class between GPU ``i`` and ``j`` (the diagonal is ignored).
    ``nvlink_lanes[i][j]`` counts NVLink lanes between them (0 when not NVLink-connected).
    """

    links: tuple[tuple[LinkClass, ...], ...]
    numa: tuple[int, ...]
    nvlink_lanes: tuple[tuple[int, ...], ...] = ()
    # The one class joining every pair, when all pairs are alike (an NVSwitch board): device
    # choice then needs no search. Derived, not compared.
    uniform_link: LinkClass | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.numa)
        classes = {self.links[i][j] for i in range(len(self.links)) for j in range(i)}
        object.__setattr__(self, "uniform_link", classes.pop() if len(classes) == 1 else None)
        if len(self.links) != n or any(len(row) != n for row in self.links):
            raise InvalidRequest("topology", f"{len(self.links)} rows", f"an {n}x{n} link matrix")
        for i in range(n):
            for j in range(n):
                if i != j and self.links[i][j] != self.links[j][i]:
                    raise InvalidRequest(
                        "topology", f"links[{i}][{j}] != links[{j}][{i}]", "a symmetric matrix"
                    )
        lanes = self.nvlink_lanes
        if lanes:
            if len(lanes) != n or any(len(row) != n for row in lanes):
                raise InvalidRequest(
                    "topology nvlink_lanes", f"{len(lanes)} rows", f"an {n}x{n} matrix or none"
                )
            for i in range(n):
                for j in range(i + 1, n):
                    if lanes[i][j] != lanes[j][i] or lanes[i][j] < 0:
                        raise InvalidRequest(
                            "topology nvlink_lanes",
                            f"[{i}][{j}]={lanes[i][j]}, [{j}][{i}]={lanes[j][i]}",
                            "a symmetric matrix of lane counts >= 0",
                        )

    @property
    def size(self) -> int:
        return len(self.numa)

    def link(self, i: int, j: int) -> LinkClass:
        return self.links[i][j]

    def worst_link(self, gpus: Sequence[int]) -> LinkClass:
        """The weakest link inside a set of GPUs (NVSWITCH for a single GPU)."""
        worst = LinkClass.NVSWITCH
        for a in range(len(gpus)):
            row = self.links[gpus[a]]
            for b in range(a + 1, len(gpus)):
                c = row[gpus[b]]
                if c < worst:
                    worst = c
        return worst

    @classmethod
    def uniform(cls, n: int, link: LinkClass, numa: Sequence[int] | None = None) -> Topology:
        """All pairs joined by the same class (e.g. an NVSwitch HGX board)."""
        numa_t = tuple(numa) if numa is not None else (0,) * n
        links = tuple(tuple(link for _ in range(n)) for _ in range(n))
        return cls(links=links, numa=numa_t)

    @classmethod
    def from_numa(cls, numa: Sequence[int]) -> Topology:
        """Plain PCIe: same NUMA node or cross-socket, nothing better known."""
        n = len(numa)
        links = tuple(
            tuple(
                LinkClass.SAME_NUMA if numa[i] == numa[j] else LinkClass.CROSS_SOCKET
                for j in range(n)
            )
            for i in range(n)
        )
        return cls(links=links, numa=tuple(numa))
