"""Placement: filter → choose devices → score → pick, over an in-memory cluster state.

- ``state``: mutable per-node free capacity with indexes (the allocator's working copy);
- ``devices``: which concrete GPUs / MIG slot / share a request would take on one node;
- ``framework``: the ``Scorer`` protocol and the ``Policy`` that combines scorers;
- ``pipeline``: ``place()`` for one member, with score indexes that follow the state's changes;
- ``gangs``: ``place_gang()`` for all-or-nothing groups, one topology domain at a time;
- ``scorers/``: one module per scoring idea.
"""

from policies.placement.state import ClusterState, NodeState, Placement

__all__ = ["ClusterState", "NodeState", "Placement"]
