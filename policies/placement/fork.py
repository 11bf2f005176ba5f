"""A copy-on-write working copy of a ``ClusterState`` for one decision.

A decision (admit several workloads in one cycle, place a gang) must see its own tentative
placements without changing the live state: the live state changes only once the decision is
committed. ``ClusterFork`` shares every node with its root and copies a node the first time the
decision changes it, so forking is O(1) and a decision costs O(nodes it touches).

Placement's score indexes (``pipeline._indexed``) are kept per root: a fork tells them which
nodes it changed (``touched``), and they re-score those nodes again on the next use of the root
or of another fork, so nothing scored on a discarded fork is ever trusted.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping

from policies.errors import NotFound
from policies.inventory import Node
from policies.placement.state import ClusterState, NodeState, Placement

_TOKENS = itertools.count(1)


class _ForkNodes(Mapping[str, NodeState]):
    """The root's nodes with the fork's copies, additions and removals laid over them."""

    __slots__ = ("_base", "_gone", "_own")

    def __init__(
        self, base: Mapping[str, NodeState], own: dict[str, NodeState], gone: set[str]
    ) -> None:
        self._base, self._own, self._gone = base, own, gone

    def __getitem__(self, name: str) -> NodeState:
        got = self._own.get(name)
        if got is not None:
            return got
        if name in self._gone:
            raise KeyError(name)
        return self._base[name]

    def __contains__(self, name: object) -> bool:
        if name in self._own:
            return True
        return name not in self._gone and name in self._base

    def __iter__(self) -> Iterator[str]:
        for name in self._base:
            if name not in self._gone or name in self._own:
                yield name
        for name in self._own:
            if name not in self._base:
                yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)


class ClusterFork(ClusterState):
    """``root`` as it would be after this fork's changes; ``root`` itself never changes."""

    def __init__(self, root: ClusterState) -> None:
        # Deliberately not ClusterState.__init__: nothing is copied.
        self._root = root.root
        self._own: dict[str, NodeState] = {}
        self._gone: set[str] = set()
        self._view = _ForkNodes(self._root.nodes, self._own, self._gone)
        self._next_order = self._root.next_order
        self.fork_log: list[str] = []
        self.token = next(_TOKENS)

    def fork(self) -> ClusterFork:
        """A fork of the same root that starts with this fork's changes (the nodes it changed
        copied): a decision taken on top of this one before this one reaches the root. Once
        this fork's changes are applied to the root, the copies equal the root's nodes."""
        child = ClusterFork(self._root)
        child._own.update((name, st.copy()) for name, st in self._own.items())
        child._gone.update(self._gone)
        child._next_order = self._next_order
        child.fork_log = list(self.fork_log)
        return child

    def settle(self, applied: int) -> None:
        """The first ``applied`` changes of the log (inherited from the forks this one was
        forked from) are now in the root: forget the copies only they made. Without this a
        fork of a fork keeps, and copies again, every node changed since the first fork of
        the chain, though the root already reads the same for all but this fork's own."""
        if applied <= 0:
            return
        log = self.fork_log[applied:]
        keep = set(log)
        self._own = {name: st for name, st in self._own.items() if name in keep}
        self._gone = {name for name in self._gone if name in keep}
        self._view = _ForkNodes(self._root.nodes, self._own, self._gone)
        self._next_order = max(self._next_order, self._root.next_order)
        self.fork_log = log
        # Indexes that followed this fork's log by position must read it afresh.
        self.token = next(_TOKENS)

    @property
    def nodes(self) -> Mapping[str, NodeState]:
        return self._view

    @property
    def root(self) -> ClusterState:
        return self._root

    @property
    def touched(self) -> frozenset[str]:
        """Every node this fork changed, added or removed."""
        return frozenset(self.fork_log)

    @property
    def seq(self) -> int:
        return self._root.seq + len(self.fork_log)

    def changed_since(self, seq: int) -> list[str] | None:
        base = self._root.seq
        if seq >= base:
            return self.fork_log[seq - base :]
        before = self._root.changed_since(seq)
        return None if before is None else before + self.fork_log

    def _changed(self, name: str) -> None:
        self.fork_log.append(name)

    def candidates(self, models: frozenset[str]) -> Iterable[NodeState]:
        own, gone = self._own, self._gone
        if not (own or gone):
            return self._root.candidates(models)
        # The root's candidates but the ones this fork changed, then the fork's own versions
        # of those (a list comprehension over the root's index: this runs over every node of a
        # model for gangs and reservations).
        masked = own.keys() | gone
        root = self._root
        if len(models) == 1:
            (m,) = models
            out = [st for name, st in root.by_model.get(m, {}).items() if name not in masked]
        elif not models:
            out = [st for name, st in root.nodes.items() if name not in masked]
        else:
            out = [st for st in root.candidates(models) if st.node.name not in masked]
        out.extend(st for st in own.values() if not models or st.node.models & models)
        return out

    def _writable(self, name: str) -> NodeState:
        got = self._own.get(name)
        if got is None:
            if name in self._gone or name not in self._root.nodes:
                raise NotFound("node", name)
            got = self._own[name] = self._root.nodes[name].copy()
        return got

    def apply(self, p: Placement) -> None:
        self._writable(p.node)._take(p)
        self._changed(p.node)

    def unapply(self, p: Placement) -> None:
        self._writable(p.node)._give(p)
        self._changed(p.node)

    def set_schedulable(self, name: str, schedulable: bool) -> None:
        st = self._writable(name)
        st.schedulable = schedulable
        st.renew_version()
        self._changed(name)

    def add_node(self, node: Node, order: int | None = None) -> NodeState:
        st = self._own[node.name] = self._new_node_state(node, order)
        self._changed(node.name)
        return st

    def remove_node(self, name: str) -> NodeState:
        st = self.node(name)
        self._own.pop(name, None)
        if name in self._root.nodes:
            self._gone.add(name)
        self._changed(name)
        return st
