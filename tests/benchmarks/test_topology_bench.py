"""benchmarks.topology: the brute-force facts and the metrics on hand-made states."""

from __future__ import annotations

from benchmarks.topology import (
    Tally,
    best_free_class,
    best_one_socket_class,
    rack_room,
    request,
    run,
)
from policies.flavors import MILLI_PER_GPU
from policies.placement.state import ClusterState, Placement
from policies.topology import LinkClass
from portal.inventory.simulated import generate

HGX = "hgx-h100-8-1"
A100 = "a100-pcie-4-nvlink-pairs-1"


def cluster(**busy: tuple[int, ...]) -> ClusterState:
    """One HGX node and one A100 NVLink-pairs node (two racks of one), some GPUs taken."""
    c = ClusterState(generate({"hgx-h100-8": 1, "a100-pcie-4-nvlink-pairs": 1}, nodes_per_rack=1))
    for key, gpus in busy.items():
        name = HGX if key == "hgx" else A100
        c.apply(Placement(name, gpus=gpus, milli=MILLI_PER_GPU))
    return c


def test_empty_cluster_offers_nvswitch_on_one_socket() -> None:
    c = cluster()
    assert best_free_class(request(2, None), c) is LinkClass.NVSWITCH
    assert best_one_socket_class(request(2, None), c) is LinkClass.NVSWITCH
    assert best_free_class(request(8, None), c) is LinkClass.NVSWITCH
    assert best_one_socket_class(request(8, None), c) is None  # 4 GPUs a socket at most


def test_split_is_needless_only_when_a_one_socket_set_was_free() -> None:
    c = cluster(hgx=(0, 1, 2, 4, 5, 6))  # HGX keeps 3 and 7: NVSwitch, but two sockets
    req = request(2, None)
    best = best_free_class(req, c)
    one = best_one_socket_class(req, c)
    assert best is LinkClass.NVSWITCH and one is LinkClass.NVLINK  # the A100 pair 0-1
    t = Tally("x")
    t.record(c.node(HGX).node, (3, 7), best, one)
    assert (t.on_best_class, t.spans_sockets, t.needless_split) == (1, 1, 1)
    assert t.needless_split_no_worse == 0  # the one-socket pair was only NVLink
    t.record(c.node(A100).node, (0, 2), best, one)  # cross-socket on the A100 node
    assert (t.on_best_class, t.below_best_by_class) == (1, int(LinkClass.NVSWITCH) - 1)
    assert (t.needless_split, t.needless_split_no_worse) == (2, 1)
    s = t.summary()
    assert s["on_best_class_pct"] == 50.0 and s["needless_split_pct"] == 100.0


def test_model_restriction_limits_the_brute_force() -> None:
    c = cluster(a100=(0, 2))  # A100 keeps 1 and 3: one per socket
    req = request(2, "A100-80GB")
    assert best_free_class(req, c) is LinkClass.CROSS_SOCKET
    assert best_one_socket_class(req, c) is None
    t = Tally("x")
    t.record(c.node(A100).node, (1, 3), LinkClass.CROSS_SOCKET, None)
    assert (t.on_best_class, t.spans_sockets, t.needless_split) == (1, 1, 0)


def test_rack_room_counts_whole_members_per_rack() -> None:
    c = cluster(hgx=(0, 1, 2, 3))
    assert rack_room(request(4, None), 1, c)
    assert not rack_room(request(4, None), 2, c)  # 1 member in each rack, not 2 in one
    assert not rack_room(request(8, None), 1, c)


def test_a_short_run_is_reproducible_and_places_gangs_in_one_rack() -> None:
    a = run("gpuportal", 7, 300).summary()
    b = run("gpuportal", 7, 300).summary()
    assert a == b
    assert a["multi_gpu_placed"] != 0 and a["gangs"] != 0
    assert a["gangs_one_rack"] == a["gangs_possible"]
