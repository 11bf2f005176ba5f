"""Placement scorers, one idea per module, and the named policies built from them."""

from __future__ import annotations

from collections.abc import Callable

from policies.errors import InvalidRequest
from policies.placement.framework import Policy
from policies.placement.scorers.binpack import BinPack
from policies.placement.scorers.topology import TopologyFit

POLICIES: dict[str, Callable[[], Policy]] = {
    "binpack": lambda: Policy("binpack", [(TopologyFit(), 1.0), (BinPack(), 1.0)]),
}


def policy(name: str) -> Policy:
    """A fresh instance of the named policy (scorers may keep learned state)."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise InvalidRequest(
            "placement policy", name, "one of " + ", ".join(sorted(POLICIES))
        ) from None
    return factory()
