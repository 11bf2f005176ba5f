"""FGD: Fragmentation Gradient Descent (Weng et al., USENIX ATC 2023), as its simulator does it.

For every option (each GPU that fits, for a share) the score is
``int(100 · sigmoid(Δ / 1000))`` with ``Δ = F(node) − F(node after placing)``; the node's score is
its best option's, the first such GPU on ties. ``F`` is the expected fragmentation against the
"typical pods" distribution, passed in by the caller (the benchmark learns it from the trace, as
the paper does). Example: F falls from 300 to 200 → Δ = 100 → int(100 · 0.525) = 52; a placement
that strands 700 more milli scores int(100 · sigmoid(−0.7)) = 33.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from policies.errors import InvalidRequest
from policies.placement.scorers.fragmentation import FragModel, Shape
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class FGD:
    name = "fgd"

    def __init__(self, typical: Iterable[tuple[Shape, float]]) -> None:
        self.frag = FragModel(typical)
        if not self.frag.typical:
            raise InvalidRequest(
                "fgd typical pods", "an empty distribution", "request shapes with frequencies > 0"
            )

    def score(
        self, req: DeviceRequest, st: NodeState, option: Placement, cluster: ClusterState
    ) -> float:
        delta = self.frag.node(st) - self.frag.after(st, option)
        return float(int(sigmoid(delta / 1000) * 100))

    def score_node(
        self,
        req: DeviceRequest,
        st: NodeState,
        options: Sequence[Placement],
        cluster: ClusterState,
    ) -> tuple[float, Placement] | None:
        before = self.frag.node(st)
        best: Placement | None = None
        best_score = -1
        for opt in options:
            sc = int(sigmoid((before - self.frag.after(st, opt)) / 1000) * 100)
            if sc > best_score:
                best, best_score = opt, sc
        assert best is not None
        return float(best_score), best
