"""The queue's forward replay placing by node (``policies.eta_sim`` with ``Placing``): the
allocator's placement and node reservation, so a later small workload that fits on a node the
big one cannot use is foreseen to start first; and the cap on placements per sample."""

from __future__ import annotations

from policies import quota
from policies.eta import RunLengths
from policies.eta_sim import Estimate, Holder, Placing, Shape, Waiting, simulate
from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.placement.framework import PlacementContext
from policies.placement.scorers import policy
from policies.placement.state import ClusterState, Placement
from policies.requests import DeviceRequest
from policies.topology import LinkClass, Topology

NOW = 10_000.0
MODEL = "H100-80GB"


def _node(name: str) -> Node:
    return Node(
        name,
        tuple(GPU(i, MODEL, 81920, uuid=f"GPU-{name}-{i}") for i in range(4)),
        cpu_milli=64_000,
        memory_mib=524_288,
        topology=Topology.uniform(4, LinkClass.NVSWITCH),
    )


def _gpus(n: int) -> DeviceRequest:
    return DeviceRequest(FlavorKind.GPU, count=n, models=frozenset({MODEL}))


FL = str(_gpus(1).flavor(MODEL))


def _setup() -> tuple[ClusterState, quota.QuotaBook, dict[tuple[str, str], int], list[Holder]]:
    """Two 4-GPU nodes, each held by two 2-GPU runs: on n1 one ends at +100 and one at
    +2000; on n2 one at +100 and one at +3000. At +100 four GPUs are free by the counts, but
    two on each node."""
    cluster = ClusterState([_node("n1"), _node("n2")])
    holders = []
    runs = (("n1", (0, 1), 100), ("n1", (2, 3), 2000), ("n2", (0, 1), 100), ("n2", (2, 3), 3000))
    for node, gpus, end in runs:
        p = Placement(node, gpus, milli=1000)
        cluster.apply(p)
        holders.append(Holder("t", ((FL, 2),), NOW, ("t", "job"), limit_s=float(end), placed=(p,)))
    book = quota.QuotaBook(
        tenants={"t": quota.TenantQuota("t", {FL: quota.FlavorQuota(8, 16)}, cohort="c")},
        capacity={FL: 8},
    )
    return cluster, book, {("t", FL): 8}, holders


def _waiting(wid: str, n: int, placed: bool = True) -> Waiting:
    shape = Shape(_gpus(n), 1, PlacementContext(), ((MODEL, FL),)) if placed else None
    return Waiting(wid, "t", (FL,), n, ("t", "job"), 5000.0, shape)


def _points(got: dict[str, Estimate]) -> dict[str, float | None]:
    return {w: None if e.interval is None else e.interval.point for w, e in got.items()}


def test_a_later_small_workload_overtakes_the_big_one_placed_by_node() -> None:
    cluster, book, usage, holders = _setup()
    queue = [_waiting("big", 4), _waiting("small", 1)]
    placing = Placing(cluster, policy("gpuportal"))
    by_node = simulate(NOW, book, usage, holders, queue, RunLengths(), placing=placing)
    # At +100 the big one fits nowhere (2 + 2 free), reserves n1 (the node closest to
    # fitting it, first in order); the small one is placed on n2. n1 frees at +2000.
    assert _points(by_node) == {"big": 2000.0, "small": 100.0}
    # By the counts (the replay without placement) the big one would take the four GPUs at
    # +100 and the small one would wait for the next release.
    by_count = simulate(NOW, book, usage, holders, queue, RunLengths())
    assert _points(by_count) == {"big": 100.0, "small": 2000.0}
    # The replay forked the cluster: the snapshot is unchanged.
    assert sorted(st.full_free for st in cluster) == [0, 0]


def test_the_reserved_node_keeps_small_work_off_it() -> None:
    # Three small ones: n2 takes two at +100 (its free pair); the third may not use the
    # reserved n1 and waits, as the allocator's backfill would make it, until n1 frees at
    # +2000 and the big one, first in order, takes all of n1: it waits for n2 at +3000.
    cluster, book, usage, holders = _setup()
    queue = [_waiting("big", 4)] + [_waiting(f"s{i}", 1) for i in range(3)]
    got = simulate(
        NOW,
        book,
        usage,
        holders,
        queue,
        RunLengths(),
        placing=Placing(cluster, policy("gpuportal")),
    )
    assert _points(got) == {"big": 2000.0, "s0": 100.0, "s1": 100.0, "s2": 3000.0}


def test_the_cap_on_placements_gives_a_lower_bound_only() -> None:
    cluster, book, usage, holders = _setup()
    queue = [_waiting("big", 4), _waiting("small", 1)]
    placing = Placing(cluster, policy("gpuportal"), max_tries=1)
    got = simulate(NOW, book, usage, holders, queue, RunLengths(), placing=placing)
    # One placement per sample: the big one's (refused) at +100; then the sample stops.
    assert got["big"].interval is None and got["big"].at_least == 100.0
    assert got["small"].interval is None and got["small"].at_least == 100.0


def test_work_without_a_shape_is_still_replayed_by_the_counts() -> None:
    cluster, book, usage, holders = _setup()
    queue = [_waiting("big", 4, placed=False), _waiting("small", 1)]
    got = simulate(
        NOW,
        book,
        usage,
        holders,
        queue,
        RunLengths(),
        placing=Placing(cluster, policy("gpuportal")),
    )
    assert _points(got)["big"] == 100.0
