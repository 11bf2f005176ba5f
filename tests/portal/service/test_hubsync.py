"""The hub reconcile's decisions on a real allocator: which notebook workloads it releases.

The hub side (``HubServers`` reading a real hub's ``GET /users``) runs in the demo's hub tests
(``tests/portal/test_demo.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.requests import WorkloadKind, WorkloadRequest
from portal.allocator import Allocator
from portal.service.hubsync import SERVER_GONE, Servers, release_gone
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, gpus, hgx


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def allocator(tmp_path: Path, clock: ManualClock) -> Iterator[Allocator]:
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store, clock=clock)
    alloc.start([hgx("n1")])
    alloc.set_tenant("team-a")
    alloc.set_quota("team-a", "H100-80GB", guaranteed=8, limit=8)
    yield alloc
    store.close()


def _ask(
    alloc: Allocator, owner: str, name: str, kind: WorkloadKind = WorkloadKind.NOTEBOOK
) -> str:
    return alloc.request(WorkloadRequest("team-a", owner, name, gpus(1), kind=kind)).id


def test_notebooks_of_servers_the_hub_no_longer_runs_are_released_with_the_reason(
    allocator: Allocator, clock: ManualClock
) -> None:
    kept = _ask(allocator, "alice", "alice/default")  # her default server runs
    named = _ask(allocator, "alice", "alice/big")  # a named server that runs
    gone = _ask(allocator, "bob", "bob/default")  # bob's server is gone
    other = _ask(allocator, "bob", "finetune")  # not a spawner's name: nothing to check
    job = _ask(allocator, "bob", "bob/train", WorkloadKind.JOB)  # not a notebook
    clock.advance(seconds=60)
    running: Servers = {("alice", ""), ("alice", "big")}
    assert release_gone(allocator, lambda: running, now=clock) == [gone]
    assert allocator.status(gone).state is WorkloadState.RELEASED
    assert allocator.status(gone).reason == SERVER_GONE
    for wid in (kept, named, other, job):
        assert allocator.status(wid).state is WorkloadState.RUNNING


def test_a_young_or_queued_workload_is_left_to_its_spawn_and_a_hub_error_releases_nothing(
    allocator: Allocator, clock: ManualClock
) -> None:
    young = _ask(allocator, "bob", "bob/default")
    for i in range(7):  # team-a's other seven GPUs
        _ask(allocator, f"u{i}", "held")
    queued = _ask(allocator, "carol", "carol/default")
    assert allocator.status(queued).state is WorkloadState.QUEUED
    assert release_gone(allocator, set, min_age_s=30, now=clock) == []
    clock.advance(seconds=31)

    def hub_down() -> Servers:
        raise ConnectionError("hub down")

    with pytest.raises(ConnectionError):
        release_gone(allocator, hub_down, min_age_s=30, now=clock)
    assert allocator.status(young).state is WorkloadState.RUNNING
    assert release_gone(allocator, set, min_age_s=30, now=clock) == [young]
    # carol's spawn may come back for its queue place; once allocated with no server to take
    # it, the round after its minimum age releases it.
    assert allocator.status(queued).state is WorkloadState.RUNNING
    assert release_gone(allocator, set, min_age_s=30, now=clock) == []
    clock.advance(seconds=31)
    assert release_gone(allocator, set, min_age_s=30, now=clock) == [queued]
