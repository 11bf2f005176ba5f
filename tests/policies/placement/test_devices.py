"""Device choice on one node: topology-aware whole GPUs, deduped shares, MIG options."""

from __future__ import annotations

import pytest

from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.mig import MigInstance
from policies.placement import devices
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest, TopologyRequirement
from policies.topology import LinkClass, Topology

L = LinkClass
MIB = 80 * 1024


def pcie_two_socket() -> Topology:
    """GPUs 0-3 on NUMA 0, 4-7 on NUMA 1; PCIe switches pair 0-1, 2-3, 4-5, 6-7."""
    numa = (0, 0, 0, 0, 1, 1, 1, 1)

    def link(i: int, j: int) -> LinkClass:
        if i // 2 == j // 2:
            return L.SAME_PCIE_SWITCH
        return L.SAME_NUMA if numa[i] == numa[j] else L.CROSS_SOCKET

    return Topology(tuple(tuple(link(i, j) for j in range(8)) for i in range(8)), numa)


def pcie_node(name: str = "p") -> NodeState:
    gpus = tuple(GPU(i, "L40S", 48 * 1024) for i in range(8))
    return ClusterState([Node(name, gpus, 64_000, 512_000, topology=pcie_two_socket())]).node(name)


def whole(count: int, topology: TopologyRequirement = TopologyRequirement.ANY) -> DeviceRequest:
    return DeviceRequest(FlavorKind.GPU, count=count, topology=topology)


def take(st: NodeState, *gpus: int) -> None:
    for g in gpus:
        st.free_milli[g] = 0
    st._refresh()


@pytest.mark.parametrize(
    ("busy", "count", "expected"),
    [
        # Fresh node, 2 GPUs: a same-switch pair; all four pairs tie, lowest indices win.
        ((), 2, (0, 1)),
        # 4 GPUs: a whole socket (0-3: worst link NUMA, and no cross-socket link inside).
        ((), 4, (0, 1, 2, 3)),
        # 0 busy: the pair 2-3 is chosen over 4-5 (both PIX inside) because it couples less to
        # the GPUs left free: {2,3} vs rest {1,4,5,6,7} = 2 (1-2 NUMA) + 4×1 = 6, while {4,5}
        # vs rest {1,2,3,6,7} = 3×1 + 2×2 = 7.
        ((0,), 2, (2, 3)),
        # Socket 0 half busy: the quad must be socket 1.
        ((0, 2), 4, (4, 5, 6, 7)),
        # Only cross-socket pairs remain: 0-1 and 2-3 busy on socket 0, 4-5 and 6 on socket 1.
        ((0, 1, 2, 3, 4, 5, 6), 1, (7,)),
        # All 8.
        ((), 8, tuple(range(8))),
    ],
)
def test_whole_gpus_take_the_best_connected_set(
    busy: tuple[int, ...], count: int, expected: tuple[int, ...]
) -> None:
    st = pcie_node()
    take(st, *busy)
    assert devices.choose_whole(whole(count), st) == expected


def test_a_single_gpu_goes_where_it_breaks_no_free_pair() -> None:
    st = pcie_node()
    # GPU 4 is busy, so 5 has lost its switch partner; taking 5 keeps 0-1, 2-3, 6-7 whole.
    take(st, 4)
    assert devices.choose_whole(whole(1), st) == (5,)
    # With 2 and 5 busy too, GPU 3 is the only free GPU without its switch partner.
    take(st, 5, 2)
    assert devices.choose_whole(whole(1), st) == (3,)


def test_on_a_fresh_node_a_single_gpu_is_the_lowest_index() -> None:
    # Every GPU has the same ties (one PIX, two NODE, four SYS): lowest index wins; the next one
    # then completes that pair, since GPU 1 has lost its PIX partner.
    st = pcie_node()
    assert devices.choose_whole(whole(1), st) == (0,)
    take(st, 0)
    assert devices.choose_whole(whole(1), st) == (1,)


def test_nvlink_is_refused_on_a_pcie_only_node() -> None:
    st = pcie_node()
    assert devices.choose_whole(whole(2, TopologyRequirement.NVLINK), st) is None
    assert devices.options(whole(2, TopologyRequirement.NVLINK), st) == []


def test_nvlink_pairs_are_found_where_they_exist() -> None:
    # 4 GPUs, NVLink bridges 0-2 and 1-3, everything else same NUMA.
    links = [[L.SAME_NUMA] * 4 for _ in range(4)]
    for a, b in ((0, 2), (1, 3)):
        links[a][b] = links[b][a] = L.NVLINK
    topo = Topology(tuple(tuple(r) for r in links), (0, 0, 0, 0))
    gpus = tuple(GPU(i, "A100-80GB", MIB) for i in range(4))
    st = ClusterState([Node("b", gpus, 1000, 1000, topology=topo)]).node("b")
    assert devices.choose_whole(whole(2, TopologyRequirement.NVLINK), st) == (0, 2)
    take(st, 0)
    assert devices.choose_whole(whole(2, TopologyRequirement.NVLINK), st) == (1, 3)
    take(st, 1)
    assert devices.choose_whole(whole(2, TopologyRequirement.NVLINK), st) is None


def test_too_few_free_gpus_give_no_option() -> None:
    st = pcie_node()
    take(st, 0, 1, 2, 3, 4, 5)
    assert devices.choose_whole(whole(3), st) is None


def test_share_options_are_one_per_distinct_free_state_lowest_index_first() -> None:
    gpus = tuple(GPU(i, "T4", 16 * 1024, shareable=True) for i in range(4))
    c = ClusterState([Node("s", gpus, 8000, 64_000)])
    # GPU 1 and 3 both have 500 milli / 8 GiB left; GPU 0 and 2 are untouched.
    for g in (1, 3):
        c.apply(Placement("s", gpus=(g,), milli=500, gpu_memory_mib=8 * 1024))
    req = DeviceRequest(FlavorKind.SHARE, milli=400, gpu_memory_mib=4096)
    assert [o.gpus for o in devices.options(req, c.node("s"))] == [(0,), (1,)]
    # 600 milli fit only the untouched GPUs: one option for both.
    big = DeviceRequest(FlavorKind.SHARE, milli=600)
    assert [o.gpus for o in devices.options(big, c.node("s"))] == [(0,)]
    # More memory than a half-used GPU has left: only the untouched GPU again.
    mem = DeviceRequest(FlavorKind.SHARE, milli=100, gpu_memory_mib=9 * 1024)
    assert [o.gpus for o in devices.options(mem, c.node("s"))] == [(0,)]


def test_shares_never_land_on_gpus_that_are_not_shareable() -> None:
    gpus = (GPU(0, "T4", 16 * 1024), GPU(1, "T4", 16 * 1024, shareable=True))
    st = ClusterState([Node("s", gpus, 8000, 64_000)]).node("s")
    opts = devices.options(DeviceRequest(FlavorKind.SHARE, milli=100), st)
    assert [o.gpus for o in opts] == [(1,)]


def mig_cluster(reconfigurable: bool) -> ClusterState:
    # GPU 0: 3g@0 and 3g@4 exist; GPU 1: same layout (an identical state: deduped);
    # GPU 2: 4g@0 only.
    two_3g = (MigInstance("3g.40gb", 0), MigInstance("3g.40gb", 4))
    gpus = (
        GPU(0, "H100-80GB", MIB, mig_enabled=True, mig_layout=two_3g),
        GPU(1, "H100-80GB", MIB, mig_enabled=True, mig_layout=two_3g),
        GPU(2, "H100-80GB", MIB, mig_enabled=True, mig_layout=(MigInstance("4g.40gb", 0),)),
    )
    return ClusterState([Node("m", gpus, 8000, 64_000, mig_reconfigurable=reconfigurable)])


def mig_req(profile: str) -> DeviceRequest:
    return DeviceRequest(FlavorKind.MIG, models=frozenset({"H100-80GB"}), mig_profile=profile)


def test_mig_options_on_a_fixed_layout_are_free_existing_instances() -> None:
    c = mig_cluster(reconfigurable=False)
    opts = devices.options(mig_req("3g.40gb"), c.node("m"))
    # GPU 1 has the same state as GPU 0, so only GPU 0's first free instance is listed.
    assert [(o.gpus, o.mig_start, o.mig_created) for o in opts] == [((0,), 0, False)]
    c.apply(opts[0])
    opts = devices.options(mig_req("3g.40gb"), c.node("m"))
    # GPU 0 now differs from GPU 1: its remaining 3g@4, and GPU 1's 3g@0.
    assert [(o.gpus, o.mig_start) for o in opts] == [((0,), 4), ((1,), 0)]
    # No 2g instance exists anywhere and the node cannot be reconfigured.
    assert devices.options(mig_req("2g.20gb"), c.node("m")) == []


def test_mig_options_on_a_reconfigurable_node_include_new_instances_where_they_fit() -> None:
    c = mig_cluster(reconfigurable=True)
    opts = devices.options(mig_req("3g.40gb"), c.node("m"))
    # GPU 0 (and its twin GPU 1): existing 3g@0; no room to create. GPU 2: 4g@0 holds slices
    # 0-3, so a new 3g fits at 4 (compute 4+3 = 7).
    assert [(o.gpus, o.mig_start, o.mig_created) for o in opts] == [
        ((0,), 0, False),
        ((2,), 4, True),
    ]
    # A 2g fits on GPU 2 at 4 only (slices 4-5; 2g starts are 0/2/4).
    got = [(o.gpus, o.mig_start) for o in devices.options(mig_req("2g.20gb"), c.node("m"))]
    assert got == [((2,), 4)]
