"""Inventory changes as events, the contract every inventory source implements."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from policies.errors import InvalidRequest
from policies.inventory import Node


class EventKind(StrEnum):
    """What happened to a node."""

    ADDED = "added"
    UPDATED = "updated"
    REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class InventoryEvent:
    """One change: ``node`` is the new value, ``None`` exactly when the node was removed."""

    kind: EventKind
    name: str
    node: Node | None

    def __post_init__(self) -> None:
        if (self.node is None) != (self.kind is EventKind.REMOVED):
            raise InvalidRequest(
                "inventory event",
                f"{self.kind} of {self.name!r} with node={self.node is not None}",
                "a node for added/updated events and none for removed events",
            )
        if self.node is not None and self.node.name != self.name:
            raise InvalidRequest(
                "inventory event", f"name {self.name!r} for node {self.node.name!r}", "equal names"
            )


@runtime_checkable
class InventorySource(Protocol):
    """Where nodes come from.

    ``snapshot()`` returns every node known now. ``watch()`` then yields the changes that happen
    after that snapshot, in order; applying them to the snapshot gives the current inventory.
    A source that never changes may end ``watch()`` without yielding anything.
    """

    def snapshot(self) -> list[Node]: ...

    def watch(self) -> AsyncIterator[InventoryEvent]: ...


def diff(old: Mapping[str, Node], new: Mapping[str, Node]) -> list[InventoryEvent]:
    """Events that turn ``old`` into ``new``: removals first, then additions and updates.

    Removals come first so that an allocator applying them in order never holds two nodes
    that claim the same devices. Within each group events are sorted by node name, so the
    result is deterministic.
    """
    events = [
        InventoryEvent(EventKind.REMOVED, name, None) for name in sorted(old.keys() - new.keys())
    ]
    for name in sorted(new):
        node = new[name]
        before = old.get(name)
        if before is None:
            events.append(InventoryEvent(EventKind.ADDED, name, node))
        elif before != node:
            events.append(InventoryEvent(EventKind.UPDATED, name, node))
    return events
