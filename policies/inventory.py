"""The inventory: nodes, their GPUs, MIG layouts and topology, as immutable values.

Sources (Kubernetes Nodes, NVML, a simulated YAML inventory) produce these; the allocator turns
them into mutable placement state (``policies.placement.state``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from policies import mig
from policies.errors import InvalidRequest
from policies.topology import LinkClass, Topology

# Kubernetes object names: DNS-1123 subdomain.
_NODE_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: TaintEffect = TaintEffect.NO_SCHEDULE


@dataclass(frozen=True, slots=True)
class GPU:
    """One physical GPU.

    ``mig_enabled`` GPUs are handed out only as MIG instances; ``mig_layout`` lists the instances
    that exist now. ``shareable`` GPUs may be split into fractional shares (milli-GPU + memory).
    A GPU is never both MIG-enabled and shareable.
    """

    index: int
    model: str
    memory_mib: int
    uuid: str = ""
    mig_enabled: bool = False
    mig_layout: tuple[mig.MigInstance, ...] = ()
    shareable: bool = False

    def __post_init__(self) -> None:
        if self.index < 0:
            raise InvalidRequest("GPU index", self.index, "an integer >= 0")
        if self.memory_mib <= 0:
            raise InvalidRequest("GPU memory_mib", self.memory_mib, "a positive number of MiB")
        if self.mig_enabled and self.shareable:
            raise InvalidRequest(
                "GPU", f"{self.model}#{self.index}", "either MIG-enabled or shareable, not both"
            )
        if self.mig_enabled:
            mig.validate_layout(mig.geometry(self.model), self.mig_layout)
        elif self.mig_layout:
            raise InvalidRequest(
                "GPU", f"{self.model}#{self.index}", "no MIG layout unless MIG is enabled"
            )


@dataclass(frozen=True, slots=True)
class Node:
    """A machine with GPUs. ``pool`` restricts it to tenants that list that pool."""

    name: str
    gpus: tuple[GPU, ...]
    cpu_milli: int
    memory_mib: int
    topology: Topology | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    rack: str = ""
    zone: str = ""
    clique: str = ""
    pool: str = ""
    schedulable: bool = True
    mig_reconfigurable: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NODE_NAME_RE.fullmatch(self.name):
            raise InvalidRequest(
                "node name",
                repr(self.name),
                "a DNS-1123 name (lowercase letters, digits, '-', '.')",
            )
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise InvalidRequest(
                "node capacity", f"cpu {self.cpu_milli}m, memory {self.memory_mib}Mi", ">= 0"
            )
        if [g.index for g in self.gpus] != list(range(len(self.gpus))):
            raise InvalidRequest(
                "GPU indices", [g.index for g in self.gpus], f"0..{len(self.gpus) - 1} in order"
            )
        if self.topology is not None and self.topology.size != len(self.gpus):
            raise InvalidRequest(
                "topology", f"{self.topology.size} GPUs", f"{len(self.gpus)} GPUs on {self.name}"
            )

    @property
    def models(self) -> frozenset[str]:
        return frozenset(g.model for g in self.gpus)

    @property
    def link_topology(self) -> Topology:
        """The declared topology, or plain PCIe on one NUMA node when none is known."""
        if self.topology is not None:
            return self.topology
        return Topology.uniform(len(self.gpus), LinkClass.SAME_NUMA)
