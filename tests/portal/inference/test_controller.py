"""The service controller over a real allocator and store (SQLite and PostgreSQL), with the
jobs' stand-in runner.

STAND-IN RUNNER and PROBE: ``FakeRunner`` (``tests/portal/jobs/conftest.py``) stands for
``LocalRunner`` and the probe for an engine's health path, so that a reclaim's order of events
is driven step by step on a manual clock; the same controller runs real test-engine processes
in ``tests/portal/service/test_serve_services.py`` and ``tests/portal/client/test_services.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadRequest
from policies.services import ModelRef, Replicas, ReplicaState
from portal.allocator import Allocator
from portal.inference.backend import ServiceBackend
from portal.inference.controller import ServiceController
from portal.inference.spec import Backend, Engine, Preset, ServiceSpec
from portal.store import services as stored
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx
from tests.portal.jobs.conftest import FakeRunner

H100 = "H100-80GB"


@pytest.fixture
def store_url(db_url: str) -> str:
    return db_url


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def rig(
    store_url: str, tmp_path: Path, clock: ManualClock
) -> Iterator[tuple[Allocator, FakeRunner, ServiceController]]:
    store = Store(store_url)
    alloc = Allocator(store, clock=clock)
    alloc.start([hgx("n1")])
    alloc.set_tenant("team-a", cohort="lab")
    alloc.set_tenant("team-b", cohort="lab")
    alloc.set_quota("team-a", H100, guaranteed=4, limit=8)
    alloc.set_quota("team-b", H100, guaranteed=4, limit=8)
    runner = FakeRunner(tmp_path)  # STAND-IN runner
    backend = ServiceBackend(Backend.LOCAL, runner, tmp_path, probe=lambda _url: True)
    controller = ServiceController(alloc, backend=backend)
    controller.start()
    yield alloc, runner, controller
    store.close()


def spec(n: int) -> ServiceSpec:
    return ServiceSpec(
        tenant="team-a",
        owner="alice",
        name="llm",
        engine=Engine(preset=Preset.TEST),
        model=ModelRef("file:///models/tiny", "sha256:" + "0" * 64),
        devices=DeviceRequest(kind=FlavorKind.GPU, count=1),
        replicas=Replicas(min=n, max=n),
    )


def test_a_reclaim_stops_borrowed_replicas_with_the_allocators_grace_and_they_wait_again(
    rig: tuple[Allocator, FakeRunner, ServiceController],
) -> None:
    alloc, runner, controller = rig
    # team-a serves on all 8 GPUs: 4 of them borrowed from team-b's guarantee.
    sid = controller.deploy(spec(8)).service.id
    controller.step()
    view = controller.view(sid)
    assert view.ready == 8 and len(runner.launched) == 8
    launched = {m[0].attempt: m[0].devices for m in runner.launched}
    assert sorted(d for ds in launched.values() for d in ds) == [str(i) for i in range(8)]
    # team-b takes its guarantee back.
    claim = alloc.request(
        WorkloadRequest("team-b", "bob", "nb", DeviceRequest(kind=FlavorKind.GPU, count=4))
    )
    assert claim.state is WorkloadState.QUEUED
    controller.step()
    stopped = [(number, grace) for _sid, number, grace in runner.stops]
    assert len(stopped) == 4
    assert {grace for _n, grace in stopped} == {alloc.grace_for("inference").total_seconds()}
    # The stand-in's stop ends them at once: their devices go back, the claimant runs.
    # (Victims released one by one can make the allocator preempt more borrowers than the
    # claim needs; so the rest checks what must hold whatever the count.)
    for _ in range(4):
        controller.step()
        alloc.tick()
    assert alloc.status(claim.id).state is WorkloadState.RUNNING
    reps = stored.replicas(alloc.store, sid)
    ended = [r for r in reps if r.state is ReplicaState.ENDED]
    assert len(ended) >= 4 and all(r.reason.startswith("preempted") for r in ended)
    # The service still wants 8: what does not fit waits in the queue, holding nothing, and
    # the devices in use never exceed the node's.
    live = stored.replicas(alloc.store, sid, live=True)
    assert len(live) == 8
    waiting = [r for r in live if r.state is ReplicaState.QUEUED]
    assert waiting
    for r in waiting:
        st = alloc.status(r.workload_id)
        assert st.state is WorkloadState.QUEUED and st.reason and not st.allocations
    held = sum(len(a.gpus) for w in alloc.workloads() for a in w.allocations)
    assert held <= 8
    ready = controller.ready_urls(sid)
    assert len(ready) == sum(1 for r in live if r.state is ReplicaState.READY)


def test_a_reclaim_takes_the_newest_borrowed_replicas_first(
    rig: tuple[Allocator, FakeRunner, ServiceController], clock: ManualClock
) -> None:
    alloc, runner, controller = rig
    # team-a: replicas 1-6 start together, 7 and 8 a minute later (a scale up); 4 of the 8
    # GPUs are borrowed from team-b's guarantee.
    sid = controller.deploy(spec(6)).service.id
    controller.step()
    clock.advance(minutes=1)
    controller.scale(sid, replicas=Replicas(min=8, max=8))
    controller.step()
    assert controller.view(sid).ready == 8
    # team-b takes back 3: the two started last, then the last requested of those started
    # together (6, not one of 1-5 by the luck of its workload id).
    claim = alloc.request(
        WorkloadRequest("team-b", "bob", "nb", DeviceRequest(kind=FlavorKind.GPU, count=3))
    )
    assert claim.state is WorkloadState.QUEUED
    controller.step()
    assert sorted(number for _sid, number, _grace in runner.stops) == [6, 7, 8]
    grace = alloc.grace_for("inference").total_seconds()
    assert {g for _sid, _n, g in runner.stops} == {grace}


def test_a_restart_ends_replicas_whose_process_is_gone_and_keeps_the_others(
    rig: tuple[Allocator, FakeRunner, ServiceController], tmp_path: Path
) -> None:
    alloc, runner, controller = rig
    sid = controller.deploy(spec(2)).service.id
    controller.step()
    assert controller.view(sid).ready == 2
    # A new controller (a restarted portal) finds only replica 1's process still running.
    runner.adoptable = [(sid, 1)]
    again = ServiceController(
        alloc, backend=ServiceBackend(Backend.LOCAL, runner, tmp_path, probe=lambda _u: True)
    )
    again.start()
    states = {r.number: r.state for r in stored.replicas(alloc.store, sid)}
    assert states == {1: ReplicaState.READY, 2: ReplicaState.ENDED}
    gone = next(r for r in stored.replicas(alloc.store, sid) if r.number == 2)
    assert alloc.status(gone.workload_id).state is WorkloadState.RELEASED
    again.step()  # a replacement for the lost one
    assert [r.number for r in stored.replicas(alloc.store, sid, live=True)] == [1, 3]
