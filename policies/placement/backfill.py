"""What the allocator's cycle decides around placement, as pure rules on a cluster state: the
request one gang member makes once quota admitted some of its models, and the node the first
workload blocked by capacity reserves (backfill without starving it). The allocator's cycle
and the queue's forward replay (``policies.eta_sim``) both use these, so a replayed queue
places and reserves as the allocator does.
"""

from __future__ import annotations

from dataclasses import replace

from policies.flavors import FlavorKind
from policies.placement.state import ClusterState
from policies.requests import DeviceRequest, TopologyRequirement


def member_request(
    dev: DeviceRequest, admitted: frozenset[str]
) -> tuple[DeviceRequest, TopologyRequirement]:
    """What one gang member asks placement for (restricted to the ``admitted`` models), and
    the gang's topology. Builds (and so re-validates) a request: callers memoize it."""
    gang = (
        dev.topology
        if dev.topology in (TopologyRequirement.SAME_NODE, TopologyRequirement.SAME_RACK)
        else TopologyRequirement.ANY
    )
    own = dev.topology if dev.topology is TopologyRequirement.NVLINK else TopologyRequirement.ANY
    return replace(dev, models=admitted or dev.models, topology=own), gang


def reserve_node(cluster: ClusterState, dev: DeviceRequest, model: str) -> str | None:
    """The node closest to fitting ``dev``: the schedulable node of ``model`` with the most
    free capacity of the right kind (the lowest order among equals)."""
    best: tuple[int, int] | None = None
    name = None
    for st in cluster.candidates(frozenset({model})):
        if not st.schedulable:
            continue
        free = st.max_free_milli if dev.kind is FlavorKind.SHARE else st.full_free
        key = (free, -st.order)
        if best is None or key > best:
            best, name = key, st.name
    return name
