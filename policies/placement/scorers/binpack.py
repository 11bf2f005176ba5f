"""BinPack: prefer the node that is fullest after the placement, so empty nodes stay empty.

Score = 100 × used fraction after placing, averaged over the resources the request touches:
GPU milli (for GPU requests) and CPU. Example: an 8-GPU node with 6 GPUs busy taking 1 GPU
scores 100 × 7/8 = 87.5 on GPUs; an empty one scores 12.5 — the busy node wins.
"""

from __future__ import annotations

from policies.flavors import MILLI_PER_GPU
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest


class BinPack:
    name = "binpack"

    def score(
        self, req: DeviceRequest, st: NodeState, option: Placement, cluster: ClusterState
    ) -> float:
        node = st.node
        parts: list[float] = []
        if req.kind is not None and node.gpus:
            total = len(node.gpus) * MILLI_PER_GPU
            taken = option.milli * len(option.gpus) if option.mig_profile is None else 0
            if option.mig_profile is not None:
                # MIG: fuller parent GPUs first, measured by free instances left on the node.
                free = sum(len(f) for f in st.mig_free)
                count = sum(len(lay) for lay in st.mig_layout) or 1
                parts.append(1.0 - (free - 1) / count)
            else:
                parts.append((total - st.free_milli_total + taken) / total)
        if node.cpu_milli:
            parts.append((node.cpu_milli - st.cpu_free + option.cpu_milli) / node.cpu_milli)
        if not parts:
            return 0.0
        return 100.0 * sum(parts) / len(parts)
