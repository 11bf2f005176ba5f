"""The queue's ETAs replay placement by node as the allocator places (``estimates`` with
``policies.eta_sim.Placing``): when GPUs free on two nodes, a big workload that needs one
whole node waits and a later small one starts first where it fits. The ETAs read at
submission say so, and the allocator then does exactly that."""

from __future__ import annotations

from collections.abc import Callable

from policies.inventory import Node
from policies.requests import WorkloadKind
from portal.allocator import Allocator
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, wl

Make = Callable[[list[Node]], Allocator]


def _node_of(a: Allocator, wid: str) -> str:
    return a.read(lambda st: st.live[wid].allocations[0].node)


def test_a_later_small_workload_overtakes_the_big_one_and_the_eta_says_so(
    make_allocator: Make, clock: ManualClock
) -> None:
    a = make_allocator([hgx("n1", gpus=4), hgx("n2", gpus=4)])
    a.set_tenant("team-a", cohort="c")
    # The limit above the cluster: capacity, not quota, makes them wait.
    a.set_quota("team-a", "H100-80GB", guaranteed=8, limit=16)
    held = {}
    for name, limit in (("a1", 150), ("a2", 2000), ("b1", 100), ("b2", 3000)):
        st = a.request(
            wl("team-a", gpus(2), name=name, kind=WorkloadKind.JOB), expected_duration_s=limit
        )
        assert st.state is WorkloadState.RUNNING
        held[name] = st.id
    # The premise: n1 holds runs ending at +150 and +2000, n2 at +100 and +3000.
    nodes = {name: _node_of(a, wid) for name, wid in held.items()}
    assert nodes["a1"] == nodes["a2"] == "n1" and nodes["b1"] == nodes["b2"] == "n2"

    big = a.request(
        wl("team-a", gpus(4), name="big", kind=WorkloadKind.JOB), expected_duration_s=5000
    )
    small = a.request(
        wl("team-a", gpus(1), name="small", kind=WorkloadKind.JOB), expected_duration_s=5000
    )
    assert big.state is small.state is WorkloadState.QUEUED
    etas = {e.name: e for e in a.queue()}
    assert [e.name for e in a.queue()] == ["big", "small"]
    # Two GPUs free on n2 at +100: the small one, which fits there, starts there. The big one
    # needs one whole node: n1 at +2000. (By the counts alone, holding back what the big one
    # needs, the small one would wait and the big one would start at +150 on 2 + 2 GPUs.)
    assert etas["small"].eta_s == 100.0
    assert etas["big"].eta_s == 2000.0

    clock.advance(seconds=100)
    a.release(held["b1"])
    assert a.status(small.id).state is WorkloadState.RUNNING
    assert _node_of(a, small.id) == "n2"
    clock.advance(seconds=50)
    a.release(held["a1"])
    assert a.status(big.id).state is WorkloadState.QUEUED
    clock.advance(seconds=1850)
    a.release(held["a2"])
    got = a.status(big.id)
    assert got.state is WorkloadState.RUNNING and _node_of(a, big.id) == "n1"
