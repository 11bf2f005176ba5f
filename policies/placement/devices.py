"""Which devices a request would take on one node: the candidate options placement scores.

- whole GPUs: the fully free GPUs whose weakest link is best; among those, the set that leaves
  the remaining free GPUs best connected to each other (take a chunk apart from what stays);
- a fractional share: every shareable GPU with enough free milli and memory (one per distinct
  free state, lowest index first), so scorers can choose best-fit or fragmentation-aware;
- a MIG instance: a free existing instance of the profile (one per GPU state), or, on
  reconfigurable nodes, each valid start slot where a new instance fits.
"""

from __future__ import annotations

from policies import mig
from policies.flavors import MILLI_PER_GPU, FlavorKind
from policies.placement.state import NodeState, Placement
from policies.requests import DeviceRequest, TopologyRequirement
from policies.topology import LinkClass, Topology


def options(req: DeviceRequest, st: NodeState) -> list[Placement]:
    """Candidate placements of one member of ``req`` on ``st`` (host capacity already checked)."""
    if req.kind is None:
        return [Placement(st.name, cpu_milli=req.cpu_milli, memory_mib=req.memory_mib)]
    if req.kind is FlavorKind.GPU:
        chosen = choose_whole(req, st)
        if chosen is None:
            return []
        return [
            Placement(
                st.name,
                gpus=chosen,
                milli=MILLI_PER_GPU,
                cpu_milli=req.cpu_milli,
                memory_mib=req.memory_mib,
            )
        ]
    if req.kind is FlavorKind.SHARE:
        return _share_options(req, st)
    return _mig_options(req, st)


def _allowed(req: DeviceRequest, model: str) -> bool:
    return not req.models or model in req.models


def choose_whole(req: DeviceRequest, st: NodeState) -> tuple[int, ...] | None:
    """The GPU indices for ``req.count`` whole GPUs on ``st``, or None if they don't fit."""
    gpus = st.node.gpus
    free = [i for i in st.free_gpus() if _allowed(req, gpus[i].model)]
    k = req.count
    if len(free) < k:
        return None
    need_nvlink = req.topology is TopologyRequirement.NVLINK
    if st.node.topology is None and not need_nvlink:
        # Unknown topology means uniform links: every set is as good; take the lowest indices.
        return tuple(free[:k])
    if k == 1:
        # A single GPU: take the one least connected to the other free GPUs, so the
        # well-connected groups stay whole for multi-GPU requests later.
        known = st.node.topology
        if known is None or len(free) == 1:
            return (free[0],)
        # Then the NUMA node with the fewest free GPUs (on NVSwitch boards, where every link
        # is alike, this keeps the other socket's GPUs together).
        per_numa: dict[int, int] = {}
        for g in free:
            per_numa[known.numa[g]] = per_numa.get(known.numa[g], 0) + 1
        best = min(free, key=lambda g: (_ties(known, g, free), per_numa[known.numa[g]], g))
        return (best,)
    topo = st.node.link_topology
    chosen = _best_set(topo, free, k)
    if need_nvlink and topo.worst_link(chosen) < LinkClass.NVLINK:
        return None
    return chosen


def _ties(topo: Topology, g: int, free: list[int]) -> tuple[int, ...]:
    """How strongly ``g`` is tied to the other free GPUs (compared lexicographically)."""
    links = sorted((topo.links[g][o] for o in free if o != g), reverse=True)
    return tuple(links)


def _best_set(topo: Topology, free: list[int], k: int) -> tuple[int, ...]:
    """Greedy per seed: grow a set by the free GPU with the best weakest link to it.

    Key: best weakest link inside the set, then the weakest coupling to the GPUs left free
    (so the remainder stays a connected group), then lowest indices.
    """
    if len(free) == k:
        return tuple(free)
    if topo.uniform_link is not None:
        # Every GPU pair is linked alike (an NVSwitch board): keep the set on one NUMA node
        # (CPU affinity), in the fullest node that fits it (best fit), lowest indices.
        by_numa: dict[int, list[int]] = {}
        for g in free:
            by_numa.setdefault(topo.numa[g], []).append(g)
        fitting = [gs for gs in by_numa.values() if len(gs) >= k]
        if fitting:
            return tuple(min(fitting, key=lambda gs: (len(gs), gs[0]))[:k])
        return tuple(free[:k])
    best_key: tuple[int, int, tuple[int, ...]] | None = None
    best: tuple[int, ...] = ()
    links = topo.links
    for seed in free:
        chosen = [seed]
        rest = [g for g in free if g != seed]
        while len(chosen) < k:
            nxt = max(rest, key=lambda g: (min(links[g][c] for c in chosen), -g))
            chosen.append(nxt)
            rest.remove(nxt)
        inner = topo.worst_link(chosen)
        coupling = sum(max(links[r][c] for c in chosen) for r in rest)
        ordered = tuple(sorted(chosen))
        key = (-int(inner), coupling, ordered)
        if best_key is None or key < best_key:
            best_key, best = key, ordered
    return best


def _share_options(req: DeviceRequest, st: NodeState) -> list[Placement]:
    out: list[Placement] = []
    seen: set[tuple[int, int]] = set()
    for i, g in enumerate(st.node.gpus):
        if not g.shareable or not _allowed(req, g.model):
            continue
        fm, mem = st.free_milli[i], st.free_mem[i]
        if fm < req.milli or mem < req.gpu_memory_mib or (fm, mem) in seen:
            continue
        seen.add((fm, mem))
        out.append(
            Placement(
                st.name,
                gpus=(i,),
                milli=req.milli,
                gpu_memory_mib=req.gpu_memory_mib,
                cpu_milli=req.cpu_milli,
                memory_mib=req.memory_mib,
            )
        )
    return out


def _mig_options(req: DeviceRequest, st: NodeState) -> list[Placement]:
    assert req.mig_profile is not None
    out: list[Placement] = []
    seen: set[tuple[object, ...]] = set()
    for i, g in enumerate(st.node.gpus):
        if not g.mig_enabled or not _allowed(req, g.model):
            continue
        layout = st.mig_layout[i]
        state_key = (
            g.model,
            tuple(sorted((x.profile, x.start) for x in layout)),
            frozenset(st.mig_free[i]),
        )
        if state_key in seen:
            continue
        seen.add(state_key)
        for inst in sorted(layout, key=lambda x: x.start):
            if inst.profile == req.mig_profile and inst.start in st.mig_free[i]:
                out.append(_mig(req, st, i, inst.start, created=False))
                break
        if st.node.mig_reconfigurable:
            geom = mig.geometry(g.model)
            for start in mig.free_starts(geom, req.mig_profile, layout):
                out.append(_mig(req, st, i, start, created=True))
    return out


def _mig(req: DeviceRequest, st: NodeState, gpu: int, start: int, *, created: bool) -> Placement:
    return Placement(
        st.name,
        gpus=(gpu,),
        mig_profile=req.mig_profile,
        mig_start=start,
        mig_created=created,
        cpu_milli=req.cpu_milli,
        memory_mib=req.memory_mib,
    )
