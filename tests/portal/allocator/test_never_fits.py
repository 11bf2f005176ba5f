"""Requests no node could ever hold are refused; waits only a release can end have no ETA."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from policies.errors import InvalidRequest
from policies.flavors import FlavorKind
from policies.inventory import Node
from policies.requests import DeviceRequest
from portal.allocator import Allocator
from portal.demo import demo_seed
from portal.inventory.simulated import load_demo
from portal.service import seed
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import gpus, hgx, t4, wl

Make = Callable[[list[Node]], Allocator]


def _t4_share(**kw: int) -> DeviceRequest:
    return DeviceRequest(FlavorKind.SHARE, milli=250, models=frozenset({"T4"}), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("devices", "field", "largest"),
    [
        # A T4 has 15,360 MiB; the H100 nodes' 81,920 MiB GPUs are no use to a T4 share.
        (_t4_share(gpu_memory_mib=1_000_000), "gpu_memory_mib", "at most 15360"),
        (_t4_share(gpu_memory_mib=15_361), "gpu_memory_mib", "at most 15360"),
        # T4 nodes have 131,072 MiB; the H100 node's 1 TiB does not carry a T4.
        (gpus(1, "T4", memory_mib=200_000), "memory_mib", "at most 131072"),
        (_t4_share(cpu_milli=64_000), "cpu_milli", "at most 32000"),
        # Two T4s per node, eight H100s: three T4s never fit on one node.
        (gpus(3, "T4"), "GPU count", "at most 2"),
    ],
)
def test_a_shape_no_node_of_the_model_holds_is_refused_naming_the_largest_value(
    make_allocator: Make, devices: DeviceRequest, field: str, largest: str
) -> None:
    a = make_allocator([hgx("n1"), t4("t1")])
    a.set_tenant("team-a")
    a.set_quota("team-a", "T4", guaranteed=2, limit=2)
    a.set_quota("team-a", "T4/share", guaranteed=2000, limit=2000)
    before = a.store.load()
    with pytest.raises(InvalidRequest) as info:
        a.request(wl("team-a", devices))
    assert info.value.field == field
    assert largest in info.value.valid
    assert "T4" in info.value.valid
    assert a.store.load() == before and a.queue() == []


def test_the_largest_t4_share_still_fits(make_allocator: Make) -> None:
    a = make_allocator([hgx("n1"), t4("t1")])
    a.set_tenant("team-a")
    a.set_quota("team-a", "T4/share", guaranteed=2000, limit=2000)
    s = a.request(wl("team-a", _t4_share(gpu_memory_mib=15_360, memory_mib=131_072)))
    assert s.state is WorkloadState.RUNNING


def test_a_wait_only_a_release_can_end_has_no_estimate_and_says_why(make_allocator: Make) -> None:
    # No cohort: team-b's idle guaranteed GPUs are free but not lent to team-a.
    a = make_allocator([hgx("n1")])
    for t in ("team-a", "team-b"):
        a.set_tenant(t)
        a.set_quota(t, "H100-80GB", guaranteed=4, limit=8)
    assert a.request(wl("team-a", gpus(4))).state is WorkloadState.RUNNING
    s = a.request(wl("team-a", gpus(1), name="more"))
    assert s.state is WorkloadState.QUEUED
    assert s.eta_s is None  # the old estimate said 0.0: "under a minute"
    (entry,) = a.queue()
    assert entry.eta_s is None
    assert "4 gpus of H100-80GB stand free" in s.message
    assert "other tenants' guaranteed quota, which team-a may not borrow" in s.message
    assert s.message.endswith("it waits for a release")


def test_in_the_demo_team_a_hears_why_the_free_3g40gb_is_not_its_to_borrow(
    make_allocator: Make,
) -> None:
    nodes = load_demo()
    a = make_allocator(nodes)
    seed.apply(a, seed.parse(demo_seed(nodes), "demo seed"))
    mig = DeviceRequest(FlavorKind.MIG, mig_profile="3g.40gb", models=frozenset({"A100-80GB"}))
    # team-a's guaranteed one runs; team-b's guaranteed one stands idle.
    assert a.request(wl("team-a", mig, name="first")).state is WorkloadState.RUNNING
    s = a.request(wl("team-a", mig, name="second"))
    assert s.state is WorkloadState.QUEUED and s.reason == "quota"
    assert s.eta_s is None
    assert "1 instances of A100-80GB/3g.40gb stand free, but they are other tenants'" in s.message
    assert "team-a may not borrow" in s.message
