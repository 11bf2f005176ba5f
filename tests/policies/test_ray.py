"""Scale plans of Ray clusters: which slices a new worker count releases or requests."""

from __future__ import annotations

import pytest

from policies.errors import InvalidRequest
from policies.ray import (
    RayState,
    ScalePlan,
    SliceFacts,
    check_bounds,
    is_idle,
    plan_scale,
    workers_for_demand,
)

BASE = SliceFacts(1, 2)


def test_growing_requests_the_difference_as_one_slice() -> None:
    assert plan_scale([BASE], 4) == ScalePlan((), 2)  # 2 -> 4: +2 only


def test_the_same_count_changes_nothing() -> None:
    assert plan_scale([BASE, SliceFacts(2, 2)], 4) == ScalePlan((), 0)


def test_shrinking_releases_whole_slices_newest_first() -> None:
    # 2 + 2 + 1 = 5 -> 2: slices 3 (1) and 2 (2) go, nothing is requested.
    assert plan_scale([BASE, SliceFacts(2, 2), SliceFacts(3, 1)], 2) == ScalePlan((3, 2), 0)


def test_a_shrink_inside_a_slice_requests_the_remainder() -> None:
    # 2 + 3 = 5 -> 3: slice 2 goes (left 2), +1 is requested again.
    assert plan_scale([BASE, SliceFacts(2, 3)], 3) == ScalePlan((2,), 1)


def test_the_first_slice_is_never_released() -> None:
    assert plan_scale([BASE, SliceFacts(2, 1)], 0) == ScalePlan((2,), 0)


def test_bounds_name_the_field() -> None:
    with pytest.raises(InvalidRequest) as e:
        check_bounds("workers.replicas", 5, 1, 4)
    assert e.value.field == "workers.replicas"
    assert "1 to 4" in e.value.valid


def test_a_cluster_is_idle_once_every_node_has_been_idle_that_long() -> None:
    assert is_idle([5_000, 3_000], 3.0)
    assert not is_idle([5_000, 2_999], 3.0)  # one node ran something 2.999 s ago
    assert not is_idle([], 3.0)  # nothing read: never idle


def test_only_idle_and_suspended_clusters_hold_nothing_until_resumed() -> None:
    assert {s for s in RayState if s.released} == {RayState.IDLE, RayState.SUSPENDED}
    assert not RayState.IDLE.terminal and not RayState.SUSPENDED.terminal


def test_unmet_gpu_demand_asks_for_as_few_workers_as_hold_it_within_the_room_left() -> None:
    assert workers_for_demand([(1.0, 3)], 1, 8) == 3
    assert workers_for_demand([(1.0, 3)], 2, 8) == 2  # two 1-GPU tasks share a 2-GPU worker
    assert workers_for_demand([(2.0, 1), (1.0, 2)], 2, 8) == 2  # largest first
    assert workers_for_demand([(0.5, 3)], 1, 8) == 2  # fractions pack
    assert workers_for_demand([(1.0, 1_000_000)], 1, 3) == 3  # bounded by the room left
    assert workers_for_demand([(4.0, 2)], 2, 8) == 0  # fits no worker: adding one is no use
    assert workers_for_demand([(1.0, 2)], 1, 0) == 0  # already at max
    assert workers_for_demand([], 1, 8) == 0
