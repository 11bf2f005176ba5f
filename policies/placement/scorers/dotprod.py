"""DotProd (Tetris-style, simulator baseline): avoid nodes whose free vector aligns with the ask.

``score = int(100 · (1 − dot(free, request) / 2))`` with both vectors
``[cpu / 128 000, gpu_milli_total / 8 000]``. Shares go best-fit. Example: 64 000m CPU and
4 000 milli free, asking 8 000m and 1 000 milli: dot = 0.5 · 0.0625 + 0.5 · 0.125 = 0.09375 →
int(100 · 0.953125) = 95.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.placement.scorers.bestfit import MAX_CPU_MILLI, MAX_GPU_MILLI
from policies.placement.scorers.choice import best_fit, requested_milli
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest


class DotProd:
    name = "dotprod"

    def score(
        self, req: DeviceRequest, st: NodeState, option: Placement, cluster: ClusterState
    ) -> float:
        dot = (st.cpu_free / MAX_CPU_MILLI) * (option.cpu_milli / MAX_CPU_MILLI) + (
            st.free_milli_total / MAX_GPU_MILLI
        ) * (requested_milli(option) / MAX_GPU_MILLI)
        return float(int(100 * (1 - dot / 2)))

    def score_node(
        self,
        req: DeviceRequest,
        st: NodeState,
        options: Sequence[Placement],
        cluster: ClusterState,
    ) -> tuple[float, Placement] | None:
        opt = best_fit(st, options)
        return self.score(req, st, opt, cluster), opt
