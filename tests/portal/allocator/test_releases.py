"""The state's release timelines follow every change of the live workloads: starts,
preemption deadlines, releases, restarts — and they are what a queued workload's ETA reads."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from policies.flavors import FlavorKind
from policies.inventory import Node
from policies.requests import DeviceRequest
from portal.allocator import Allocator
from portal.allocator.releases import LiveTable
from portal.allocator.state import State
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, t4, wl

Make = Callable[[list[Node]], Allocator]


def _index_matches_a_fresh_one(a: Allocator) -> dict[object, list[tuple[float, str, int]]]:
    def both(s: State) -> tuple[object, object]:
        assert s.releases is not None
        return s.releases.snapshot(), LiveTable.of(s.live.values()).releases.snapshot()

    kept, fresh = a.read(both)
    assert kept == fresh
    return kept  # type: ignore[return-value]


def test_timelines_follow_starts_preemption_deadlines_and_releases(
    make_allocator: Make, clock: ManualClock
) -> None:
    a = make_allocator([hgx("n1")])
    for t in ("team-a", "team-b"):
        a.set_tenant(t, cohort="c")
        a.set_quota(t, "H100-80GB", guaranteed=4, limit=8)
    ids = []
    for i in range(8):  # team-b fills the node, 4 of it borrowed from team-a
        ids.append(a.request(wl("team-b", gpus(1), name=f"b{i}"), expected_duration_s=3600).id)
        clock.advance(seconds=1)
    index = _index_matches_a_fresh_one(a)
    assert len(index[("H100-80GB", None)]) == 8
    assert len(index[("H100-80GB", "team-b")]) == 8
    assert ("H100-80GB", "team-a") not in index

    claim = a.request(wl("team-a", gpus(2), name="claim"), expected_duration_s=60)
    assert claim.state is WorkloadState.QUEUED
    preempting = [i for i in ids if a.status(i).state is WorkloadState.PREEMPTING]
    assert len(preempting) == 2
    index = _index_matches_a_fresh_one(a)
    # A preempted holder is expected back at its deadline (300 s grace), not after its hour.
    soonest = index[("H100-80GB", None)][:2]
    assert {wid for _, wid, _ in soonest} == set(preempting)
    assert all(end == pytest.approx(clock.now.timestamp() + 300) for end, _, _ in soonest)
    assert a.status(claim.id).eta_s == pytest.approx(300)

    clock.advance(seconds=301)
    a.tick()
    assert a.status(claim.id).state is WorkloadState.RUNNING
    index = _index_matches_a_fresh_one(a)
    assert not set(preempting) & {wid for _, wid, _ in index[("H100-80GB", None)]}
    assert len(index[("H100-80GB", "team-a")]) == 1

    for wid in ids:
        a.release(wid)
    a.release(claim.id)
    assert _index_matches_a_fresh_one(a) == {}


def test_a_live_table_refuses_changes_that_would_bypass_its_index() -> None:
    table = LiveTable()
    for change in (table.clear, lambda: table.pop("w"), lambda: table.update({}), table.popitem):
        with pytest.raises(TypeError, match="only by assignment and del"):
            change()


def test_a_workload_that_may_use_two_models_waits_for_the_sooner_one(
    make_allocator: Make, clock: ManualClock
) -> None:
    """An H100-or-T4 request starts when the first of either frees: its ETA is the sooner
    of the two, not the one of the model it happens to list first."""
    a = make_allocator([hgx("n1", gpus=2), t4("t1")])
    a.set_tenant("team-a")
    for flavor in ("H100-80GB", "T4"):
        a.set_quota("team-a", flavor, guaranteed=2, limit=4)
    a.request(wl("team-a", gpus(2), name="h100-long"), expected_duration_s=7200)
    a.request(wl("team-a", gpus(2, model="T4"), name="t4-short"), expected_duration_s=600)
    either = DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({"H100-80GB", "T4"}))
    waiting = a.request(wl("team-a", either, name="either"))
    assert waiting.state is WorkloadState.QUEUED
    assert a.status(waiting.id).eta_s == pytest.approx(600)
