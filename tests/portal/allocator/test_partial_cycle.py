"""Which queued workloads a release retries (its partial cycle, at most
``cycle.PARTIAL_CYCLE_TRIES`` of them): work its own tenant's limit refuses is skipped unless
the release lowered that tenant's own usage; no ``tick`` runs here, so whatever the partial
cycle does not start stays queued."""

from __future__ import annotations

from collections.abc import Callable

from policies.inventory import Node
from portal.allocator import Allocator
from portal.allocator.cycle import PARTIAL_CYCLE_TRIES
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import gpus, hgx, wl

Make = Callable[[list[Node]], Allocator]


def _hog_and_other(a: Allocator) -> None:
    # No guarantees: both borrow from the unguaranteed pool, so any release of either may
    # change everyone's quota verdict (``quota.affected_by_release`` answers None).
    a.set_tenant("hog")
    a.set_tenant("other")
    a.set_quota("hog", "H100-80GB", guaranteed=0, limit=1)
    a.set_quota("other", "H100-80GB", guaranteed=0, limit=8)


def test_work_at_its_own_limit_does_not_use_up_the_tries_of_another_tenants_release(
    make_allocator: Make,
) -> None:
    a = make_allocator([hgx("n1")])
    _hog_and_other(a)
    assert a.request(wl("hog", gpus(1), name="held")).state is WorkloadState.RUNNING
    # More queued work at hog's limit than one release may retry, ordered first (hog holds
    # less, so its dominant share is lower).
    blocked = [
        a.request(wl("hog", gpus(1), name=f"over-{i}")) for i in range(PARTIAL_CYCLE_TRIES + 2)
    ]
    assert {s.reason for s in blocked} == {"quota"}
    running = [a.request(wl("other", gpus(1), name=f"o-{i}")) for i in range(7)]
    assert all(s.state is WorkloadState.RUNNING for s in running)
    waiting = a.request(wl("other", gpus(1), name="one-more"))
    # The pool is lent out whole (hog 1, other 7): the unguaranteed capacity refuses it.
    assert waiting.state is WorkloadState.QUEUED and waiting.reason == "quota"
    order = [e.workload_id for e in a.queue("hog")] + [e.workload_id for e in a.queue("other")]
    assert order.index(waiting.id) == len(blocked)

    a.release(running[0].id)
    # One GPU free: the release's partial cycle reaches "one-more" behind hog's work.
    assert a.status(waiting.id).state is WorkloadState.RUNNING
    assert all(a.status(s.id).state is WorkloadState.QUEUED for s in blocked)
    assert all(a.status(s.id).reason == "quota" for s in blocked)
    held = sum(len(x.gpus) for x in a.allocations() if x.workload_id != waiting.id)
    assert held == 7  # hog's one and other's six: nothing of hog's over its limit started


def test_a_release_by_the_tenant_at_its_limit_retries_its_own_queued_work(
    make_allocator: Make,
) -> None:
    a = make_allocator([hgx("n1")])
    _hog_and_other(a)
    a.set_quota("hog", "H100-80GB", guaranteed=0, limit=2)
    first = a.request(wl("hog", gpus(1), name="first"))
    second = a.request(wl("hog", gpus(1), name="second"))
    pair = a.request(wl("hog", gpus(2), name="pair"))
    assert pair.reason == "quota" and "2/2" in pair.message
    # Its own limit still refuses it, but with new figures: the retry refreshes them.
    a.release(first.id)
    got = a.status(pair.id)
    assert got.state is WorkloadState.QUEUED and "1/2" in got.message
    a.release(second.id)
    assert a.status(pair.id).state is WorkloadState.RUNNING
    (alloc,) = [x for x in a.allocations() if x.workload_id == pair.id]
    assert alloc.amount == 2


def test_another_tenants_release_still_retries_work_its_limit_no_longer_refuses(
    make_allocator: Make,
) -> None:
    a = make_allocator([hgx("n1")])
    _hog_and_other(a)
    # Within its limit, hog waits for the pool the other tenant borrowed whole: a quota
    # verdict the other's release changes.
    fill = [a.request(wl("other", gpus(1), name=f"o-{i}")) for i in range(8)]
    mine = a.request(wl("hog", gpus(1), name="mine"))
    assert mine.state is WorkloadState.QUEUED and mine.reason == "quota"
    a.release(fill[0].id)
    assert a.status(mine.id).state is WorkloadState.RUNNING
