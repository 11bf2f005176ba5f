"""Random (simulator baseline): a uniformly random feasible node, a random sufficient GPU.

Every feasible node draws an independent uniform score, so the maximum is a uniformly random
feasible node. Shares take a uniformly random GPU among those with enough free share; whole
GPUs the device chooser's (lowest-index) set. The generator is injected (``random.Random``),
so a seed reproduces a run; scores are never cached.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.flavors import FlavorKind
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest


class RandomFit:
    name = "random"

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def cache_token(self) -> None:
        return None

    def score(
        self, req: DeviceRequest, st: NodeState, option: Placement, cluster: ClusterState
    ) -> float:
        return 100.0 * self.rng.random()

    def score_node(
        self,
        req: DeviceRequest,
        st: NodeState,
        options: Sequence[Placement],
        cluster: ClusterState,
    ) -> tuple[float, Placement] | None:
        score = 100.0 * self.rng.random()
        if req.kind is not FlavorKind.SHARE:
            return score, options[0]
        gpus = st.node.gpus
        fits = [
            i
            for i, g in enumerate(gpus)
            if g.shareable
            and (not req.models or g.model in req.models)
            and st.free_milli[i] >= req.milli
            and st.free_mem[i] >= req.gpu_memory_mib
        ]
        g = self.rng.choice(fits)
        return score, Placement(
            st.name,
            gpus=(g,),
            milli=req.milli,
            gpu_memory_mib=req.gpu_memory_mib,
            cpu_milli=req.cpu_milli,
            memory_mib=req.memory_mib,
        )
