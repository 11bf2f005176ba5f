"""Inventory changes applied to the allocator: nodes added, updated (cordon, labels, MIG
layout) and removed, and reconciling with what the platform actually runs.

Functions over the allocator's state, called by its public methods under its lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from policies.errors import Conflict, PortalError
from policies.inventory import Node
from portal.allocator.live import Txn
from portal.allocator.views import ReconcileReport
from portal.store.records import AllocationRecord, WorkloadState

if TYPE_CHECKING:
    from portal.allocator.engine import Allocator


def added(self: Allocator, node: Node) -> None:
    if node.name in self._nodes:
        updated(self, node)
        return
    self._add_node(node)
    self._after_inventory_change()


def updated(self: Allocator, node: Node) -> None:
    """Replace a node's description, keeping its allocations (cordon, labels, layout)."""
    if node.name not in self._nodes:
        added(self, node)
        return
    held = [(lv, a) for lv in self._live.values() for a in lv.allocations if a.node == node.name]
    old_state = self._cluster.remove_node(node.name)
    old_node = self._nodes.pop(node.name)
    try:
        install(self, node, old_state.order, [a for _, a in held])
    except PortalError as err:
        install(self, old_node, old_state.order, [a for _, a in held])
        raise Conflict(
            f"node {node.name} changed in a way its running allocations no longer fit "
            f"({err}); keeping its previous description until they end"
        ) from err
    self._after_inventory_change()


def install(self: Allocator, node: Node, order: int, held: list[AllocationRecord]) -> None:
    """Put ``node`` into the cluster state with ``held`` applied, or leave it out."""
    self._cluster.add_node(node, order=order)
    self._nodes[node.name] = node
    try:
        for a in held:
            self._cluster.apply(self._restored_placement(a))
    except PortalError:
        self._cluster.remove_node(node.name)
        del self._nodes[node.name]
        raise


def removed(self: Allocator, name: str) -> list[str]:
    """A node is gone: its workloads fail with reason ``node-lost``. Returns their ids."""
    if name not in self._nodes:
        return []
    victims = [lv for lv in self._live.values() if any(a.node == name for a in lv.allocations)]
    txn = Txn()
    now = self._clock()
    for lv in victims:
        self._finish(txn, lv, WorkloadState.FAILED, "node-lost", now)
    self._cluster.remove_node(name)
    node = self._nodes.pop(name)

    def undo_removal() -> None:
        self._cluster.add_node(node)
        self._nodes[name] = node
        self._refresh_book()

    txn.undo.append(undo_removal)
    self._refresh_book()
    self._schedule(txn)
    self._commit(txn)
    return [lv.rec.id for lv in victims]


def reconcile(self: Allocator, running: set[str]) -> ReconcileReport:
    """Release allocations of workloads the platform no longer runs.

    ``running`` holds the ids of workloads the cluster backend actually runs. Workloads the
    allocator holds devices for but that are not running are released.
    """
    txn = Txn()
    now = self._clock()
    gone = [
        lv
        for lv in self._live.values()
        if lv.rec.state in (WorkloadState.RUNNING, WorkloadState.PREEMPTING)
        and lv.rec.id not in running
    ]
    for lv in gone:
        self._finish(txn, lv, WorkloadState.RELEASED, "workload-gone", now)
    flagged = tuple(sorted(running - set(self._live)))
    self._schedule(txn)
    self._commit(txn)
    return ReconcileReport(released=tuple(lv.rec.id for lv in gone), flagged=flagged)
