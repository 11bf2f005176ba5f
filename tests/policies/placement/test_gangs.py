"""Which racks a same-rack gang tries comes from an index that follows the cluster's
changes, on the live state and on working copies alike; it must name exactly the racks a
scan of every node names, in the same order, after any history of changes."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from policies.flavors import FlavorKind
from policies.inventory import Node
from policies.placement import gangs
from policies.placement.fork import ClusterFork
from policies.placement.framework import PlacementContext, Unfit
from policies.placement.gangs import domains, place_gang
from policies.placement.pipeline import ANYWHERE, NoFit, place, unfit
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest, TopologyRequirement
from tests.policies.placement.test_pipeline import binpack, gpus, h100_node

RACK = TopologyRequirement.SAME_RACK
SHAPES = [gpus(1), gpus(2), gpus(4), DeviceRequest(FlavorKind.SHARE, milli=500)]


def scanned(cluster: ClusterState, req: DeviceRequest, members: int) -> list[frozenset[str]]:
    """The specification: every node read, racks that could hold every member, smallest
    first, ties by first node name."""
    groups: dict[str, set[str]] = {}
    room: dict[str, int] = {}
    for s in cluster.candidates(req.models):
        key = s.node.clique or s.node.rack
        if not key:
            continue
        groups.setdefault(key, set()).add(s.node.name)
        if unfit(req, s, ANYWHERE) is None:
            whole = req.kind is FlavorKind.GPU and req.count > 0
            room[key] = room.get(key, 0) + (s.full_free // req.count if whole else members)
    ok = [g for k, g in groups.items() if room.get(k, 0) >= members]
    return [frozenset(g) for g in sorted(ok, key=lambda g: (len(g), min(g)))]


def racks() -> list[Node]:
    # Racks of different sizes, one node in an NVLink clique instead, one with no rack.
    nodes = [
        h100_node(f"r{r}-n{i}", rack=f"r{r}")
        for r, size in enumerate([3, 2, 2, 1])
        for i in range(size)
    ]
    nodes.append(h100_node("clique-n0", rack="r0", clique="nvl-1"))
    nodes.append(h100_node("loose"))
    return nodes


class RoomMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.nodes = {n.name: n for n in racks()}
        self.cluster = ClusterState(self.nodes.values())
        self.policy = binpack()
        self.held: list[Placement] = []
        self.fork: ClusterFork | None = None

    def _state(self) -> ClusterState:
        return self.fork if self.fork is not None else self.cluster

    @rule(req=st.sampled_from(SHAPES))
    def take(self, req: DeviceRequest) -> None:
        got = place(req, self._state(), self.policy)
        if not isinstance(got, NoFit):
            self._state().apply(got)
            if self.fork is None:
                self.held.append(got)

    @rule(data=st.data())
    def give_back(self, data: st.DataObject) -> None:
        if self.held and self.fork is None:
            p = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
            self.cluster.unapply(p)

    @rule()
    def start_or_drop_a_working_copy(self) -> None:
        self.fork = ClusterFork(self.cluster) if self.fork is None else None

    @rule(name=st.sampled_from(["r1-n0", "clique-n0", "r3-n0"]))
    def node_goes_or_returns(self, name: str) -> None:
        if self.fork is not None:
            return
        if name in self.cluster.nodes:
            self.cluster.remove_node(name)
            self.held = [p for p in self.held if p.node != name]
        else:
            self.cluster.add_node(self.nodes[name])

    @rule(req=st.sampled_from(SHAPES), members=st.integers(1, 4))
    def a_gang_is_placed_or_not_and_changes_nothing(self, req: DeviceRequest, members: int) -> None:
        state = self._state()
        before = [(s.name, tuple(s.free_milli)) for s in state]
        got = place_gang(req, members, state, self.policy, topology=RACK)
        assert [(s.name, tuple(s.free_milli)) for s in state] == before
        if not isinstance(got, NoFit):
            homes = {state.nodes[p.node].node.clique or state.nodes[p.node].node.rack for p in got}
            assert len(homes) == 1 and None not in homes and "" not in homes

    @invariant()
    def the_index_names_what_a_scan_names(self) -> None:
        for req in SHAPES:
            for members in (1, 2, 3):
                state = self._state()
                got = list(domains(state, req, RACK, members, ANYWHERE, self.policy))
                assert got == scanned(state, req, members)


TestRoomMachine = RoomMachine.TestCase
TestRoomMachine.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)


def test_a_gang_reads_only_changed_nodes_once_its_index_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second same-rack gang does not read every node again: only the ones that changed."""
    nodes = [h100_node(f"r{r}-n{i}", rack=f"r{r}") for r in range(50) for i in range(4)]
    cluster = ClusterState(nodes)
    policy = binpack()
    reads: list[str] = []

    def counting(req: DeviceRequest, st: NodeState, ctx: PlacementContext) -> Unfit | None:
        reads.append(st.node.name)
        return unfit(req, st, ctx)

    monkeypatch.setattr(gangs, "unfit", counting)
    first = place_gang(gpus(4), 2, cluster, policy, topology=RACK)
    assert not isinstance(first, NoFit)
    assert len(reads) == 200
    reads.clear()
    cluster.apply(first[0])
    again = place_gang(gpus(4), 2, cluster, policy, topology=RACK)
    assert not isinstance(again, NoFit)
    # The node taken (and the ones the first gang's trial placements touched), nothing else.
    assert reads and set(reads) <= {p.node for p in first}
