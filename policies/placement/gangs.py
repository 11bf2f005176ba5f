"""place_gang(): all members or none.

It tries one topology domain (rack or NVLink clique, one node, or the whole cluster) at a
time, placing member after member with ``pipeline.place`` on the given state and undoing the
partial work before the next domain. For ``same-rack``, which racks could hold every member
comes from a per-request-shape room index that follows the cluster's change log like the
score indexes do, so a gang reads only the nodes changed since the last one instead of
every node of the cluster (10,000 nodes at 80,000 GPUs).
"""

from __future__ import annotations

from collections.abc import Iterator

from policies.flavors import FlavorKind
from policies.placement.framework import PlacementContext, Policy, Unfit
from policies.placement.pipeline import (
    ANYWHERE,
    MAX_INDEXES,
    Follower,
    NoFit,
    changes_for,
    place,
    synced,
    unfit,
)
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest, TopologyRequirement


class _Rooms(Follower):
    """Per domain (a node's clique, else its rack) of one request shape: its nodes, how many
    of them fit one member, and — for whole GPUs — how many members their free GPUs could
    take at most. A domain can hold ``m`` members when that bound (whole GPUs) or its fitting
    node count times ``m`` (other shapes: at least one member per fitting node) reaches ``m``.
    """

    __slots__ = ("fits", "groups", "keys", "node", "order", "whole")

    def __init__(self, cluster: ClusterState) -> None:
        super().__init__(cluster)
        self.keys: dict[str, str] = {}  # node -> domain
        self.groups: dict[str, set[str]] = {}
        self.node: dict[str, tuple[int, int]] = {}  # node -> (fits, members its GPUs take)
        self.fits: dict[str, int] = {}
        self.whole: dict[str, int] = {}
        self.order: list[str] | None = None  # domains, smallest first (None: re-sort)

    def read(self, req: DeviceRequest, st: NodeState, ctx: PlacementContext) -> None:
        name = st.node.name
        self.forget(name)
        key = st.node.clique or st.node.rack
        if not key:
            return
        self.keys[name] = key
        self.groups.setdefault(key, set()).add(name)
        self.order = None
        fits = unfit(req, st, ctx) is None
        members = st.full_free // req.count if fits and _whole(req) else 0
        self.node[name] = (int(fits), members)
        self.fits[key] = self.fits.get(key, 0) + int(fits)
        self.whole[key] = self.whole.get(key, 0) + members

    def forget(self, name: str) -> None:
        key = self.keys.pop(name, None)
        if key is None:
            return
        fits, members = self.node.pop(name)
        self.fits[key] -= fits
        self.whole[key] -= members
        group = self.groups[key]
        group.discard(name)
        if not group:
            del self.groups[key], self.fits[key], self.whole[key]
        self.order = None

    def holding(self, req: DeviceRequest, members: int) -> list[str]:
        """The domains that could hold ``members``, smallest first (best fit keeps the big
        ones for big gangs), ties by their first node's name."""
        if self.order is None:
            groups = self.groups
            self.order = sorted(groups, key=lambda k: (len(groups[k]), min(groups[k])))
        if _whole(req):
            return [k for k in self.order if self.whole[k] >= members]
        return [k for k in self.order if self.fits[k] > 0]


def _whole(req: DeviceRequest) -> bool:
    return req.kind is FlavorKind.GPU and req.count > 0


def _rooms(
    req: DeviceRequest, cluster: ClusterState, policy: Policy, ctx: PlacementContext
) -> _Rooms:
    root = cluster.root
    key = ("rooms", id(root), req, ctx.pools, ctx.tolerations)
    idx = policy.indexes.get(key)
    changed = None if idx is None else changes_for(idx, cluster, root)
    if idx is None or changed is None:
        idx = _Rooms(root)
        for st in cluster.candidates(req.models):
            idx.read(req, st, ctx)
        policy.indexes[key] = idx
        if len(policy.indexes) > MAX_INDEXES:
            policy.indexes.popitem(last=False)
    else:
        policy.indexes.move_to_end(key)
        nodes, models = cluster.nodes, req.models
        for name in changed:
            now = nodes.get(name)
            if now is None or (models and not (now.models & models)):
                idx.forget(name)
            else:
                idx.read(req, now, ctx)
    synced(idx, cluster, root)
    return idx


def domains(
    cluster: ClusterState,
    req: DeviceRequest,
    topo: TopologyRequirement,
    members: int,
    ctx: PlacementContext,
    policy: Policy,
) -> Iterator[frozenset[str] | None]:
    """The domains a gang tries, in order (None: the whole cluster)."""
    if topo is TopologyRequirement.SAME_RACK:
        rooms = _rooms(req, cluster, policy, ctx)
        for key in rooms.holding(req, members):
            yield frozenset(rooms.groups[key])
        return
    if topo is TopologyRequirement.SAME_NODE:
        for st in sorted(cluster.candidates(req.models), key=lambda s: s.order):
            yield frozenset({st.node.name})
        return
    yield None


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
    for domain in domains(cluster, req, topology, members, ctx, policy):
        # Keep the caller's restriction: a domain narrows it, it never widens it.
        only = ctx.only if domain is None else domain if ctx.only is None else domain & ctx.only
        sub = PlacementContext(ctx.pools, ctx.tolerations, only, ctx.avoid, ctx.prefer)
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
