from __future__ import annotations

import pytest

from policies.errors import InvalidRequest
from policies.inventory import GPU, Node
from portal.inventory.events import EventKind, InventoryEvent, diff


def node(name: str, cpu: int = 8000) -> Node:
    return Node(name=name, gpus=(GPU(0, "T4", 15360),), cpu_milli=cpu, memory_mib=1024)


def test_diff_removes_first_then_adds_and_updates_in_name_order() -> None:
    old = {"a": node("a"), "b": node("b"), "c": node("c")}
    new = {"c": node("c", cpu=4000), "b": node("b"), "d": node("d"), "0": node("0")}

    assert diff(old, new) == [
        InventoryEvent(EventKind.REMOVED, "a", None),
        InventoryEvent(EventKind.ADDED, "0", new["0"]),
        InventoryEvent(EventKind.UPDATED, "c", new["c"]),
        InventoryEvent(EventKind.ADDED, "d", new["d"]),
    ]


def test_diff_of_equal_inventories_is_empty() -> None:
    assert diff({"a": node("a")}, {"a": node("a")}) == []


def test_removed_event_carries_no_node() -> None:
    with pytest.raises(InvalidRequest, match="none for removed events"):
        InventoryEvent(EventKind.REMOVED, "a", node("a"))
    with pytest.raises(InvalidRequest, match="a node for added/updated"):
        InventoryEvent(EventKind.ADDED, "a", None)


def test_event_name_matches_node() -> None:
    with pytest.raises(InvalidRequest, match="name 'b' for node 'a'"):
        InventoryEvent(EventKind.UPDATED, "b", node("a"))
