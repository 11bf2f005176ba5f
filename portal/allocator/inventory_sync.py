"""Keep the allocator's inventory current: apply a source's node events as they arrive."""

from __future__ import annotations

import logging

from policies.errors import PortalError
from portal.allocator.engine import Allocator
from portal.inventory.events import EventKind, InventoryEvent, InventorySource

log = logging.getLogger(__name__)


def apply_event(allocator: Allocator, event: InventoryEvent) -> None:
    """Apply one inventory change. A change that cannot be applied (its running allocations no
    longer fit the new description) is logged and skipped; the allocator keeps the old one."""
    try:
        if event.kind is EventKind.REMOVED:
            lost = allocator.node_removed(event.name)
            if lost:
                log.warning(
                    "node %s is gone; %d workload(s) failed: %s", event.name, len(lost), lost
                )
        elif event.node is not None:
            allocator.node_updated(event.node)  # adds the node when it is new
    except PortalError as err:
        log.error("inventory change for node %s not applied: %s", event.name, err)


async def follow(source: InventorySource, allocator: Allocator) -> None:
    """Apply ``source``'s changes to ``allocator`` until cancelled."""
    async for event in source.watch():
        apply_event(allocator, event)
