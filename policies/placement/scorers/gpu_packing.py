"""GpuPacking (simulator baseline): fill partly used GPUs, then partly used nodes, then empty ones.

Scores (integers, higher first), with GPUs taken smallest-free-first:
1. only partly used GPUs: ``max(100 − Σ(free·100/1000)/10, 50)`` — e.g. one GPU with 300 free
   → 100 − 30/10 = 97;
2. fully free GPUs on a partly used node: ``max(50 − free GPUs taken, 33)`` — e.g. 2 → 48;
3. an entirely free node: ``max(33 − its GPUs, its GPUs)`` — an 8-GPU node → 25, 2-GPU → 31.
CPU-only requests score 0 everywhere (first node in order). Shares go best-fit.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.flavors import MILLI_PER_GPU
from policies.placement.scorers.choice import best_fit
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest

MAX_SCORE = 100


class GpuPacking:
    name = "gpupacking"

    def score(
        self, req: DeviceRequest, st: NodeState, option: Placement, cluster: ClusterState
    ) -> float:
        return float(self._node(req, st))

    @staticmethod
    def _node(req: DeviceRequest, st: NodeState) -> int:
        if req.kind is None or req.gpus == 0 or not st.free_milli:
            return 0
        free = st.free_milli
        n = len(free)
        if st.full_free == n:
            return max(MAX_SCORE // 3 - n, n)
        milli = MILLI_PER_GPU if req.milli == 0 else req.milli
        need = req.gpus
        fully_taken = 0
        used: list[int] = []
        for i in sorted(range(n), key=free.__getitem__):
            if need == 0:
                break
            if milli <= free[i]:
                need -= 1
                used.append(i)
                if free[i] == MILLI_PER_GPU:
                    fully_taken += 1
        if need:
            return 0
        if fully_taken:
            return max(MAX_SCORE // 2 - fully_taken, MAX_SCORE // 3)
        ratio = sum(free[i] * 100 // MILLI_PER_GPU for i in used)
        return max(MAX_SCORE - ratio // 10, MAX_SCORE // 2)

    def score_node(
        self,
        req: DeviceRequest,
        st: NodeState,
        options: Sequence[Placement],
        cluster: ClusterState,
    ) -> tuple[float, Placement] | None:
        return float(self._node(req, st)), best_fit(st, options)
