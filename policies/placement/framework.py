"""The narrow interfaces of placement: a context, filters' reasons, scorers, and a policy.

Contract (kube-scheduler style):
- a ``Scorer`` returns a float in [0, 100] for one (node, option); higher is better. It must be
  pure: the same inputs give the same score, and it must not change the state;
- a ``Policy`` sums weighted scores; ties go to the candidate whose node comes first in the
  cluster's node order, then to the first option the device chooser listed;
- ``Scorer.observe`` (optional) sees every placement the allocator commits, so scorers that
  learn the request mix learn it from the allocator's own history;
- ``NodeScorer.score_node`` (optional) scores a whole node at once and picks the option it would
  take there, so a policy can apply a node-level score and a separate within-node device rule
  (the published baselines work that way);
- ``Scorer.cache_token`` (optional): a scorer's scores depend only on the request, the node's
  state and the option, plus whatever the token stands for (e.g. a learned distribution). The
  pipeline then caches node scores per node version and re-scores only changed nodes. Returning
  ``None`` marks the scorer uncacheable (e.g. random); a scorer without the method counts as a
  pure function of its inputs (token ``0``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, cast, runtime_checkable

from policies.placement import devices
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest


class Unfit(StrEnum):
    """Why a node was filtered out; summarised in the queue reason."""

    UNSCHEDULABLE = "node is cordoned"
    POOL = "node is in another tenant's pool"
    TAINT = "node has a taint the workload does not tolerate"
    MODEL = "no allowed GPU model"
    CPU = "not enough free CPU"
    MEMORY = "not enough free memory"
    GPUS = "not enough free GPUs"
    SHARE = "no GPU with enough free share"
    MIG = "no free MIG slot of that profile"
    TOPOLOGY = "free GPUs are not connected as required"
    RACK = "gang does not fit in one rack"


@dataclass(frozen=True, slots=True)
class PlacementContext:
    """Per-request facts placement needs beyond the request itself.

    ``pools``: the tenant's node pools; nodes with a pool label outside it are skipped (nodes
    without a pool are open to all). ``tolerations``: taint keys the workload tolerates.
    ``only``: restrict to these nodes (gangs, reservations); ``avoid``: never use these nodes
    (e.g. a node reserved for the head of the queue). ``prefer``: nodes tried first; only if
    none of them fits is the rest of the cluster considered (a preference, never a limit).
    """

    pools: frozenset[str] = frozenset()
    tolerations: frozenset[str] = frozenset()
    only: frozenset[str] | None = None
    avoid: frozenset[str] = frozenset()
    prefer: frozenset[str] = frozenset()


@runtime_checkable
class Scorer(Protocol):
    name: str

    def score(
        self, req: DeviceRequest, st: NodeState, option: Placement, cluster: ClusterState
    ) -> float: ...


@runtime_checkable
class NodeScorer(Protocol):
    """A scorer that evaluates every option of one node at once.

    Returns the node's score and the option it would take (one of ``options``, or an
    equivalent placement it builds itself), or None when no option suits it.
    """

    name: str

    def score_node(
        self,
        req: DeviceRequest,
        st: NodeState,
        options: Sequence[Placement],
        cluster: ClusterState,
    ) -> tuple[float, Placement] | None: ...


class Observer(Protocol):
    def observe(self, req: DeviceRequest, placement: Placement | None) -> None: ...


@dataclass(slots=True)
class Policy:
    """A named weighted sum of scorers.

    A policy with a single ``NodeScorer`` lets that scorer choose within the node; otherwise
    every option is scored with the weighted sum and the first best option wins.
    """

    name: str
    scorers: Sequence[tuple[Scorer, float]] = field(default_factory=list)
    # Score caches of the pipeline, keyed by request shape; see ``pipeline.place``.
    indexes: OrderedDict[Hashable, Any] = field(
        default_factory=OrderedDict, repr=False, compare=False
    )
    indexed_token: Hashable | None = field(default=None, repr=False, compare=False)
    # Whether the single scorer chooses within the node: a runtime Protocol check costs a
    # scan of the protocol's members, too slow for every node of every decision.
    _node_scorer: bool | None = field(default=None, init=False, repr=False, compare=False)

    def score(
        self, req: DeviceRequest, st: NodeState, option: Placement, cluster: ClusterState
    ) -> float:
        total = 0.0
        for scorer, weight in self.scorers:
            total += weight * scorer.score(req, st, option, cluster)
        return total

    def best_on_node(
        self, req: DeviceRequest, st: NodeState, cluster: ClusterState
    ) -> tuple[float, Placement] | None:
        """The node's score and the option this policy would take on it (None: no option)."""
        opts = devices.options(req, st)
        if not opts:
            return None
        if self._node_scorer is None:
            self._node_scorer = len(self.scorers) == 1 and isinstance(
                self.scorers[0][0], NodeScorer
            )
        if self._node_scorer:
            scorer, weight = self.scorers[0]
            got = cast(NodeScorer, scorer).score_node(req, st, opts, cluster)
            if got is None:
                return None
            return weight * got[0], got[1]
        best = opts[0]
        best_score = self.score(req, st, best, cluster)
        for opt in opts[1:]:
            sc = self.score(req, st, opt, cluster)
            if sc > best_score:
                best, best_score = opt, sc
        return best_score, best

    def cache_token(self) -> Hashable | None:
        """What the scores depend on beyond (request, node state); None: do not cache.

        "Node state" is ``NodeState.signature``: the node's hardware and free capacity, not
        its name, labels or rack; score indexes share one answer between nodes whose
        signatures are equal. A scorer that reads more must return None here."""
        tokens: list[Hashable] = []
        for scorer, weight in self.scorers:
            fn = getattr(scorer, "cache_token", None)
            tok = 0 if fn is None else fn()
            if tok is None:
                return None
            tokens.append((tok, weight))
        return tuple(tokens)

    def observe(self, req: DeviceRequest, placement: Placement | None) -> None:
        for scorer, _ in self.scorers:
            obs = getattr(scorer, "observe", None)
            if obs is not None:
                obs(req, placement)
