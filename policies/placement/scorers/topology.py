"""TopologyFit: prefer the best-connected device set, and for one GPU keep groups intact.

Score = 100 × (weakest link class of the chosen GPUs) / NVSWITCH for multi-GPU options, so an
NVSwitch set (6) scores 100, an NVLink pair (5) 83.3, cross-socket (1) 16.7. Single devices
score 100 everywhere (their choice within the node is made by the device chooser).
"""

from __future__ import annotations

from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest
from policies.topology import LinkClass


class TopologyFit:
    name = "topology"

    def score(
        self, req: DeviceRequest, st: NodeState, option: Placement, cluster: ClusterState
    ) -> float:
        if len(option.gpus) < 2:
            return 100.0
        worst = st.node.link_topology.worst_link(option.gpus)
        return 100.0 * int(worst) / int(LinkClass.NVSWITCH)
