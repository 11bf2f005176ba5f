"""Who holds which device: the allocator's live allocations, indexed for ingest and alerts.

Every attributed figure traces back to an allocation: a sample is attributed only to workloads
that hold an allocation on its GPU. A whole GPU has one holder; a MIG instance is matched by
its MIG UUID in the inventory layout, else by a process naming one of the GPU's MIG holders,
else by being the GPU's only MIG holder; a shared GPU is split between its share holders by
their processes (``workload_id``, or ``user`` + ``server`` for a local notebook server).
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from policies import mig
from policies.alerts.samples import AllocationContext, ShareKind
from policies.flavors import MILLI_PER_GPU
from policies.inventory import Node
from portal.allocator import Allocator, WorkloadStatus
from portal.store.records import AllocationRecord


@dataclass(frozen=True, slots=True)
class Holder:
    """One workload's allocation on one GPU."""

    workload_id: str
    tenant: str
    owner: str
    name: str
    kind: str
    node: str
    share: ShareKind
    milli: int
    gpu_memory_mib: int
    mig_profile: str | None
    mig_start: int | None
    mig_slices: int = 0
    mig_total_slices: int = 0

    def context(self, domain: str = "") -> AllocationContext:
        """The allocation as the alert rules see it."""
        return AllocationContext(
            workload_id=self.workload_id,
            tenant=self.tenant,
            owner=self.owner,
            share=self.share,
            milli=self.milli if self.share is ShareKind.MILLI else MILLI_PER_GPU,
            mig_slices=self.mig_slices,
            mig_total_slices=self.mig_total_slices,
            memory_mib=self.gpu_memory_mib if self.share is ShareKind.MILLI else 0,
            node=self.node,
            domain=domain,
            name=self.name,
        )


@dataclass(frozen=True, slots=True)
class GpuInfo:
    node: str
    model: str
    memory_mib: int
    # MIG UUID -> (profile, start) of the instances the inventory knows
    mig_instances: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    index: int = -1  # the GPU's index on its node (-1: unknown)

    def label(self) -> str:
        """``node: GPU index``, as the spawn page and My work name a GPU."""
        return f"{self.node}: GPU {self.index}" if self.index >= 0 else self.node


@dataclass(frozen=True, slots=True)
class AllocationIndex:
    """A consistent picture of devices and holders at one moment."""

    gpus: Mapping[str, GpuInfo]
    holders: Mapping[str, tuple[Holder, ...]]
    servers: Mapping[tuple[str, str], str]  # (owner, hub server name) -> workload id

    @classmethod
    def build(
        cls,
        nodes: Iterable[Node],
        workloads: Iterable[WorkloadStatus],
        gpus: Mapping[str, GpuInfo] | None = None,
    ) -> AllocationIndex:
        """From the inventory and the live workloads (with their active allocations);
        ``gpus``: ``gpu_infos(nodes)`` when the caller has it already."""
        if gpus is None:
            gpus = gpu_infos(nodes)
        by_id = {w.id: w for w in workloads}
        # An allocation of a MIG instance the inventory knows by UUID names that instance;
        # samples name its physical GPU (plus the GPU instance), so the holder goes there.
        parent = {m: g for g, info in gpus.items() for m in info.mig_instances}
        holders: dict[str, list[Holder]] = {}
        for w in by_id.values():
            for a in w.allocations:
                for uuid in a.gpu_uuids:
                    gpu = parent.get(uuid, uuid)
                    holders.setdefault(gpu, []).append(_holder(a, w, gpus.get(gpu)))
        servers = {(w.owner, hub_server(w.owner, w.name)): w.id for w in by_id.values()}
        return cls(gpus, {k: tuple(v) for k, v in holders.items()}, servers)

    def holder_for(self, gpu_uuid: str, workload_id: str) -> Holder | None:
        for h in self.holders.get(gpu_uuid, ()):
            if h.workload_id == workload_id:
                return h
        return None

    def workload_of_process(
        self, workload_id: str | None, user: str | None, server: str | None
    ) -> str | None:
        """The workload a process names, directly or as a local server (None: unknown)."""
        if workload_id is not None:
            return workload_id
        if user is not None:
            return self.servers.get((user, server or ""))
        return None


def gpu_infos(nodes: Iterable[Node]) -> dict[str, GpuInfo]:
    """The inventory's GPUs by UUID (GPUs without one cannot be reported on)."""
    gpus: dict[str, GpuInfo] = {}
    for node in nodes:
        for g in node.gpus:
            if g.uuid:
                instances = {i.uuid: (i.profile, i.start) for i in g.mig_layout if i.uuid}
                gpus[g.uuid] = GpuInfo(node.name, g.model, g.memory_mib, instances, g.index)
    return gpus


def hub_server(owner: str, workload_name: str) -> str:
    """The JupyterHub server name of a notebook workload ("" for the default server).

    The spawner names a notebook's workload ``<user>/<server>``, ``<user>/default`` for the
    default server; any other name is taken as the server name itself.
    """
    user, sep, server = workload_name.partition("/")
    if not sep or user != owner:
        return workload_name
    return "" if server == "default" else server


def _holder(a: AllocationRecord, w: WorkloadStatus, gpu: GpuInfo | None) -> Holder:
    share = ShareKind.WHOLE
    slices = total = 0
    if a.mig_profile is not None:
        share = ShareKind.MIG
        if gpu is not None and mig.is_mig_capable(gpu.model):
            geom = mig.geometry(gpu.model)
            profile = geom.profiles.get(a.mig_profile)
            total = geom.compute_slices
            slices = profile.compute_slices if profile is not None else 0
        if not 0 < slices <= total:
            slices, total = 1, 1
    elif 0 < a.milli < MILLI_PER_GPU:
        share = ShareKind.MILLI
    return Holder(
        workload_id=a.workload_id,
        tenant=w.tenant,
        owner=w.owner,
        name=w.name,
        kind=w.kind,
        node=a.node,
        share=share,
        milli=a.milli,
        gpu_memory_mib=a.gpu_memory_mib,
        mig_profile=a.mig_profile,
        mig_start=a.mig_start,
        mig_slices=slices,
        mig_total_slices=total,
    )


class AllocatorIndexSource:
    """An ``AllocationIndex`` of a live allocator, rebuilt at most every ``ttl_s`` seconds.

    Ingest runs per batch, hundreds of times a second on a big cluster; rebuilding per batch
    would cost more than storing the samples. Attribution may therefore lag an allocation
    change by up to ``ttl_s``.
    """

    def __init__(
        self,
        alloc: Allocator,
        *,
        ttl_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._alloc = alloc
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._index: AllocationIndex | None = None
        self._built_at = 0.0
        self._nodes: list[Node] = []
        self._gpus: dict[str, GpuInfo] = {}
        self._workloads: list[WorkloadStatus] = []

    def __call__(self) -> AllocationIndex:
        now = self._clock()
        with self._lock:
            if self._index is None or now - self._built_at >= self._ttl_s:
                nodes = self._alloc.inspect(lambda c: [ns.node for ns in c])
                # The GPU map depends on the inventory alone, which rarely changes: it is
                # rebuilt only when a node object differs (nodes are frozen, so the same
                # objects mean the same inventory).
                same_nodes = len(nodes) == len(self._nodes) and all(
                    map(operator.is_, nodes, self._nodes)
                )
                if not same_nodes:
                    self._gpus = gpu_infos(nodes)
                    self._nodes = nodes
                # The index is a function of the nodes and the workloads: when both are what
                # they were (comparing is far cheaper than building), the last one stands.
                workloads = self._alloc.workloads()
                if self._index is None or not same_nodes or workloads != self._workloads:
                    self._index = AllocationIndex.build(nodes, workloads, self._gpus)
                    self._workloads = workloads
                self._built_at = now
            return self._index

    def invalidate(self) -> None:
        """Rebuild on the next call (after an allocation change the caller knows of)."""
        with self._lock:
            self._index = None
