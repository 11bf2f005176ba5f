"""place() and place_gang(): filters with reasons, tie-breaks, gangs all-or-nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from policies.flavors import MILLI_PER_GPU, FlavorKind
from policies.inventory import GPU, Node, Taint, TaintEffect
from policies.mig import MigInstance
from policies.placement.framework import PlacementContext, Policy, Unfit
from policies.placement.gangs import place_gang
from policies.placement.pipeline import NoFit, place
from policies.placement.scorers.binpack import BinPack
from policies.placement.scorers.topology import TopologyFit
from policies.placement.state import ClusterState, Placement
from policies.requests import DeviceRequest, TopologyRequirement
from tests.policies.placement.test_state import cluster_snapshot

MIB = 80 * 1024
NONE = Policy("none")  # every option scores 0: node order decides


def binpack() -> Policy:
    return Policy("binpack", [(TopologyFit(), 1.0), (BinPack(), 1.0)])


def h100_node(name: str, gpus: int = 4, **fields: Any) -> Node:
    return Node(
        name, tuple(GPU(i, "H100-80GB", MIB) for i in range(gpus)), 32_000, 256_000, **fields
    )


def gpus(n: int, **fields: Any) -> DeviceRequest:
    return DeviceRequest(FlavorKind.GPU, count=n, **fields)


def test_ties_go_to_the_first_node_in_order() -> None:
    c = ClusterState([h100_node("b"), h100_node("a"), h100_node("c")])
    got = place(gpus(1), c, NONE)
    assert isinstance(got, Placement) and got.node == "b"


def test_filters_report_their_reasons_in_the_summary() -> None:
    c = ClusterState(
        [
            h100_node("cordoned", schedulable=False),
            h100_node("pooled", pool="team-x"),
            h100_node("tainted", taints=(Taint("gpu-maint"),)),
            h100_node("small", gpus=1),
        ]
    )
    got = place(gpus(2), c, NONE)
    assert isinstance(got, NoFit)
    assert got.nodes_considered == 4
    assert got.reasons == {
        Unfit.UNSCHEDULABLE: 1,
        Unfit.POOL: 1,
        Unfit.TAINT: 1,
        Unfit.GPUS: 1,
    }
    assert got.summary().startswith("0 of 4 nodes fit: ")
    for reason in got.reasons:
        assert f"1 {reason.value}" in got.summary()
    assert not got.topology


def test_pools_tolerations_and_prefer_no_schedule_open_nodes() -> None:
    c = ClusterState(
        [
            h100_node("pooled", pool="team-x"),
            h100_node("tainted", taints=(Taint("gpu-maint"),)),
            h100_node("soft", taints=(Taint("x", effect=TaintEffect.PREFER_NO_SCHEDULE),)),
        ]
    )
    ctx = PlacementContext(pools=frozenset({"team-x"}))
    assert place(gpus(1), c, NONE, ctx).node == "pooled"  # type: ignore[union-attr]
    c.set_schedulable("pooled", False)
    ctx = PlacementContext(tolerations=frozenset({"gpu-maint"}))
    assert place(gpus(1), c, NONE, ctx).node == "tainted"  # type: ignore[union-attr]
    assert place(gpus(1), c, NONE).node == "soft"  # type: ignore[union-attr]


def test_nvlink_on_pcie_only_nodes_is_a_topology_no_fit() -> None:
    c = ClusterState([h100_node("p")])
    got = place(gpus(2, topology=TopologyRequirement.NVLINK), c, NONE)
    assert isinstance(got, NoFit)
    assert got.reasons == {Unfit.TOPOLOGY: 1} and got.topology
    assert "1 free GPUs are not connected as required" in got.summary()


def test_no_node_of_the_model_says_so() -> None:
    c = ClusterState([h100_node("p")])
    got = place(gpus(1, models=frozenset({"A30-24GB"})), c, NONE)
    assert isinstance(got, NoFit) and got.summary() == "no node has an allowed GPU model"


def test_binpack_prefers_the_fuller_node() -> None:
    c = ClusterState([h100_node("empty"), h100_node("busy")])
    c.apply(Placement("busy", gpus=(0, 1), milli=MILLI_PER_GPU))
    assert place(gpus(1), c, binpack()).node == "busy"  # type: ignore[union-attr]


def test_a_gang_that_fits_is_returned_unapplied() -> None:
    c = ClusterState([h100_node("a"), h100_node("b")])
    before = cluster_snapshot(c)
    got = place_gang(gpus(4), 2, c, binpack())
    assert isinstance(got, list) and sorted(p.node for p in got) == ["a", "b"]
    assert cluster_snapshot(c) == before


def test_a_gang_that_does_not_fit_leaves_the_state_unchanged() -> None:
    c = ClusterState([h100_node("a"), h100_node("b")])
    c.apply(Placement("b", gpus=(0,), milli=MILLI_PER_GPU))
    before = cluster_snapshot(c)
    # 4 + 4 GPUs wanted; b has 3 free: the first member fits on a, the second nowhere.
    got = place_gang(gpus(4), 2, c, binpack())
    assert isinstance(got, NoFit)
    assert cluster_snapshot(c) == before


def test_a_same_rack_gang_lands_in_one_rack() -> None:
    c = ClusterState(
        [
            h100_node("r1-a", rack="r1"),
            h100_node("r2-a", rack="r2"),
            h100_node("r2-b", rack="r2"),
        ]
    )
    # Three 4-GPU members: no rack has 3 nodes.
    got = place_gang(gpus(4), 3, c, NONE, topology=TopologyRequirement.SAME_RACK)
    assert isinstance(got, NoFit) and Unfit.RACK in got.reasons
    # Two members: r1 is too small, r2 takes both.
    got = place_gang(gpus(4), 2, c, NONE, topology=TopologyRequirement.SAME_RACK)
    assert isinstance(got, list) and {p.node for p in got} == {"r2-a", "r2-b"}


def test_a_same_node_gang_lands_on_one_node() -> None:
    c = ClusterState([h100_node("a"), h100_node("b", gpus=8)])
    got = place_gang(gpus(2), 3, c, NONE, topology=TopologyRequirement.SAME_NODE)
    # 3 × 2 = 6 GPUs: only b has them.
    assert isinstance(got, list) and {p.node for p in got} == {"b"}
    assert len({g for p in got for g in p.gpus}) == 6


def test_a_gang_keeps_the_callers_node_restriction() -> None:
    c = ClusterState([h100_node("a"), h100_node("b")])
    ctx = PlacementContext(only=frozenset({"b"}))
    got = place_gang(gpus(1), 2, c, NONE, ctx)
    assert isinstance(got, list) and {p.node for p in got} == {"b"}


# -- state machine: random places, applies, unapplies, node removals --------------------------


def mixed_nodes() -> list[Node]:
    mig_gpu = GPU(0, "H100-80GB", MIB, mig_enabled=True, mig_layout=(MigInstance("3g.40gb", 0),))
    return [
        h100_node("whole", gpus=4),
        Node(
            "share", tuple(GPU(i, "T4", 16 * 1024, shareable=True) for i in range(2)), 8000, 64_000
        ),
        Node(
            "mig",
            (mig_gpu, GPU(1, "H100-80GB", MIB, mig_enabled=True)),
            8000,
            64_000,
            mig_reconfigurable=True,
        ),
    ]


REQUESTS = [
    gpus(1, cpu_milli=1000),
    gpus(2, memory_mib=10_000),
    DeviceRequest(FlavorKind.SHARE, milli=300, gpu_memory_mib=4096, cpu_milli=500),
    DeviceRequest(FlavorKind.SHARE, milli=700),
    DeviceRequest(FlavorKind.MIG, models=frozenset({"H100-80GB"}), mig_profile="3g.40gb"),
    DeviceRequest(FlavorKind.MIG, models=frozenset({"H100-80GB"}), mig_profile="1g.10gb"),
    DeviceRequest(cpu_milli=2000, memory_mib=4096),
]


class ClusterMachine(RuleBasedStateMachine):
    held = Bundle("held")

    def __init__(self) -> None:
        super().__init__()
        self.nodes = {n.name: n for n in mixed_nodes()}
        self.cluster = ClusterState(self.nodes.values())
        self.live: list[Placement] = []

    @rule(target=held, req=st.sampled_from(REQUESTS), policy=st.sampled_from([NONE, binpack()]))
    def place_and_apply(self, req: DeviceRequest, policy: Policy) -> Placement | None:
        got = place(req, self.cluster, policy)
        if isinstance(got, NoFit):
            return None
        self.cluster.apply(got)
        self.live.append(got)
        return got

    @rule(p=held)
    def unapply(self, p: Placement | None) -> None:
        if p is not None and p in self.live:
            self.cluster.unapply(p)
            self.live.remove(p)

    @rule(req=st.sampled_from(REQUESTS), members=st.integers(1, 3))
    def gang_changes_nothing(self, req: DeviceRequest, members: int) -> None:
        before = cluster_snapshot(self.cluster)
        place_gang(req, members, self.cluster, binpack())
        assert cluster_snapshot(self.cluster) == before

    @rule(name=st.sampled_from(["whole", "share", "mig"]))
    def remove_and_re_add(self, name: str) -> None:
        if name in self.cluster.nodes:
            self.cluster.remove_node(name)
            self.live = [p for p in self.live if p.node != name]
        else:
            self.cluster.add_node(self.nodes[name])

    @invariant()
    def capacity_stays_in_bounds(self) -> None:
        for s in self.cluster:
            assert 0 <= s.cpu_free <= s.node.cpu_milli
            assert 0 <= s.mem_free <= s.node.memory_mib
            for g, gpu in enumerate(s.node.gpus):
                assert 0 <= s.free_milli[g] <= MILLI_PER_GPU
                assert 0 <= s.free_mem[g] <= gpu.memory_mib
            assert s.full_free == len(s.free_gpus())

    def teardown(self) -> None:
        for p in reversed(self.live):
            self.cluster.unapply(p)
        for name, node in self.nodes.items():
            if name not in self.cluster.nodes:
                self.cluster.add_node(node)
        assert cluster_snapshot(self.cluster) == cluster_snapshot(ClusterState(self.nodes.values()))


TestClusterMachine = ClusterMachine.TestCase
TestClusterMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_preferred_nodes_win_when_they_fit_and_never_when_they_do_not() -> None:
    c = ClusterState([h100_node("a"), h100_node("b"), h100_node("c", gpus=2)])
    prefer = PlacementContext(prefer=frozenset({"c", "gone"}))
    for policy in (NONE, binpack()):
        got = place(gpus(1), c, policy, prefer)
        assert isinstance(got, Placement) and got.node == "c"
    # "c" has 2 GPUs: a request for 4 goes where it fits, as if nothing were preferred.
    got = place(gpus(4), c, binpack(), prefer)
    assert isinstance(got, Placement) and got.node == "a"
    # A preference never widens a restriction or lifts an avoid.
    only = PlacementContext(only=frozenset({"b"}), prefer=frozenset({"c"}))
    got = place(gpus(1), c, NONE, only)
    assert isinstance(got, Placement) and got.node == "b"
    avoid = PlacementContext(avoid=frozenset({"c"}), prefer=frozenset({"c"}))
    got = place(gpus(1), c, NONE, avoid)
    assert isinstance(got, Placement) and got.node == "a"
    assert isinstance(place(gpus(8), c, NONE, prefer), NoFit)
