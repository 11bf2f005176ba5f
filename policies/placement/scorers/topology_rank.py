"""Topology rank of a multi-GPU option: its weakest link, then whether it stays on one socket.

``rank = (2 · link class + one socket) / RANKS`` in (0, 1], where the link class is the
weakest link inside the set the device chooser picked (``LinkClass``: cross socket 1 … NVSwitch
6) and *one socket* is 1 when every GPU of the set sits on the same NUMA node. ``RANKS`` =
2 · NVSWITCH + 1 = 13, the best rank, so an NVSwitch set on one socket ranks 13 / 13 = 1. One
link class is worth two steps and the socket one, so a better link always wins over a
one-socket set with a worse link: NVLink split over two sockets (2 · 5 + 0 = 10) ranks above a
PCIe switch on one socket (2 · 4 + 1 = 9). Options of one GPU or none rank 1 (nothing to link).

gpuportal ranks multi-GPU options before fragmentation (see gpuportal.py); the binpack policy's
``TopologyFit`` (topology.py) looks at the link class only.
"""

from __future__ import annotations

from policies.placement.state import NodeState, Placement
from policies.topology import LinkClass

# Number of rank steps: 2 · the best link class + 1 for one socket (13).
RANKS = 2 * int(LinkClass.NVSWITCH) + 1


class TopologyRank:
    """The rank of an option's device set, in (0, 1]; higher is better connected."""

    name = "topology-rank"

    def steps(self, st: NodeState, option: Placement) -> int:
        """``2 · weakest link class + one socket`` (1 … ``RANKS``)."""
        if len(option.gpus) <= 1:
            return RANKS
        topo = st.node.link_topology
        worst = topo.worst_link(option.gpus)
        one_socket = len({topo.numa[g] for g in option.gpus}) == 1
        return 2 * int(worst) + int(one_socket)

    def rank(self, st: NodeState, option: Placement) -> float:
        return self.steps(st, option) / RANKS
