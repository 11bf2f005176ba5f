"""Allocator scenarios on a real database (SQLite and PostgreSQL through ``db_url``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from policies.errors import Conflict, InvalidRequest, NotFound
from policies.flavors import FlavorKind
from policies.inventory import Node
from policies.requests import DeviceRequest, TopologyRequirement
from portal.allocator import Allocator
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, share, t4, wl

Make = Callable[[list[Node]], Allocator]


def two_tenants(
    a: Allocator, *, limit_a: int = 8, limit_b: int = 8, cohort: str | None = "c"
) -> None:
    a.set_tenant("team-a", cohort=cohort)
    a.set_tenant("team-b", cohort=cohort)
    a.set_quota("team-a", "H100-80GB", guaranteed=min(4, limit_a), limit=limit_a)
    a.set_quota("team-b", "H100-80GB", guaranteed=min(4, limit_b), limit=limit_b)


def test_a_request_within_quota_runs_on_distinct_gpus_and_is_persisted(
    make_allocator: Make,
) -> None:
    a = make_allocator([hgx("n1")])
    two_tenants(a)
    s = a.request(wl("team-a", gpus(2)))
    assert s.state is WorkloadState.RUNNING
    (alloc,) = s.allocations
    assert alloc.node == "n1" and len(set(alloc.gpus)) == 2
    assert alloc.gpu_uuids == tuple(f"GPU-n1-{g}" for g in alloc.gpus)
    assert alloc.flavor == "H100-80GB" and alloc.amount == 2
    stored = a._store.load()
    assert [x.id for x in stored.allocations] == [alloc.id]


def test_a_request_over_the_limit_queues_with_the_quota_reason_and_a_position(
    make_allocator: Make,
) -> None:
    a = make_allocator([hgx("n1")])
    two_tenants(a, limit_a=2)
    a.request(wl("team-a", gpus(1), name="one"))
    a.request(wl("team-a", gpus(1), name="two"))
    third = a.request(wl("team-a", gpus(1), name="three"))
    assert third.state is WorkloadState.QUEUED
    assert third.reason == "quota"
    assert "2/2" in third.message and "team-a" in third.message
    assert (third.position, third.tenant_position) == (1, 1)
    assert [e.workload_id for e in a.queue("team-a")] == [third.id]
    assert a.queue("team-b") == []


def test_releasing_work_starts_the_queued_workload_and_release_is_idempotent(
    make_allocator: Make,
) -> None:
    a = make_allocator([hgx("n1")])
    two_tenants(a, limit_a=2)
    first = a.request(wl("team-a", gpus(2)))
    waiting = a.request(wl("team-a", gpus(1)))
    assert waiting.state is WorkloadState.QUEUED
    a.release(first.id)
    assert a.status(waiting.id).state is WorkloadState.RUNNING
    again = a.release(first.id)
    assert again.state is WorkloadState.RELEASED
    assert sum(len(x.gpus) for x in a.allocations()) == 1


def test_cancel_removes_the_queue_entry(make_allocator: Make) -> None:
    a = make_allocator([hgx("n1")])
    two_tenants(a, limit_a=1)
    a.request(wl("team-a", gpus(1)))
    queued = a.request(wl("team-a", gpus(1)))
    assert a.cancel(queued.id).state is WorkloadState.CANCELLED
    assert a.queue() == []


def test_a_lender_reclaims_its_guaranteed_share_from_the_youngest_borrowers_after_grace(
    make_allocator: Make, clock: ManualClock
) -> None:
    a = make_allocator([hgx("n1")])
    two_tenants(a)
    # team-b fills the node: 4 on its guarantee, 4 borrowed from team-a's unused guarantee.
    ids = []
    for i in range(8):
        ids.append(a.request(wl("team-b", gpus(1), name=f"b{i}")).id)
        clock.advance(seconds=1)
    assert sum(a.status(i).allocations[0].borrowed for i in ids) == 4
    claim = a.request(wl("team-a", gpus(2), name="claim"))
    assert claim.state is WorkloadState.QUEUED
    assert "reclaim" in claim.message
    preempting = [i for i in ids if a.status(i).state is WorkloadState.PREEMPTING]
    # Minimal: two 1-GPU victims for a 2-GPU claim; the youngest (latest started) first.
    assert preempting == ids[-2:]
    deadline = a.status(preempting[0]).preempt_deadline
    assert deadline is not None and (deadline - clock.now).total_seconds() == 300
    a.tick()
    assert a.status(claim.id).state is WorkloadState.QUEUED  # grace not over
    clock.advance(seconds=301)
    a.tick()
    assert a.status(claim.id).state is WorkloadState.RUNNING
    assert all(a.status(i).state is WorkloadState.RELEASED for i in preempting)
    assert a.status(preempting[0]).reason == "preempted"


def test_a_retried_request_with_the_same_idempotency_key_allocates_once(
    make_allocator: Make,
) -> None:
    a = make_allocator([hgx("n1")])
    two_tenants(a)
    first = a.request(wl("team-a", gpus(1)), idempotency_key="k-1")
    second = a.request(wl("team-a", gpus(1)), idempotency_key="k-1")
    assert first.id == second.id
    assert len(a.allocations()) == 1
    other = a.request(wl("team-a", gpus(1)), idempotency_key="k-2")
    assert other.id != first.id


@pytest.mark.parametrize(
    ("make_request", "error", "words"),
    [
        (lambda: wl("team-x", gpus(1)), NotFound, ["tenant", "team-x", "team-a"]),
        (lambda: wl("team-a", gpus(1, model="B200")), InvalidRequest, ["B200", "H100-80GB"]),
        (lambda: wl("team-a", gpus(9)), InvalidRequest, ["9", "at most 8"]),
        (
            lambda: wl("team-a", DeviceRequest(FlavorKind.GPU, count=1, cpu_milli=10**9)),
            InvalidRequest,
            ["cpu_milli", "at most 128000"],
        ),
    ],
)
def test_bad_requests_get_a_clear_error_and_change_nothing(
    make_allocator: Make,
    make_request: Callable[[], object],
    error: type[Exception],
    words: list[str],
) -> None:
    a = make_allocator([hgx("n1")])
    two_tenants(a)
    a.request(wl("team-a", gpus(1)))
    before = a._store.load()
    with pytest.raises(error) as info:
        a.request(make_request())  # type: ignore[arg-type]
    for w in words:
        assert w in str(info.value)
    assert a._store.load() == before
    assert len(a.allocations()) == 1


def test_requests_that_cannot_even_be_built_are_refused_before_the_allocator() -> None:
    with pytest.raises(InvalidRequest, match="MIG profile"):
        DeviceRequest(FlavorKind.MIG, mig_profile="3g.40gb", models=frozenset({"A30-24GB"}))
    with pytest.raises(InvalidRequest, match="GPU count"):
        DeviceRequest(FlavorKind.GPU, count=-1)


def test_a_restart_rebuilds_the_same_allocations_queue_and_usage(
    make_allocator: Make, clock: ManualClock
) -> None:
    nodes = [hgx("n1"), hgx("n2", rack="r2")]
    a = make_allocator(nodes)
    two_tenants(a, limit_a=6)
    for i in range(3):
        a.request(wl("team-a", gpus(2), name=f"a{i}"))
        clock.advance(seconds=1)
    queued = a.request(wl("team-a", gpus(2), name="late"))
    assert queued.state is WorkloadState.QUEUED
    b = make_allocator(nodes)
    assert sorted(a.allocations(), key=lambda x: x.id) == sorted(
        b.allocations(), key=lambda x: x.id
    )
    assert [e.workload_id for e in b.queue()] == [queued.id]
    assert b.usage("team-a") == a.usage("team-a")
    for st in a.cluster:
        other = b.cluster.node(st.name)
        assert (other.free_milli, other.cpu_free, other.mem_free) == (
            st.free_milli,
            st.cpu_free,
            st.mem_free,
        )


def test_losing_a_node_fails_its_workloads_and_frees_their_quota(make_allocator: Make) -> None:
    a = make_allocator([hgx("n1"), hgx("n2")])
    two_tenants(a)
    s = a.request(wl("team-a", gpus(8)))
    lost = a.node_removed(s.allocations[0].node)
    assert lost == [s.id]
    st = a.status(s.id)
    assert st.state is WorkloadState.FAILED and st.reason == "node-lost"
    assert a.usage("team-a")[0].used == 0


def test_a_gang_starts_all_or_nothing(make_allocator: Make) -> None:
    a = make_allocator([hgx(f"n{i}") for i in range(1, 5)])
    a.set_tenant("team-a")
    a.set_quota("team-a", "H100-80GB", guaranteed=32, limit=32)
    # Three 5-GPU members take three nodes (no two fit on one): 3+3+3+8 GPUs stay free.
    spread = a.request(wl("team-a", gpus(5), name="spread", gang=3))
    assert len({x.node for x in spread.allocations}) == 3
    # 17 GPUs are free but only one node is whole; the 2 x 8 gang must not half-start.
    gang = a.request(wl("team-a", gpus(8), name="gang", gang=2))
    assert gang.state is WorkloadState.QUEUED and gang.reason == "capacity"
    assert not any(x.workload_id == gang.id for x in a.allocations())
    a.release(spread.id)
    started = a.status(gang.id)
    assert started.state is WorkloadState.RUNNING
    assert len({x.node for x in started.allocations}) == 2


def test_a_same_rack_gang_lands_in_one_rack(make_allocator: Make) -> None:
    a = make_allocator([hgx("n1", "r1"), hgx("n2", "r2"), hgx("n3", "r2")])
    two_tenants(a, limit_a=24, limit_b=24)
    a.request(wl("team-b", gpus(1)))  # n1 partly used: r1 can hold one 8-GPU member at most
    dev = gpus(8, topology=TopologyRequirement.SAME_RACK)
    s = a.request(wl("team-a", dev, gang=2))
    assert s.state is WorkloadState.RUNNING
    assert sorted(x.node for x in s.allocations) == ["n2", "n3"]


def test_a_large_blocked_request_reserves_a_node_against_smaller_ones(make_allocator: Make) -> None:
    a = make_allocator([hgx(f"n{i}") for i in range(1, 5)])
    a.set_tenant("team-a")
    a.set_quota("team-a", "H100-80GB", guaranteed=32, limit=32)
    x = a.request(wl("team-a", gpus(8), name="x"))
    z = a.request(wl("team-a", gpus(4), name="z"))
    w = a.request(wl("team-a", gpus(6), name="w"))
    v = a.request(wl("team-a", gpus(5), name="v"))
    assert len({s.allocations[0].node for s in (x, z, w, v)}) == 4
    # Free: 4 next to z, 2 next to w, 3 next to v: 9 GPUs, no node with 8.
    big = a.request(wl("team-a", gpus(8), name="big"))
    assert big.state is WorkloadState.QUEUED and big.reason == "capacity"
    # The node closest to fitting the big request (z's, 4 free) is reserved for it: a
    # 2-GPU request still fits elsewhere, a 4-GPU one would only fit on z's node and waits.
    small = a.request(wl("team-a", gpus(2), name="small"))
    assert small.state is WorkloadState.RUNNING
    assert small.allocations[0].node != z.allocations[0].node
    medium = a.request(wl("team-a", gpus(4), name="medium"))
    assert medium.state is WorkloadState.QUEUED
    a.release(z.id)
    assert a.status(big.id).state is WorkloadState.RUNNING
    assert a.status(big.id).allocations[0].node == z.allocations[0].node


def test_fractional_shares_pack_onto_one_gpu(make_allocator: Make) -> None:
    a = make_allocator([t4("t1"), t4("t2")])
    a.set_tenant("team-a")
    a.set_quota("team-a", "T4/share", guaranteed=2000, limit=4000)
    first = a.request(wl("team-a", share(250)))
    second = a.request(wl("team-a", share(500)))
    p1, p2 = first.allocations[0], second.allocations[0]
    assert (p1.node, p1.gpus) == (p2.node, p2.gpus)
    assert p1.flavor == "T4/share" and p1.amount == 250 and p1.gpu_equivalent == 0.25


def test_lowering_a_quota_blocks_new_work_but_stops_nothing(make_allocator: Make) -> None:
    a = make_allocator([hgx("n1")])
    two_tenants(a)
    running = a.request(wl("team-a", gpus(4)))
    a.set_quota("team-a", "H100-80GB", guaranteed=1, limit=2)
    assert a.status(running.id).state is WorkloadState.RUNNING
    assert a.request(wl("team-a", gpus(1))).reason == "quota"


def test_a_stale_quota_edit_is_refused_with_a_conflict(make_allocator: Make) -> None:
    a = make_allocator([hgx("n1")])
    two_tenants(a)
    current = a.quotas("team-a")[0]
    a.set_quota("team-a", "H100-80GB", guaranteed=4, limit=6, expected_version=current.version)
    with pytest.raises(Conflict, match="version"):
        a.set_quota("team-a", "H100-80GB", guaranteed=4, limit=7, expected_version=current.version)
    assert a.quotas("team-a")[0].limit == 6


def test_an_exhausted_gpu_hour_budget_queues_new_work_with_the_budget_reason(
    make_allocator: Make, clock: ManualClock
) -> None:
    a = make_allocator([hgx("n1")])
    a.set_tenant("team-a")
    a.set_quota("team-a", "H100-80GB", guaranteed=4, limit=8, budget_gpu_hours=2.0)
    s = a.request(wl("team-a", gpus(2)))
    clock.advance(hours=1)
    a.release(s.id)
    later = a.request(wl("team-a", gpus(1)))
    assert later.state is WorkloadState.QUEUED and later.reason == "budget"


def test_a_cpu_only_request_runs_without_gpus_and_survives_a_restart(
    make_allocator: Make,
) -> None:
    a = make_allocator([hgx("n1")])
    two_tenants(a)
    s = a.request(wl("team-a", DeviceRequest(cpu_milli=2_000, memory_mib=4_096)))
    assert s.state is WorkloadState.RUNNING
    (alloc,) = s.allocations
    assert alloc.node == "n1" and alloc.gpus == () and alloc.flavor == ""
    assert a.capacity == {"H100-80GB": 8}
    stored = a._store.load()
    assert [x.id for x in stored.allocations] == [alloc.id]
    again = Allocator(a._store, clock=a._clock)
    again.start([hgx("n1")])
    assert again.status(s.id).state is WorkloadState.RUNNING
    assert again.release(s.id).state is WorkloadState.RELEASED


def test_a_mig_instance_discovered_with_its_uuid_is_handed_out_by_that_uuid(
    make_allocator: Make,
) -> None:
    from policies.inventory import GPU
    from policies.mig import MigInstance

    layout = (MigInstance("3g.40gb", 0, "MIG-aaa"), MigInstance("3g.40gb", 4, "MIG-bbb"))
    node = Node(
        "m1",
        (GPU(0, "A100-80GB", 81_920, uuid="GPU-m1-0", mig_enabled=True, mig_layout=layout),),
        cpu_milli=64_000,
        memory_mib=262_144,
    )
    a = make_allocator([node])
    a.set_tenant("team-a")
    a.set_quota("team-a", "A100-80GB/3g.40gb", guaranteed=2, limit=2)
    mig = DeviceRequest(FlavorKind.MIG, mig_profile="3g.40gb", models=frozenset({"A100-80GB"}))
    first = a.request(wl("team-a", mig))
    second = a.request(wl("team-a", mig))
    got = {x.allocations[0].mig_start: x.allocations[0].gpu_uuids for x in (first, second)}
    assert got == {0: ("MIG-aaa",), 4: ("MIG-bbb",)}
    # Releasing gives the instance back (it was refused as "not held" when compared by UUID).
    assert a.release(first.id).state is WorkloadState.RELEASED
    assert a.request(wl("team-a", mig)).allocations[0].gpu_uuids == ("MIG-aaa",)


def test_a_reservation_holds_back_only_work_ordered_after_its_holder(make_allocator: Make) -> None:
    """The node reserved for the first workload blocked by capacity keeps later, smaller work
    off it (no starving of the large request) — but work the queue orders before the holder
    (higher priority) is not held back by it, as a full cycle would decide."""
    a = make_allocator([hgx("n1")])
    a.set_tenant("team-a")
    a.set_quota("team-a", "H100-80GB", guaranteed=8, limit=8)
    a.request(wl("team-a", gpus(1, cpu_milli=60_000), name="running"))
    holder = a.request(wl("team-a", gpus(1, cpu_milli=100_000), name="needs-the-cpus"))
    assert holder.state is WorkloadState.QUEUED and holder.reason == "capacity"
    later = a.request(wl("team-a", gpus(1, cpu_milli=1000), name="backfill"))
    assert later.state is WorkloadState.QUEUED  # it would delay the holder on its node
    urgent = a.request(wl("team-a", gpus(1, cpu_milli=1000), name="urgent", priority=10))
    assert urgent.state is WorkloadState.RUNNING
    assert a.status(holder.id).state is WorkloadState.QUEUED
    assert a.status(later.id).state is WorkloadState.QUEUED


def test_a_reclaim_whose_victims_end_one_at_a_time_preempts_no_more_than_the_claim(
    make_allocator: Callable[[list[Node]], Allocator], clock: ManualClock
) -> None:
    a = make_allocator([hgx("n1")])
    for t in ("team-a", "team-b"):
        a.set_tenant(t, cohort="c")
        a.set_quota(t, "H100-80GB", guaranteed=4, limit=8)
    borrowers = [a.request(wl("team-a", gpus(1), name=f"a{i}")).id for i in range(8)]
    claim = a.request(wl("team-b", gpus(4), name="claim"))
    assert claim.state is WorkloadState.QUEUED

    def preempting() -> set[str]:
        return {w for w in borrowers if a.status(w).state is WorkloadState.PREEMPTING}

    told = preempting()
    assert len(told) == 4
    ended: set[str] = set()
    for victim in sorted(told):
        a.release(victim)  # each victim stops by itself, one at a time
        ended.add(victim)
        # The share still coming from the others is not asked of anyone new.
        assert preempting() | ended == told
    assert a.status(claim.id).state is WorkloadState.RUNNING
    running = {w for w in borrowers if a.status(w).state is WorkloadState.RUNNING}
    assert running == set(borrowers) - told


def test_a_changed_priority_moves_a_workload_in_the_reclaims_order_and_survives_restart(
    make_allocator: Make, clock: ManualClock
) -> None:
    a = make_allocator([hgx("n1")])
    two_tenants(a)
    # team-b fills the node at priority -1000 (a warm pool's); all but the oldest two are
    # raised to 0 while they run (woken to serve).
    ids = []
    for i in range(8):
        ids.append(a.request(wl("team-b", gpus(1), name=f"b{i}", priority=-1000)).id)
        clock.advance(seconds=1)
    for wid in ids[2:]:
        a.set_priority(wid, 0)
    claim = a.request(wl("team-a", gpus(2), name="claim"))
    assert claim.state is WorkloadState.QUEUED
    preempting = [i for i in ids if a.status(i).state is WorkloadState.PREEMPTING]
    assert preempting == ids[:2]  # the lowest priority first, not the youngest
    again = make_allocator([hgx("n1")])
    stored = again.store.workload(ids[7])
    assert stored is not None and stored.priority == 0


def test_a_priority_out_of_range_or_of_an_unknown_workload_changes_nothing(
    make_allocator: Make,
) -> None:
    a = make_allocator([hgx("n1")])
    two_tenants(a)
    wid = a.request(wl("team-a", gpus(1))).id
    with pytest.raises(InvalidRequest, match="priority"):
        a.set_priority(wid, 10**7)
    with pytest.raises(NotFound):
        a.set_priority("no-such-workload", 0)
    stored = a.store.workload(wid)
    assert stored is not None and stored.priority == 0
