"""The warm pool over a real allocator and store (SQLite and PostgreSQL), step by step.

STAND-IN RUNNER, PROBE and CALLS: ``FakeRunner`` stands for ``LocalRunner``, and the health
probe and the sleep and wake calls are recorded instead of reaching an engine, so the order of
events is driven round by round; ``tests/portal/service/test_serve_warm_pool.py`` runs the
same pool with real test-engine processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadRequest
from policies.services import ModelRef, Replicas, ReplicaState
from portal.allocator import Allocator
from portal.inference.backend import ServiceBackend
from portal.inference.controller import ServiceController
from portal.inference.spec import Backend, Engine, Preset, ServiceSpec
from portal.inference.warm import WARM_PRIORITY, gpu_hours
from portal.store import services as stored
from portal.store.records import ReplicaRecord, WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx
from tests.portal.jobs.conftest import FakeRunner

H100 = "H100-80GB"


@dataclass
class Calls:
    """STAND-IN for the engines' ``/sleep`` and ``/wake_up``: the paths asked, by port."""

    made: list[tuple[int, str]] = field(default_factory=list)

    def __call__(self, url: str) -> bool:
        port, path = url.rsplit(":", 1)[1].split("/", 1)
        self.made.append((int(port), "/" + path))
        return True


@dataclass
class Rig:
    alloc: Allocator
    runner: FakeRunner
    calls: Calls
    controller: ServiceController
    tmp: Path

    def again(self) -> ServiceController:
        """A new controller over the same allocator and runner: a restarted portal."""
        c = ServiceController(self.alloc, backend=backend(self.runner, self.calls, self.tmp))
        c.start()
        return c


def backend(runner: FakeRunner, calls: Calls, tmp: Path) -> ServiceBackend:
    return ServiceBackend(Backend.LOCAL, runner, tmp, probe=lambda _url: True, post=calls)


@pytest.fixture
def rig(db_url: str, tmp_path: Path) -> Iterator[Rig]:
    store = Store(db_url)
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([hgx("n1")])
    for tenant in ("team-a", "team-b"):
        alloc.set_tenant(tenant, cohort="lab")
        alloc.set_quota(tenant, H100, guaranteed=4, limit=8)
    runner, calls = FakeRunner(tmp_path), Calls()  # STAND-INs
    controller = ServiceController(alloc, backend=backend(runner, calls, tmp_path))
    controller.start()
    yield Rig(alloc, runner, calls, controller, tmp_path)
    store.close()


def spec(low: int, high: int, warm: int) -> ServiceSpec:
    return ServiceSpec(
        tenant="team-a",
        owner="alice",
        name="llm",
        engine=Engine(preset=Preset.TEST),
        model=ModelRef("file:///models/tiny", "sha256:" + "0" * 64),
        devices=DeviceRequest(kind=FlavorKind.GPU, count=1),
        replicas=Replicas(min=low, max=high, warm=warm),
    )


def live(rig: Rig, sid: str) -> dict[int, ReplicaRecord]:
    return {r.number: r for r in stored.replicas(rig.alloc.store, sid, live=True)}


def priority(rig: Rig, r: ReplicaRecord) -> int:
    rec = rig.alloc.store.workload(r.workload_id)
    assert rec is not None
    return rec.priority


def test_a_warm_pool_keeps_one_asleep_and_a_request_wakes_it_and_the_pool_refills(
    rig: Rig,
) -> None:
    c = rig.controller
    sid = c.deploy(spec(0, 2, 1)).service.id
    c.step()
    (one,) = live(rig, sid).values()
    # Started, loaded, put to sleep: no serving replica, nothing for the gateway.
    assert one.warm and one.state is ReplicaState.ASLEEP and one.pooled
    assert rig.calls.made == [(one.port, "/sleep")]
    assert priority(rig, one) == WARM_PRIORITY
    assert c.ready_urls(sid) == () and c.get(sid).desired == 0
    c.step()
    assert len(rig.runner.launched) == 1  # an asleep replica is kept, not replaced

    # A request comes: the asleep replica is woken (no new engine for it) and serves; the
    # loop's next round refills the pool.
    c.touch(sid)
    assert list(live(rig, sid)) == [1]
    c.step()
    reps = live(rig, sid)
    woken = reps[1]
    assert woken.state is ReplicaState.READY and woken.woken_at is not None
    assert rig.calls.made[1:] == [(one.port, "/wake_up"), (reps[2].port, "/sleep")]
    assert c.ready_urls(sid) == (rig.controller.backend.url(one.port),)  # type: ignore[union-attr]
    assert priority(rig, woken) == 0  # a serving replica now: the service's priority
    assert sorted(reps) == [1, 2] and reps[2].pooled
    launched = [m[0].attempt for m in rig.runner.launched]
    assert launched == [1, 2]  # replica 1 was never launched again
    assert reps[2].state is ReplicaState.ASLEEP
    kinds = [e.kind for e in c.events(sid)]
    assert "service.replica_woken" in kinds and kinds.count("service.replica_asleep") == 2


def test_a_reclaim_takes_the_warm_replicas_before_any_serving_one(rig: Rig) -> None:
    c = rig.controller
    # team-a: 6 serving and 2 warm on the node's 8 GPUs, 4 of them borrowed from team-b.
    sid = c.deploy(spec(6, 6, 2)).service.id
    c.step()
    reps = live(rig, sid)
    assert sum(r.state is ReplicaState.READY for r in reps.values()) == 6
    pooled = {n for n, r in reps.items() if r.pooled}
    assert len(pooled) == 2 and all(reps[n].state is ReplicaState.ASLEEP for n in pooled)
    # team-b takes back 2 of its guarantee: the two warm ones go, every serving one stays.
    claim = rig.alloc.request(
        WorkloadRequest("team-b", "bob", "nb", DeviceRequest(kind=FlavorKind.GPU, count=2))
    )
    assert claim.state is WorkloadState.QUEUED
    c.step()
    assert {number for _sid, number, _grace in rig.runner.stops} == pooled
    c.step()
    rig.alloc.tick()
    assert rig.alloc.status(claim.id).state is WorkloadState.RUNNING
    ready = [r for r in live(rig, sid).values() if r.state is ReplicaState.READY]
    assert len(ready) == 6 and c.view(sid).ready == 6
    # The pool asks again and waits in the queue, holding nothing, never beyond the node.
    waiting = [r for r in live(rig, sid).values() if r.pooled]
    assert len(waiting) == 2 and all(r.state is ReplicaState.QUEUED for r in waiting)
    held = sum(len(a.gpus) for w in rig.alloc.workloads() for a in w.allocations)
    assert held == 8


def test_the_pool_never_goes_beyond_the_tenants_limit(rig: Rig) -> None:
    rig.alloc.set_quota("team-a", H100, guaranteed=2, limit=2)
    c = rig.controller
    sid = c.deploy(spec(1, 2, 2)).service.id
    c.step()
    reps = live(rig, sid)
    # One serving and one warm hold the limit's 2; the second warm one waits for quota.
    assert reps[1].state is ReplicaState.READY and not reps[1].pooled
    states = sorted(r.state for r in reps.values() if r.pooled)
    assert states == [ReplicaState.ASLEEP, ReplicaState.QUEUED]
    queued = next(r for r in reps.values() if r.state is ReplicaState.QUEUED)
    assert rig.alloc.status(queued.workload_id).reason == "quota"


def test_a_restart_re_adopts_asleep_and_woken_replicas_with_their_state(rig: Rig) -> None:
    c = rig.controller
    sid = c.deploy(spec(0, 2, 1)).service.id
    c.step()
    c.touch(sid)
    c.step()
    before = live(rig, sid)
    assert before[1].state is ReplicaState.READY and before[2].state is ReplicaState.ASLEEP
    rig.runner.adoptable = [(sid, 1), (sid, 2)]
    made = len(rig.calls.made)
    again = rig.again()
    again.step()
    after = live(rig, sid)
    assert {n: (r.state, r.pooled) for n, r in after.items()} == {
        1: (ReplicaState.READY, False),
        2: (ReplicaState.ASLEEP, True),
    }
    assert len(rig.runner.launched) == 2 and len(rig.calls.made) == made
    assert again.ready_urls(sid) == c.ready_urls(sid)
    # The pooled one is still the first to wake.
    again.record_scaling(again.get(sid), 2, 0.0, 9.0)
    assert live(rig, sid)[2].state is ReplicaState.READY


def test_gpu_hours_split_where_a_replica_was_woken(rig: Rig) -> None:
    c = rig.controller
    clock = rig.alloc.clock
    assert isinstance(clock, ManualClock)
    start = clock.now
    sid = c.deploy(spec(0, 1, 1)).service.id
    c.step()
    clock.advance(hours=1)  # replica 1 asleep for an hour
    c.touch(sid)
    c.step()  # replica 2 refills the pool
    clock.advance(hours=2)  # replica 1 serves two hours, replica 2 waits in the pool
    end = clock.now
    (hours,) = gpu_hours(rig.alloc.store, [c.get(sid)], start, end, end)
    assert (hours.warm_gpu_hours, hours.serving_gpu_hours) == pytest.approx((3.0, 2.0))
    # A window is a window: the first hour only, all of it warm.
    (first,) = gpu_hours(rig.alloc.store, [c.get(sid)], start, start + timedelta(hours=1), end)
    assert (first.warm_gpu_hours, first.serving_gpu_hours) == pytest.approx((1.0, 0.0))
    # Once deleted, nothing more is counted.
    c.delete(sid)
    c.step()
    clock.advance(hours=5)
    (later,) = gpu_hours(rig.alloc.store, [c.get(sid)], start, clock.now, clock.now)
    assert (later.warm_gpu_hours, later.serving_gpu_hours) == pytest.approx((3.0, 2.0))
