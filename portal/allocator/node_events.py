"""Deciders for inventory changes — nodes added, updated (cordon, labels, MIG layout) and
removed — and for reconciling with what the platform actually runs. Each works on a draft.
"""

from __future__ import annotations

from policies.errors import Conflict, PortalError
from policies.inventory import Node
from portal.allocator import cycle
from portal.allocator.draft import Draft
from portal.allocator.ops import AddNode, RemoveNode, restored_placement
from portal.allocator.views import ReconcileReport
from portal.store.records import WorkloadState


def added(draft: Draft, node: Node) -> None:
    if node.name in draft.nodes:
        updated(draft, node)
        return
    draft.do(AddNode(node))
    cycle.schedule(draft)


def updated(draft: Draft, node: Node) -> None:
    """Replace a node's description, keeping its allocations (cordon, labels, layout).

    Raises:
        Conflict: its running allocations no longer fit the new description (nothing
            changes: the previous description stays until they end).
    """
    if node.name not in draft.nodes:
        added(draft, node)
        return
    held = [a for lv in draft.live.values() for a in lv.allocations if a.node == node.name]
    order = draft.cluster.node(node.name).order
    # Placements are judged against the new description's discovered MIG layout.
    placements = tuple(restored_placement(node, a) for a in held)
    draft.do(RemoveNode(node.name))
    try:
        draft.do(AddNode(node, order, placements))
    except PortalError as err:
        raise Conflict(
            f"node {node.name} changed in a way its running allocations no longer fit "
            f"({err}); keeping its previous description until they end"
        ) from err
    cycle.schedule(draft)


def removed(draft: Draft, name: str) -> list[str]:
    """A node is gone: its workloads fail with reason ``node-lost``. Returns their ids."""
    if name not in draft.nodes:
        return []
    victims = [lv for lv in draft.live.values() if any(a.node == name for a in lv.allocations)]
    draft.do(RemoveNode(name))
    for lv in victims:
        draft.finish(lv, WorkloadState.FAILED, "node-lost")
    cycle.schedule(draft)
    return [lv.rec.id for lv in victims]


def reconcile(draft: Draft, running: set[str]) -> ReconcileReport:
    """Release allocations of workloads the platform no longer runs.

    ``running`` holds the ids of workloads the cluster backend actually runs. Workloads the
    allocator holds devices for but that are not running are released.
    """
    gone = [
        lv
        for lv in draft.live.values()
        if lv.rec.state in (WorkloadState.RUNNING, WorkloadState.PREEMPTING)
        and lv.rec.id not in running
    ]
    for lv in gone:
        draft.finish(lv, WorkloadState.RELEASED, "workload-gone")
    flagged = tuple(sorted(running - set(draft.live)))
    cycle.schedule(draft)
    return ReconcileReport(released=tuple(lv.rec.id for lv in gone), flagged=flagged)
