"""BestFit (simulator baseline): the node left with the least CPU and GPU after placing.

``score = int(100 · (1 − [0.5 · (cpu_left − cpu)/128 000 + 0.5 · (Σgpu_left − gpu)/8 000]))``.
The simulator then min–max normalises scores with integer arithmetic; raw scores lie in
[0, 100], so that step keeps their order and ties and is left out. Shares go best-fit.
Example: 8 000m CPU and 1 000 milli left after placing → 100 · (1 − (0.03125 + 0.0625)) → 90.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.placement.scorers.choice import best_fit, requested_milli
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest

MAX_CPU_MILLI = 128_000
MAX_GPU_MILLI = 8_000


class BestFit:
    name = "bestfit"

    def score(
        self, req: DeviceRequest, st: NodeState, option: Placement, cluster: ClusterState
    ) -> float:
        s = 0.0
        s += (st.cpu_free - option.cpu_milli) / MAX_CPU_MILLI * 0.5
        s += (st.free_milli_total - requested_milli(option)) / MAX_GPU_MILLI * 0.5
        return float(int((1.0 - s) * 100))

    def score_node(
        self,
        req: DeviceRequest,
        st: NodeState,
        options: Sequence[Placement],
        cluster: ClusterState,
    ) -> tuple[float, Placement] | None:
        opt = best_fit(st, options)
        return self.score(req, st, opt, cluster), opt
