"""Mutable free-capacity state of the cluster, kept by the allocator and by benchmarks.

``ClusterState`` is the single in-memory truth placement reads. It is changed only through
``apply``/``unapply`` (and node add/remove), which keep per-node aggregates and the model index
current, so a decision never scans more than the nodes that could possibly fit.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from policies import mig
from policies.errors import Conflict, InvalidRequest, NotFound
from policies.flavors import MILLI_PER_GPU
from policies.inventory import Node

# Versions are unique across all nodes and clusters, so a (node, version) pair names one state
# for caches even when a node is removed and added again.
_VERSIONS = itertools.count(1)

# Small numbers for the kinds of node hardware seen (``hardware_kind``), so a node's kind is
# compared as an int; the table grows with distinct kinds, not with nodes.
_KINDS: dict[Hashable, int] = {}


def hardware_kind(node: Node) -> int:
    """One number per kind of node: equal for nodes that differ only in name, GPU and MIG
    UUIDs, labels and place (rack, zone, clique), which no placement score reads."""
    key = (
        tuple((g.model, g.memory_mib, g.mig_enabled, g.shareable) for g in node.gpus),
        node.cpu_milli,
        node.memory_mib,
        node.topology,
        node.taints,
        node.pool,
        node.mig_reconfigurable,
    )
    kind = _KINDS.get(key)
    if kind is None:
        kind = _KINDS[key] = len(_KINDS)
    return kind


@dataclass(frozen=True, slots=True)
class Placement:
    """Concrete devices for one gang member on one node.

    ``milli`` is per GPU (1000 for whole GPUs). For MIG, ``gpus`` holds the parent GPU and
    ``mig_start`` the instance's first memory slice; ``mig_created`` says whether the instance
    was created for this placement (on reconfigurable nodes) rather than taken from the layout.
    """

    node: str
    gpus: tuple[int, ...] = ()
    milli: int = 0
    gpu_memory_mib: int = 0
    mig_profile: str | None = None
    mig_start: int | None = None
    mig_created: bool = False
    cpu_milli: int = 0
    memory_mib: int = 0


class NodeState:
    """Free capacity of one node. Aggregates are kept current by ``ClusterState``."""

    __slots__ = (
        "_free_total",
        "cpu_free",
        "free_mem",
        "free_milli",
        "full_free",
        "hardware",
        "max_free_milli",
        "mem_free",
        "mig_free",
        "mig_layout",
        "model",
        "models",
        "node",
        "order",
        "schedulable",
        "version",
    )

    def __init__(self, node: Node, order: int) -> None:
        self.node = node
        self.order = order
        self.hardware = hardware_kind(node)
        self.model = node.gpus[0].model if node.gpus else ""
        self.models = node.models
        self.cpu_free = node.cpu_milli
        self.mem_free = node.memory_mib
        self.schedulable = node.schedulable
        # Per GPU: free milli and free memory. MIG GPUs are never whole-free or shareable.
        self.free_milli = [0 if g.mig_enabled else MILLI_PER_GPU for g in node.gpus]
        self.free_mem = [g.memory_mib for g in node.gpus]
        # Per MIG GPU: every instance that exists, and which starts are unallocated.
        self.mig_layout: list[list[mig.MigInstance]] = [list(g.mig_layout) for g in node.gpus]
        self.mig_free: list[set[int]] = [{i.start for i in g.mig_layout} for g in node.gpus]
        self.full_free = 0
        self.max_free_milli = 0
        self.version = 0
        self._free_total = 0
        self._refresh()

    def _refresh(self) -> None:
        self.full_free = sum(1 for m in self.free_milli if m == MILLI_PER_GPU)
        shareable = [m for m, g in zip(self.free_milli, self.node.gpus, strict=True) if g.shareable]
        self.max_free_milli = max(shareable, default=0)
        self._free_total = sum(self.free_milli)
        self.version = next(_VERSIONS)

    def renew_version(self) -> None:
        """Mark the node changed for score caches (``ClusterState`` calls this)."""
        self.version = next(_VERSIONS)

    def copy(self) -> NodeState:
        """An independent copy with a new version (for a decision's working copy)."""
        other = NodeState.__new__(NodeState)
        other.node = self.node
        other.order = self.order
        other.hardware = self.hardware
        other.model = self.model
        other.models = self.models
        other.cpu_free = self.cpu_free
        other.mem_free = self.mem_free
        other.schedulable = self.schedulable
        other.free_milli = list(self.free_milli)
        other.free_mem = list(self.free_mem)
        other.mig_layout = [list(x) for x in self.mig_layout]
        other.mig_free = [set(x) for x in self.mig_free]
        other.full_free = self.full_free
        other.max_free_milli = self.max_free_milli
        other._free_total = self._free_total
        other.version = next(_VERSIONS)
        return other

    @property
    def name(self) -> str:
        return self.node.name

    def signature(self) -> Hashable:
        """Everything placement's options and scores read of this node: its hardware kind and
        free capacity (MIG instances by profile and start). Two nodes with equal signatures
        get the same score and the same option, but for the node's name."""
        mig: tuple[object, ...] = ()
        if any(self.mig_layout):
            mig = (
                tuple(tuple((x.profile, x.start) for x in layout) for layout in self.mig_layout),
                tuple(frozenset(f) for f in self.mig_free),
            )
        return (
            self.hardware,
            self.cpu_free,
            self.mem_free,
            tuple(self.free_milli),
            tuple(self.free_mem),
            mig,
        )

    @property
    def gpu_count(self) -> int:
        return len(self.node.gpus)

    @property
    def free_milli_total(self) -> int:
        return self._free_total

    def free_gpus(self) -> list[int]:
        """Indices of fully free (whole-allocatable) GPUs."""
        return [i for i, m in enumerate(self.free_milli) if m == MILLI_PER_GPU]

    def fits_host(self, cpu_milli: int, memory_mib: int) -> bool:
        return self.cpu_free >= cpu_milli and self.mem_free >= memory_mib

    # -- changes (only ClusterState and its working copy, fork.ClusterFork, call these) -----

    def _take(self, p: Placement) -> None:
        if not self.fits_host(p.cpu_milli, p.memory_mib):
            raise Conflict(
                f"node {self.name} has {self.cpu_free}m CPU and {self.mem_free}Mi memory free, "
                f"placement needs {p.cpu_milli}m and {p.memory_mib}Mi"
            )
        if p.mig_profile is not None:
            self._take_mig(p)
        else:
            if len(set(p.gpus)) != len(p.gpus):
                raise InvalidRequest("GPU indices", list(p.gpus), "distinct indices")
            for g in p.gpus:
                self._check_gpu(g)
                if self.free_milli[g] < p.milli or self.free_mem[g] < p.gpu_memory_mib:
                    raise Conflict(
                        f"GPU {g} on {self.name} has {self.free_milli[g]} milli and "
                        f"{self.free_mem[g]} MiB free, placement needs {p.milli} and "
                        f"{p.gpu_memory_mib}"
                    )
            for g in p.gpus:
                self.free_milli[g] -= p.milli
                self.free_mem[g] -= p.gpu_memory_mib
        self.cpu_free -= p.cpu_milli
        self.mem_free -= p.memory_mib
        self._refresh()

    def _take_mig(self, p: Placement) -> None:
        (g,) = p.gpus
        self._check_gpu(g)
        assert p.mig_profile is not None and p.mig_start is not None
        if not self.node.gpus[g].mig_enabled:
            # The GPU is handed out whole or in shares; a MIG instance would double-book it.
            raise Conflict(f"GPU {g} of {self.name} is not MIG-enabled")
        if p.mig_created:
            geom = mig.geometry(self.node.gpus[g].model)
            if p.mig_start not in set(mig.free_starts(geom, p.mig_profile, self.mig_layout[g])):
                raise Conflict(
                    f"MIG {p.mig_profile}@{p.mig_start} does not fit on GPU {g} of {self.name}"
                )
            self.mig_layout[g].append(mig.MigInstance(p.mig_profile, p.mig_start))
        else:
            inst = self._instance(g, p.mig_start)
            if inst is None or inst.profile != p.mig_profile or p.mig_start not in self.mig_free[g]:
                raise Conflict(
                    f"MIG instance {p.mig_profile}@{p.mig_start} on GPU {g} of {self.name} "
                    "is not free"
                )
            self.mig_free[g].discard(p.mig_start)

    def _check_give(self, p: Placement) -> None:
        """Refuse (before any change) to give back what ``p`` does not hold."""
        node = self.node
        if self.cpu_free + p.cpu_milli > node.cpu_milli or (
            self.mem_free + p.memory_mib > node.memory_mib
        ):
            raise Conflict(f"node {self.name} would get back more CPU or memory than it has")
        if p.mig_profile is not None:
            (g,) = p.gpus
            self._check_gpu(g)
            inst = self._instance(g, p.mig_start)
            existing = any(  # by place, not identity: discovered instances carry UUIDs
                i.profile == p.mig_profile and i.start == p.mig_start
                for i in node.gpus[g].mig_layout
            )
            if (
                inst is None
                or inst.profile != p.mig_profile
                or p.mig_start in self.mig_free[g]
                or existing == p.mig_created
            ):
                raise Conflict(
                    f"MIG instance {p.mig_profile}@{p.mig_start} on GPU {g} of {self.name} "
                    "is not held by this placement"
                )
            return
        if len(set(p.gpus)) != len(p.gpus):
            raise InvalidRequest("GPU indices", list(p.gpus), "distinct indices")
        for g in p.gpus:
            self._check_gpu(g)
            if (
                self.free_milli[g] + p.milli > MILLI_PER_GPU
                or self.free_mem[g] + p.gpu_memory_mib > node.gpus[g].memory_mib
            ):
                raise Conflict(f"GPU {g} on {self.name} released more than it held")

    def _give(self, p: Placement) -> None:
        self._check_give(p)
        if p.mig_profile is not None:
            (g,) = p.gpus
            if p.mig_created:
                self.mig_layout[g] = [i for i in self.mig_layout[g] if i.start != p.mig_start]
            else:
                self.mig_free[g].add(p.mig_start)  # type: ignore[arg-type]
        else:
            for g in p.gpus:
                self.free_milli[g] += p.milli
                self.free_mem[g] += p.gpu_memory_mib
        self.cpu_free += p.cpu_milli
        self.mem_free += p.memory_mib
        self._refresh()

    def _instance(self, g: int, start: int | None) -> mig.MigInstance | None:
        for inst in self.mig_layout[g]:
            if inst.start == start:
                return inst
        return None

    def _check_gpu(self, g: int) -> None:
        if not 0 <= g < self.gpu_count:
            raise InvalidRequest("GPU index", g, f"0..{self.gpu_count - 1} on {self.name}")


class ClusterState:
    """All nodes' free capacity, indexed by GPU model.

    Node order (``NodeState.order``) is the deterministic tie-break: among equally scored
    candidates the lowest order wins.

    Every change appends the node's name to a change log (``seq``/``changed_since``), so score
    caches re-evaluate only the nodes that changed since they last looked.
    """

    def __init__(self, nodes: Iterable[Node] = ()) -> None:
        self._nodes: dict[str, NodeState] = {}
        self.by_model: dict[str, dict[str, NodeState]] = {}
        self._next_order = 0
        self._log: list[str] = []
        self._log_start = 0
        for n in nodes:
            self.add_node(n)

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def nodes(self) -> Mapping[str, NodeState]:
        """Every node's state by name (read only: change it through the methods below)."""
        return self._nodes

    @property
    def next_order(self) -> int:
        """The order a node added without one gets."""
        return self._next_order

    @property
    def root(self) -> ClusterState:
        """The state a working copy was forked from (``fork.ClusterFork``); itself here."""
        return self

    def __iter__(self) -> Iterator[NodeState]:
        return iter(self.nodes.values())

    def node(self, name: str) -> NodeState:
        try:
            return self.nodes[name]
        except KeyError:
            raise NotFound("node", name) from None

    def add_node(self, node: Node, order: int | None = None) -> NodeState:
        st = self._new_node_state(node, order)
        self._nodes[node.name] = st
        for model in node.models or {""}:
            self.by_model.setdefault(model, {})[node.name] = st
        self._changed(node.name)
        return st

    def _new_node_state(self, node: Node, order: int | None) -> NodeState:
        """A new node's state at ``order`` (default: after every node so far)."""
        if node.name in self.nodes:
            raise Conflict(f"node {node.name} is already in the inventory")
        if order is None:
            order = self._next_order
        self._next_order = max(self._next_order, order + 1)
        return NodeState(node, order)

    def remove_node(self, name: str) -> NodeState:
        st = self.node(name)
        del self._nodes[name]
        for model in st.node.models or {""}:
            self.by_model.get(model, {}).pop(name, None)
        self._changed(name)
        return st

    def set_schedulable(self, name: str, schedulable: bool) -> None:
        st = self.node(name)
        st.schedulable = schedulable
        st.renew_version()
        self._changed(name)

    # -- change log ----------------------------------------------------------------------

    @property
    def seq(self) -> int:
        """Sequence number of the next change; compare with ``changed_since``."""
        return self._log_start + len(self._log)

    def changed_since(self, seq: int) -> list[str] | None:
        """Names of nodes changed since ``seq`` (repeats possible), or None if forgotten."""
        if seq < self._log_start:
            return None
        return self._log[seq - self._log_start :]

    def _changed(self, name: str) -> None:
        self._log.append(name)
        # Keep the log bounded: readers that fell further behind rebuild from scratch.
        if len(self._log) > max(4096, 8 * len(self.nodes)):
            drop = len(self._log) // 2
            del self._log[:drop]
            self._log_start += drop

    def candidates(self, models: frozenset[str]) -> Iterable[NodeState]:
        """Nodes carrying one of ``models`` (all nodes when empty), in no particular order."""
        if not models:
            return self.nodes.values()
        if len(models) == 1:
            (m,) = models
            return self.by_model.get(m, {}).values()
        # A node carrying two of the models is one candidate, not two.
        return list(
            {st.name: st for m in models for st in self.by_model.get(m, {}).values()}.values()
        )

    def apply(self, p: Placement) -> None:
        """Take the devices of ``p``; raises ``Conflict`` (and changes nothing) if not free."""
        self.node(p.node)._take(p)
        self._changed(p.node)

    def unapply(self, p: Placement) -> None:
        """Give back the devices of ``p``."""
        self.node(p.node)._give(p)
        self._changed(p.node)
