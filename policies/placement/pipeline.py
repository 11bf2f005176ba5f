"""place(): filter the candidate nodes, list device options, score, pick the best.

Score indexes per request shape follow the cluster's change log (``Follower``,
``changes_for``, ``synced``); ``gangs`` places all-or-nothing groups on top of ``place``.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field, replace

from policies.flavors import FlavorKind
from policies.inventory import TaintEffect
from policies.placement.fork import ClusterFork
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
    """Best placement of one member of ``req``, or why none exists. Does not change state.

    Ties go to the node first in the cluster's order. When the policy's scores can be cached
    (``Policy.cache_token``) and the context names no node lists, the answer comes from a
    per-request-shape index that re-scores only the nodes changed since its last use.
    ``ctx.prefer``: the best of those nodes that fits, else the best of all.
    """
    if ctx.prefer:
        rest = replace(ctx, prefer=frozenset())
        only = ctx.prefer if ctx.only is None else ctx.prefer & ctx.only
        got = _scan(req, cluster, policy, replace(rest, only=only)) if only else None
        if isinstance(got, Placement):
            return got
        ctx = rest
    if ctx.only is None:
        token = policy.cache_token()
        if token is not None:
            return _indexed(req, cluster, policy, ctx, token)
    return _scan(req, cluster, policy, ctx)


def _scan(
    req: DeviceRequest, cluster: ClusterState, policy: Policy, ctx: PlacementContext
) -> Placement | NoFit:
    best: Placement | None = None
    best_key: tuple[float, int] = (float("-inf"), 0)
    reasons: Counter[Unfit] = Counter()
    considered = 0
    only, avoid = ctx.only, ctx.avoid
    for st in _candidates(req, cluster, only):
        name = st.node.name
        if (only is not None and name not in only) or name in avoid:
            continue
        considered += 1
        why = unfit(req, st, ctx)
        if why is not None:
            reasons[why] += 1
            continue
        got = policy.best_on_node(req, st, cluster)
        if got is None:
            reasons[_no_option_reason(req)] += 1
            continue
        key = (got[0], -st.order)
        if best is None or key > best_key:
            best, best_key = got[1], key
    if best is None:
        return NoFit(considered, dict(reasons))
    return best


def _candidates(
    req: DeviceRequest, cluster: ClusterState, only: frozenset[str] | None
) -> Iterable[NodeState]:
    """The nodes to look at: a small ``only`` list (a rack, one node) directly, else the
    model index."""
    if only is not None and len(only) < 64:
        found = (cluster.nodes.get(name) for name in sorted(only))
        return [
            st for st in found if st is not None and (not req.models or st.node.models & req.models)
        ]
    return cluster.candidates(req.models)


# How many request shapes a policy keeps score indexes for (least recently used dropped).
MAX_INDEXES = 512
# How many node signatures one index remembers answers for before it starts afresh.
MAX_MEMO = 4096


class Follower:
    """An index that follows a root ``ClusterState``'s change log (``seq``). When it was last
    used on a working copy (``fork.ClusterFork``), ``dirty`` holds the nodes it read from the
    copy, and ``fork``/``fork_seq`` how far it followed that copy: those nodes are read again
    before the index answers for anything else. ``changes_for`` says what to re-read,
    ``synced`` records that it was."""

    __slots__ = ("cluster", "dirty", "fork", "fork_seq", "seq")

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.seq = cluster.seq
        self.dirty: frozenset[str] = frozenset()
        self.fork = 0
        self.fork_seq = 0


class _Index(Follower):
    """Best-first heap of (−score, order, version, node, option) for one request shape.

    ``live`` maps a node to the version its heap entry was scored at (None: it does not fit);
    entries whose version is no longer live are dropped lazily when they reach the top.
    """

    __slots__ = ("counts", "heap", "live", "memo", "why")

    def __init__(self, cluster: ClusterState) -> None:
        super().__init__(cluster)
        self.heap: list[tuple[float, int, int, str, Placement]] = []
        self.live: dict[str, int | None] = {}
        # Why each node that does not fit does not, and the totals: "nothing fits" answers
        # come from here instead of a scan of every node.
        self.why: dict[str, Unfit] = {}
        self.counts: Counter[Unfit] = Counter()
        # The policy's answer per node signature (``NodeState.signature``): for one request
        # shape and cache token it depends on nothing else, so nodes of one kind in the same
        # state (and a node back in an earlier state) are scored once, not once each. Most
        # of an index's work is the full build after the policy learned (a new token).
        self.memo: dict[Hashable, tuple[float, Placement] | None] = {}

    def set_why(self, name: str, reason: Unfit | None) -> None:
        old = self.why.pop(name, None)
        if old is not None:
            self.counts[old] -= 1
            if not self.counts[old]:
                del self.counts[old]
        if reason is not None:
            self.why[name] = reason
            self.counts[reason] += 1


def changes_for(idx: Follower, cluster: ClusterState, root: ClusterState) -> set[str] | None:
    """Nodes to re-score before ``idx`` answers for ``cluster`` (None: rebuild it)."""
    if idx.cluster is not root:
        return None
    changed = root.changed_since(idx.seq)
    if changed is None:
        return None
    names = set(changed)
    if cluster is root:
        return names | idx.dirty
    assert isinstance(cluster, ClusterFork)
    if idx.fork == cluster.token:
        return names | set(cluster.fork_log[idx.fork_seq :])
    return names | idx.dirty | cluster.touched


def synced(idx: Follower, cluster: ClusterState, root: ClusterState) -> None:
    idx.seq = root.seq
    if cluster is root:
        idx.dirty, idx.fork, idx.fork_seq = frozenset(), 0, 0
    else:
        assert isinstance(cluster, ClusterFork)
        idx.dirty = cluster.touched
        idx.fork, idx.fork_seq = cluster.token, len(cluster.fork_log)


def _indexed(
    req: DeviceRequest,
    cluster: ClusterState,
    policy: Policy,
    ctx: PlacementContext,
    token: Hashable,
) -> Placement | NoFit:
    if policy.indexed_token != token:
        policy.indexes.clear()
        policy.indexed_token = token
    root = cluster.root
    key = (id(root), req, ctx.pools, ctx.tolerations)
    idx: _Index | None = policy.indexes.get(key)
    changed = None if idx is None else changes_for(idx, cluster, root)
    if idx is None or changed is None:
        idx = _Index(root)
        for st in cluster.candidates(req.models):
            _rescore(idx, req, st, cluster, policy, ctx)
        policy.indexes[key] = idx
        if len(policy.indexes) > MAX_INDEXES:
            policy.indexes.popitem(last=False)
    else:
        policy.indexes.move_to_end(key)
        if changed:
            models = req.models
            nodes = cluster.nodes
            for name in changed:
                now = nodes.get(name)
                if now is None or (models and not (now.models & models)):
                    idx.live.pop(name, None)
                    idx.set_why(name, None)
                else:
                    _rescore(idx, req, now, cluster, policy, ctx)
    synced(idx, cluster, root)
    heap, live = idx.heap, idx.live
    if len(heap) > 2 * len(live) + 64:
        heap[:] = [e for e in heap if live.get(e[3]) == e[2]]
        heapq.heapify(heap)
    # Best live entry outside ``ctx.avoid``; avoided entries are put back afterwards.
    skipped: list[tuple[float, int, int, str, Placement]] = []
    try:
        while heap:
            top = heap[0]
            if live.get(top[3]) != top[2]:
                heapq.heappop(heap)
            elif top[3] in ctx.avoid:
                skipped.append(heapq.heappop(heap))
            else:
                return top[4]
    finally:
        for entry in skipped:
            heapq.heappush(heap, entry)
    reasons = Counter(idx.counts)
    avoided = 0
    for name in ctx.avoid:
        if name in live:
            avoided += 1
            why = idx.why.get(name)
            if why is not None:
                reasons[why] -= 1
    return NoFit(len(live) - avoided, {r: n for r, n in reasons.items() if n > 0})


def _rescore(
    idx: _Index,
    req: DeviceRequest,
    st: NodeState,
    cluster: ClusterState,
    policy: Policy,
    ctx: PlacementContext,
) -> None:
    name = st.node.name
    why = unfit(req, st, ctx)
    got = None
    if why is None:
        sig = st.signature()
        memo = idx.memo
        if sig in memo:
            got = memo[sig]
            if got is not None and got[1].node != name:
                got = got[0], replace(got[1], node=name)
        else:
            got = policy.best_on_node(req, st, cluster)
            if len(memo) >= MAX_MEMO:
                memo.clear()
            memo[sig] = got
    if got is None:
        idx.live[name] = None
        idx.set_why(name, why if why is not None else _no_option_reason(req))
        return
    idx.set_why(name, None)
    idx.live[name] = st.version
    heapq.heappush(idx.heap, (-got[0], st.order, st.version, name, got[1]))
