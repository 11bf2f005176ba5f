"""What a workload asks for: devices per member, gang size, priority, tenant.

A request is validated against static rules here (shapes, ranges, MIG profile names); whether
it fits a tenant's quota or the cluster is decided by ``policies.quota`` and
``policies.placement``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from policies import mig
from policies.errors import InvalidRequest
from policies.flavors import MILLI_PER_GPU, Flavor, FlavorKind

MAX_GPUS_PER_MEMBER = 16
MAX_GANG_SIZE = 1024
MAX_PRIORITY = 1_000_000


class TopologyRequirement(StrEnum):
    """How tightly the devices of a request must be connected.

    - ``any``: no constraint;
    - ``same-node``: all gang members on one node (one member is always on one node);
    - ``nvlink``: the GPUs of each member joined by NVLink or NVSwitch;
    - ``same-rack``: all gang members in one rack (or NVLink clique, where nodes carry one).
    """

    ANY = "any"
    SAME_NODE = "same-node"
    NVLINK = "nvlink"
    SAME_RACK = "same-rack"


class WorkloadKind(StrEnum):
    NOTEBOOK = "notebook"
    JOB = "job"
    INFERENCE = "inference"
    RAY = "ray"


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """The devices one gang member needs.

    Exactly one shape applies, chosen by ``kind``:
    - ``None``: CPU only (``count`` 0);
    - ``gpu``: ``count`` whole GPUs of one of ``models`` (any model when empty);
    - ``mig``: one instance of ``mig_profile`` on a GPU of one of ``models``;
    - ``share``: ``milli`` (1..999) of one GPU plus ``gpu_memory_mib`` of its memory.
    """

    kind: FlavorKind | None = None
    count: int = 0
    models: frozenset[str] = frozenset()
    mig_profile: str | None = None
    milli: int = 0
    gpu_memory_mib: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    topology: TopologyRequirement = TopologyRequirement.ANY
    # A request is a dictionary key on every decision (flavor, model and score caches), and
    # hashing its fields calls the enums' Python-level hash each time: computed once.
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        h = self._hash
        if not h:
            fields = (self.kind, self.count, self.models, self.mig_profile, self.milli)
            rest = (self.gpu_memory_mib, self.cpu_milli, self.memory_mib, self.topology)
            h = hash((fields, rest)) or 1
            object.__setattr__(self, "_hash", h)
        return h

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise InvalidRequest(
                "cpu/memory", f"{self.cpu_milli}m/{self.memory_mib}Mi", "values >= 0"
            )
        if self.kind is None:
            if self.count or self.milli or self.mig_profile or self.gpu_memory_mib:
                raise InvalidRequest("request", "CPU-only with GPU fields", "kind gpu/mig/share")
        elif self.kind is FlavorKind.GPU:
            if not 1 <= self.count <= MAX_GPUS_PER_MEMBER:
                raise InvalidRequest(
                    "GPU count", self.count, f"an integer from 1 to {MAX_GPUS_PER_MEMBER}"
                )
            if self.mig_profile or self.milli:
                raise InvalidRequest("request", "whole GPUs with MIG/share fields", "one shape")
        elif self.kind is FlavorKind.MIG:
            if self.mig_profile is None or self.count not in (0, 1):
                raise InvalidRequest(
                    "MIG request",
                    f"profile={self.mig_profile} count={self.count}",
                    "one instance of a named profile",
                )
            if self.milli or self.gpu_memory_mib:
                raise InvalidRequest("request", "a MIG instance with share fields", "one shape")
            if not self.models:
                raise InvalidRequest("MIG request models", "none", "the model(s) of the profile")
            for model in self.models:
                mig.geometry(model).profile(self.mig_profile)
        elif self.kind is FlavorKind.SHARE:
            if not 1 <= self.milli < MILLI_PER_GPU:
                raise InvalidRequest(
                    "GPU share", f"{self.milli} milli-GPU", f"1 to {MILLI_PER_GPU - 1}"
                )
            if self.gpu_memory_mib < 0:
                raise InvalidRequest("GPU memory share", self.gpu_memory_mib, ">= 0 MiB")
            if self.mig_profile is not None or self.count not in (0, 1):
                raise InvalidRequest(
                    "GPU share request",
                    f"profile={self.mig_profile} count={self.count}",
                    "one share of one GPU, without a MIG profile",
                )
        if self.topology is TopologyRequirement.NVLINK and (
            self.kind is not FlavorKind.GPU or self.count < 2
        ):
            raise InvalidRequest("topology", "nvlink", "only with 2 or more whole GPUs per member")

    @property
    def gpus(self) -> int:
        """Physical GPUs touched by one member."""
        if self.kind is FlavorKind.GPU:
            return self.count
        return 0 if self.kind is None else 1

    def flavor(self, model: str) -> Flavor | None:
        """The flavor this request is counted as when placed on ``model``."""
        if self.kind is None:
            return None
        return Flavor(self.kind, model, self.mig_profile)

    def amount(self) -> int:
        """Quota units one member uses: GPUs, instances or milli-GPU."""
        if self.kind is FlavorKind.GPU:
            return self.count
        if self.kind is FlavorKind.MIG:
            return 1
        if self.kind is FlavorKind.SHARE:
            return self.milli
        return 0

    def gpu_equivalent(self, model: str) -> float:
        if self.kind is FlavorKind.GPU:
            return float(self.count)
        if self.kind is FlavorKind.MIG:
            assert self.mig_profile is not None
            return mig.geometry(model).gpu_equivalent(self.mig_profile)
        if self.kind is FlavorKind.SHARE:
            return self.milli / MILLI_PER_GPU
        return 0.0


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """A workload's whole ask: ``gang_size`` members that start all-or-nothing."""

    tenant: str
    owner: str
    name: str
    devices: DeviceRequest
    kind: WorkloadKind = WorkloadKind.NOTEBOOK
    gang_size: int = 1
    priority: int = 0
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    # A hint, not a rule (e.g. the nodes that hold a model's weights): placement tries these
    # nodes first and falls back to any other. Not stored: a restarted portal places anywhere.
    prefer_nodes: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.gang_size <= MAX_GANG_SIZE:
            raise InvalidRequest("gang size", self.gang_size, f"1 to {MAX_GANG_SIZE}")
        if not -MAX_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise InvalidRequest("priority", self.priority, f"{-MAX_PRIORITY} to {MAX_PRIORITY}")
        if not self.name or len(self.name) > 253:
            raise InvalidRequest("workload name", repr(self.name), "1 to 253 characters")
