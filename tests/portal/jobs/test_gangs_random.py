"""Randomized capacities and arrivals: a job's gang is placed whole or not at all.

Each example builds a small cluster (1-4 nodes of 2, 4 or 8 GPUs), submits jobs of random
members x GPUs, and then, in random order, completes or fails running jobs, loses nodes and
adds capacity, stepping the controller between events. After every step, for every job:
its attempt holds either no allocation or one per member, a job that waits holds nothing,
and every launch the runner saw had all the members. One allocator and store serve all the
examples (a fresh database per example would cost more than the example): each example uses
nodes of its own and ends every job it started.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.jobs import JobState, RestartPolicy
from portal.allocator import Allocator
from portal.jobs.controller import JobController
from portal.store import jobs as stored
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx
from tests.portal.jobs.conftest import H100, FakeRunner, job, make_backend

EXAMPLES = int(os.environ.get("GANG_EXAMPLES", "1000"))


@dataclass
class World:
    alloc: Allocator
    clock: ManualClock
    runner: FakeRunner
    jobs: JobController
    names: Iterator[int]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("gangs")
    store = Store("sqlite:///:memory:")  # one real SQLite database, kept in memory: fast
    clock = ManualClock()
    alloc = Allocator(store, clock=clock)
    alloc.start([])
    alloc.set_tenant("team-a")
    # Quota never binds here: capacity alone decides, so gangs meet every shape of shortage.
    alloc.set_quota("team-a", H100, guaranteed=100_000, limit=100_000, overcommit=True)
    runner = FakeRunner(Path(tmp))  # STAND-IN runner: members exit when the test says
    controller = JobController(alloc, backend=make_backend(runner))
    controller.start()
    yield World(alloc, clock, runner, controller, itertools.count())
    store.close()


def check_no_partial_gang(w: World) -> None:
    for j in stored.active_jobs(w.alloc.store):
        members = int(j.spec["members"])  # type: ignore[call-overload]
        assert j.workload_id is not None or j.state is JobState.BACKOFF
        if j.workload_id is None:
            continue
        st = w.alloc.status(j.workload_id)
        assert len(st.allocations) in (0, members), (j.id, len(st.allocations), members)
        assert len({a.member for a in st.allocations}) == len(st.allocations)
        if st.state is WorkloadState.QUEUED:
            assert st.allocations == ()  # waiting holds no device (and so no quota)
        if j.state is JobState.RUNNING and st.state is WorkloadState.RUNNING:
            assert len(st.allocations) == members
    for launched in w.runner.launched:
        owner = stored.job(w.alloc.store, launched[0].job_id)
        assert owner is not None
        members = int(owner.spec["members"])  # type: ignore[call-overload]
        assert sorted(m.rank for m in launched) == list(range(members))


shapes = st.tuples(st.integers(1, 5), st.sampled_from([1, 2, 4, 8]))
events = st.lists(
    st.one_of(
        st.tuples(st.just("complete"), st.integers(0, 7)),
        st.tuples(st.just("fail"), st.integers(0, 7)),
        st.tuples(st.just("lose"), st.integers(0, 3)),
        st.tuples(st.just("add"), st.sampled_from([2, 4, 8])),
        st.tuples(st.just("arrive"), shapes),
    ),
    max_size=8,
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    nodes=st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=4),
    arrivals=st.lists(shapes, min_size=1, max_size=5),
    later=events,
)
def test_gangs_are_placed_whole_or_not_at_all(
    world: World, nodes: list[int], arrivals: list[tuple[int, int]], later: list[tuple[str, object]]
) -> None:
    w = world
    mine: dict[str, int] = {}
    for size in nodes:
        name = f"e{next(w.names)}"
        mine[name] = size
        w.alloc.node_added(hgx(name, gpus=size))
    submitted: list[str] = []
    policy = RestartPolicy(max_restarts=1, backoff_s=0, backoff_cap_s=0)

    def arrive(members: int, gpus: int) -> None:
        # Only what this cluster could ever hold (a bigger ask is a 422, tested elsewhere).
        if gpus <= max(mine.values()) and members * gpus <= sum(mine.values()):
            submitted.append(w.jobs.submit(job(members, gpus, restart=policy)).job.id)

    def step() -> None:
        w.alloc.tick()
        w.jobs.step()
        check_no_partial_gang(w)

    for members, gpus in arrivals:
        arrive(members, gpus)
        step()
    for kind, arg in later:
        running = [
            j
            for j in (stored.job(w.alloc.store, i) for i in submitted)
            if j is not None and j.state is JobState.RUNNING
        ]
        if kind in ("complete", "fail") and running:
            j = running[int(arg) % len(running)]  # type: ignore[call-overload]
            for rank in range(int(j.spec["members"])):  # type: ignore[call-overload]
                w.runner.exit(j.id, j.attempt, rank, 0 if kind == "complete" else 1)
        elif kind == "lose" and len(mine) > 1:
            gone = sorted(mine)[int(arg) % len(mine)]  # type: ignore[call-overload]
            del mine[gone]
            w.alloc.node_removed(gone)
        elif kind == "add":
            name = f"e{next(w.names)}"
            mine[name] = int(arg)  # type: ignore[call-overload]
            w.alloc.node_added(hgx(name, gpus=int(arg)))  # type: ignore[call-overload]
        elif kind == "arrive":
            members, gpus = arg  # type: ignore[misc]
            arrive(members, gpus)
        step()
    # Leave nothing behind for the next example.
    for jid in submitted:
        w.jobs.cancel(jid)
    for name in mine:
        w.alloc.node_removed(name)
    assert not [x for x in w.alloc.workloads() if x.tenant == "team-a"]
    w.runner.launched.clear()
