"""Offers: each option's verdict for a tenant, computed without changing the allocator, and
agreeing with what a request for it then gets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from policies.errors import InvalidRequest, NotFound
from policies.inventory import GPU, Node
from policies.placement.state import ClusterState
from policies.requests import TopologyRequirement, WorkloadRequest
from policies.topology import LinkClass, Topology
from portal.allocator import Allocator
from portal.allocator.offers import Offer, OfferState, catalogue, find, offers
from portal.inventory import simulated
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, t4, wl

Make = Callable[..., Allocator]
Quotas = dict[tuple[str, str], tuple[int, int]]
NODES = ("n1", "t1")


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    stores: list[Store] = []

    def start(nodes: list[Node], quotas: Quotas | None = None) -> Allocator:
        """An allocator with tenants team-a and team-b and ``quotas``: (tenant, flavor) to
        (guaranteed, limit)."""
        store = Store(f"sqlite:///{tmp_path / f'portal{len(stores)}.db'}")
        stores.append(store)
        alloc = Allocator(store, clock=ManualClock())
        alloc.start(nodes)
        alloc.set_tenant("team-a")
        alloc.set_tenant("team-b")
        for (tenant, flavor), (g, lim) in (quotas or {}).items():
            alloc.set_quota(tenant, flavor, guaranteed=g, limit=lim)
        return alloc

    yield start
    for s in stores:
        s.close()


def free(cluster: ClusterState) -> list[tuple[int, int]]:
    return [(cluster.node(n).full_free, cluster.node(n).max_free_milli) for n in NODES]


def by_key(found: list[Offer]) -> dict[str, Offer]:
    return {o.option.key: o for o in found}


def test_the_demo_inventory_offers_whole_nvlink_mig_share_and_cpu_options() -> None:
    options = catalogue(simulated.load_demo())
    keys = [o.key for o in options]
    labels = {o.key: o.label for o in options}
    assert {"gpu:H100-80GB:1", "gpu:H100-80GB:2", "gpu:H100-80GB:4", "gpu:H100-80GB:8"} <= set(keys)
    assert labels["gpu:H100-80GB:4"] == "4 × H100-80GB NVLink"
    assert find(options, "gpu:H100-80GB:4").devices.topology is TopologyRequirement.NVLINK
    # The A100 node's MIG layout offers the profiles that exist on it.
    assert {"mig:A100-80GB:3g.40gb", "mig:A100-80GB:1g.10gb"} <= set(keys)
    assert labels["mig:A100-80GB:3g.40gb"] == "MIG 3g.40gb on A100-80GB"
    assert labels["share:T4:250"] == "0.25 × T4 (3 GiB)"  # 15360 MiB / 4 = 3840 MiB
    assert find(options, "share:T4:500").devices.gpu_memory_mib == 7680
    assert keys[-1] == "cpu" and find(options, "cpu").flavor is None


def test_multi_gpu_options_without_nvlink_do_not_ask_for_it() -> None:
    pcie = Node(
        "pcie",
        tuple(GPU(i, "L40S", 46068, uuid=f"u{i}") for i in range(4)),
        cpu_milli=64_000,
        memory_mib=262_144,
        topology=Topology.uniform(4, LinkClass.SAME_NUMA),
    )
    options = {o.key: o for o in catalogue([pcie])}
    assert options["gpu:L40S:4"].label == "4 × L40S"
    assert options["gpu:L40S:4"].devices.topology is TopologyRequirement.ANY
    assert "gpu:L40S:8" not in options


def test_an_unknown_option_is_refused_with_the_valid_keys() -> None:
    with pytest.raises(InvalidRequest, match=r"'gpu:X:1'.*gpu:H100-80GB:1"):
        find(catalogue([hgx("n1")]), "gpu:X:1")


def test_quota_decides_available_queued_and_not_allowed(make: Make) -> None:
    alloc = make([hgx("n1"), t4("t1")], {("team-a", "H100-80GB"): (2, 2)})
    first = by_key(offers(alloc, "team-a"))
    assert first["gpu:H100-80GB:1"].state is OfferState.AVAILABLE
    assert first["gpu:H100-80GB:2"].state is OfferState.AVAILABLE
    over = first["gpu:H100-80GB:4"]
    assert (over.state, over.reason) == (OfferState.NOT_ALLOWED, "over-limit")
    assert over.message == "4 × H100-80GB NVLink needs 4 gpus of H100-80GB; team-a's limit is 2"
    none = first["share:T4:250"]
    assert (none.state, none.reason) == (OfferState.NOT_ALLOWED, "no-quota")
    assert none.message == "team-a has no quota for T4/share; ask a tenant admin to add one"
    assert first["cpu"].state is OfferState.AVAILABLE

    alloc.request(wl("team-a", gpus(2)))
    full = by_key(offers(alloc, "team-a"))["gpu:H100-80GB:1"]
    assert (full.state, full.reason) == (OfferState.QUEUED, "quota")
    assert "2/2 gpus in use" in full.message
    assert (full.position, full.tenant_position) == (1, 1)

    alloc.request(wl("team-a", gpus(1), name="waiting"))
    behind = by_key(offers(alloc, "team-a"))["gpu:H100-80GB:1"]
    assert (behind.position, behind.tenant_position) == (2, 2)


def test_a_full_cluster_queues_by_capacity_and_a_pool_can_exclude_a_model(make: Make) -> None:
    gold = Node(
        "gold",
        tuple(GPU(i, "B200", 183_359, uuid=f"b{i}") for i in range(2)),
        cpu_milli=64_000,
        memory_mib=262_144,
        pool="gold",
    )
    alloc = make(
        [hgx("n1", gpus=2), gold],
        {
            ("team-a", "H100-80GB"): (2, 2),
            ("team-b", "H100-80GB"): (0, 2),
            ("team-a", "B200"): (1, 2),
        },
    )
    alloc.request(wl("team-a", gpus(2)))
    seen = by_key(offers(alloc, "team-b"))["gpu:H100-80GB:1"]
    assert (seen.state, seen.reason) == (OfferState.QUEUED, "quota")  # nothing left to borrow
    b200 = by_key(offers(alloc, "team-a"))["gpu:B200:1"]
    assert (b200.state, b200.reason) == (OfferState.NOT_ALLOWED, "not-in-pool")
    assert b200.message == "no B200 node is in team-a's node pools"
    alloc.set_tenant("team-a", pools=["gold"])
    assert by_key(offers(alloc, "team-a"))["gpu:B200:1"].state is OfferState.AVAILABLE


def test_capacity_not_quota_queues_when_no_node_can_take_it(make: Make) -> None:
    alloc = make([hgx("n1", gpus=2)], {("team-a", "H100-80GB"): (1, 2)})
    alloc.node_updated(replace(hgx("n1", gpus=2), schedulable=False))  # cordoned
    seen = by_key(offers(alloc, "team-a"))["gpu:H100-80GB:1"]
    assert (seen.state, seen.reason) == (OfferState.QUEUED, "capacity")
    assert seen.message == "0 of 1 nodes fit: 1 node is cordoned"
    got = alloc.request(wl("team-a", gpus(1)))
    assert (got.state, got.reason, got.position) == (WorkloadState.QUEUED, "capacity", 1)


def test_offers_change_nothing(make: Make) -> None:
    alloc = make(
        [hgx("n1"), t4("t1")],
        {("team-a", "H100-80GB"): (1, 4), ("team-a", "T4/share"): (0, 1000)},
    )
    alloc.request(wl("team-a", gpus(4)))
    alloc.request(wl("team-a", gpus(1), name="queued"))
    before = (alloc.workloads(), alloc.queue(), alloc.allocations(), alloc.usage())
    free_before = alloc.inspect(
        lambda c: [(c.node(n).full_free, c.node(n).max_free_milli) for n in NODES]
    )
    for _ in range(3):
        offers(alloc, "team-a")
        offers(alloc, "team-b")
    after = (alloc.workloads(), alloc.queue(), alloc.allocations(), alloc.usage())
    assert after == before
    assert alloc.inspect(
        lambda c: [(c.node(n).full_free, c.node(n).max_free_milli) for n in NODES]
    ) == (free_before)


def test_an_offer_says_what_the_request_made_from_it_gets(make: Make) -> None:
    alloc = make(
        [hgx("n1", gpus=4), t4("t1")],
        {
            ("team-a", "H100-80GB"): (2, 3),
            ("team-b", "H100-80GB"): (1, 2),
            ("team-a", "T4/share"): (0, 500),
        },
    )
    alloc.request(wl("team-b", gpus(2)))
    alloc.request(wl("team-a", gpus(1), name="first"))
    for key in ("gpu:H100-80GB:2", "gpu:H100-80GB:2", "share:T4:500", "share:T4:250"):
        offer = by_key(offers(alloc, "team-a"))[key]
        got = alloc.request(
            WorkloadRequest("team-a", "alice", key, offer.option.devices),
        )
        if offer.state is OfferState.AVAILABLE:
            assert got.state is WorkloadState.RUNNING, (key, got)
        else:
            assert offer.state is OfferState.QUEUED
            assert (got.state, got.reason) == (WorkloadState.QUEUED, offer.reason), key
            assert (got.position, got.tenant_position) == (offer.position, offer.tenant_position)


def test_an_unknown_tenant_is_not_found(make: Make) -> None:
    alloc = make([hgx("n1")])
    with pytest.raises(NotFound):
        offers(alloc, "team-z")


def test_mig_offers_count_the_profile_quota(make: Make) -> None:
    alloc = make(simulated.load_demo(), {("team-a", "A100-80GB/3g.40gb"): (1, 1)})
    got = by_key(offers(alloc, "team-a"))
    assert got["mig:A100-80GB:3g.40gb"].state is OfferState.AVAILABLE
    assert got["mig:A100-80GB:1g.10gb"].reason == "no-quota"


def test_offers_follow_inventory_changes(make: Make) -> None:
    alloc = make([hgx("n1", gpus=2)], {("team-a", "T4/share"): (0, 1000)})
    assert "share:T4:250" not in by_key(offers(alloc, "team-a"))
    alloc.node_added(t4("t1"))
    assert by_key(offers(alloc, "team-a"))["share:T4:250"].state is OfferState.AVAILABLE
    alloc.node_removed("t1")
    assert "share:T4:250" not in by_key(offers(alloc, "team-a"))
