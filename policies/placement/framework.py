"""The narrow interfaces of placement: a context, filters' reasons, scorers, and a policy.

Contract (kube-scheduler style):
- a ``Scorer`` returns a float in [0, 100] for one (node, option); higher is better. It must be
  pure: the same inputs give the same score, and it must not change the state;
- a ``Policy`` sums weighted scores; ties go to the candidate whose node comes first in the
  cluster's node order, then to the first option the device chooser listed;
- ``Scorer.observe`` (optional) sees every placement the allocator commits, so scorers that
  learn the request mix learn it from the allocator's own history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

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
    (e.g. a node reserved for the head of the queue).
    """

    pools: frozenset[str] = frozenset()
    tolerations: frozenset[str] = frozenset()
    only: frozenset[str] | None = None
    avoid: frozenset[str] = frozenset()


@runtime_checkable
class Scorer(Protocol):
    name: str

    def score(
        self, req: DeviceRequest, st: NodeState, option: Placement, cluster: ClusterState
    ) -> float: ...


class Observer(Protocol):
    def observe(self, req: DeviceRequest, placement: Placement | None) -> None: ...


@dataclass(slots=True)
class Policy:
    """A named weighted sum of scorers."""

    name: str
    scorers: Sequence[tuple[Scorer, float]] = field(default_factory=list)

    def score(
        self, req: DeviceRequest, st: NodeState, option: Placement, cluster: ClusterState
    ) -> float:
        total = 0.0
        for scorer, weight in self.scorers:
            total += weight * scorer.score(req, st, option, cluster)
        return total

    def observe(self, req: DeviceRequest, placement: Placement | None) -> None:
        for scorer, _ in self.scorers:
            obs = getattr(scorer, "observe", None)
            if obs is not None:
                obs(req, placement)
