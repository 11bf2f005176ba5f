"""place(): filter the candidate nodes, list device options, score, pick the best.

place_gang(): all members or none — tries one topology domain (rack or NVLink clique, or the
whole cluster) at a time on the live state and undoes partial work before trying the next.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from policies.flavors import FlavorKind
from policies.inventory import TaintEffect
from policies.placement import devices
from policies.placement.framework import PlacementContext, Policy, Unfit
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest, TopologyRequirement


@dataclass(frozen=True, slots=True)
class NoFit:
    """Nothing fits now. ``topology`` is true when capacity exists but not connected as asked."""

    nodes_considered: int
    reasons: dict[Unfit, int] = field(default_factory=dict)

    @property
    def topology(self) -> bool:
        return bool(self.reasons) and max(self.reasons, key=self.reasons.__getitem__) in (
            Unfit.TOPOLOGY,
            Unfit.RACK,
        )

    def summary(self) -> str:
        if not self.nodes_considered:
            return "no node has an allowed GPU model"
        parts = [f"{n} {r.value}" for r, n in sorted(self.reasons.items(), key=lambda x: -x[1])]
        return f"0 of {self.nodes_considered} nodes fit: " + "; ".join(parts)


ANYWHERE = PlacementContext()


def unfit(req: DeviceRequest, st: NodeState, ctx: PlacementContext) -> Unfit | None:
    """The first reason ``st`` cannot take one member of ``req``, from aggregates only."""
    node = st.node
    if not st.schedulable:
        return Unfit.UNSCHEDULABLE
    if node.pool and node.pool not in ctx.pools:
        return Unfit.POOL
    for t in node.taints:
        if t.effect is not TaintEffect.PREFER_NO_SCHEDULE and t.key not in ctx.tolerations:
            return Unfit.TAINT
    if st.cpu_free < req.cpu_milli:
        return Unfit.CPU
    if st.mem_free < req.memory_mib:
        return Unfit.MEMORY
    kind = req.kind
    if kind is FlavorKind.GPU and st.full_free < req.count:
        return Unfit.GPUS
    if kind is FlavorKind.SHARE and st.max_free_milli < req.milli:
        return Unfit.SHARE
    return None


def _no_option_reason(req: DeviceRequest) -> Unfit:
    if req.kind is FlavorKind.GPU:
        return Unfit.TOPOLOGY if req.topology is TopologyRequirement.NVLINK else Unfit.GPUS
    if req.kind is FlavorKind.MIG:
        return Unfit.MIG
    if req.kind is FlavorKind.SHARE:
        return Unfit.SHARE
    return Unfit.MODEL


def place(
    req: DeviceRequest,
    cluster: ClusterState,
    policy: Policy,
    ctx: PlacementContext = ANYWHERE,
) -> Placement | NoFit:
    """Best placement of one member of ``req``, or why none exists. Does not change state."""
    best: Placement | None = None
    best_key: tuple[float, int] = (float("-inf"), 0)
    reasons: Counter[Unfit] = Counter()
    considered = 0
    only, avoid = ctx.only, ctx.avoid
    for st in cluster.candidates(req.models):
        name = st.node.name
        if (only is not None and name not in only) or name in avoid:
            continue
        considered += 1
        why = unfit(req, st, ctx)
        if why is not None:
            reasons[why] += 1
            continue
        opts = devices.options(req, st)
        if not opts:
            reasons[_no_option_reason(req)] += 1
            continue
        for opt in opts:
            key = (policy.score(req, st, opt, cluster), -st.order)
            if best is None or key > best_key:
                best, best_key = opt, key
    if best is None:
        return NoFit(considered, dict(reasons))
    return best


def _domains(
    cluster: ClusterState, req: DeviceRequest, topo: TopologyRequirement
) -> list[frozenset[str] | None]:
    if topo is TopologyRequirement.SAME_RACK:
        groups: dict[str, set[str]] = {}
        for st in cluster.candidates(req.models):
            key = st.node.clique or st.node.rack
            if key:
                groups.setdefault(key, set()).add(st.node.name)
        # Smallest sufficient domain first keeps the big ones for big gangs (best fit).
        return [frozenset(g) for g in sorted(groups.values(), key=lambda g: (len(g), min(g)))]
    if topo is TopologyRequirement.SAME_NODE:
        return [
            frozenset({st.node.name})
            for st in sorted(cluster.candidates(req.models), key=lambda s: s.order)
        ]
    return [None]


def place_gang(
    req: DeviceRequest,
    members: int,
    cluster: ClusterState,
    policy: Policy,
    ctx: PlacementContext = ANYWHERE,
    topology: TopologyRequirement = TopologyRequirement.ANY,
) -> list[Placement] | NoFit:
    """Place ``members`` copies of ``req`` all-or-nothing. The state is unchanged on return.

    ``same-node`` puts every member on one node; ``same-rack`` in one rack/clique.
    """
    last: NoFit = NoFit(0, {})
    for domain in _domains(cluster, req, topology):
        # Keep the caller's restriction: a domain narrows it, it never widens it.
        only = ctx.only if domain is None else domain if ctx.only is None else domain & ctx.only
        sub = PlacementContext(ctx.pools, ctx.tolerations, only, ctx.avoid)
        placed: list[Placement] = []
        try:
            for _ in range(members):
                got = place(req, cluster, policy, sub)
                if isinstance(got, NoFit):
                    last = got
                    break
                placed.append(got)
                cluster.apply(got)
        finally:
            for p in reversed(placed):
                cluster.unapply(p)
        if len(placed) == members:
            return placed
    if topology in (TopologyRequirement.SAME_RACK, TopologyRequirement.SAME_NODE) and members > 1:
        reasons = dict(last.reasons)
        reasons[Unfit.RACK] = reasons.get(Unfit.RACK, 0) + 1
        return NoFit(last.nodes_considered, reasons)
    return last
