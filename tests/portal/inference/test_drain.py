"""A ready replica chosen for removal drains: out of the gateway's rotation at once, stopped
only when nothing is in flight to it (the gateway's count, ``TrafficBook``) or after the
drain timeout; wanted again while draining, it serves again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.errors import InvalidRequest
from policies.services import Replicas, ReplicaState
from portal.allocator import Allocator
from portal.inference.controller import ServiceController
from portal.inference.service import build_for_service
from portal.settings import load_settings
from portal.store import services as stored
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx
from tests.portal.inference.test_warm_pool import H100, Calls, backend, spec
from tests.portal.jobs.conftest import FakeRunner


@pytest.fixture
def rig(db_url: str, tmp_path: Path) -> Iterator[tuple[ServiceController, FakeRunner]]:
    store = Store(db_url)
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([hgx("n1")])
    alloc.set_tenant("team-a", cohort="lab")
    alloc.set_quota("team-a", H100, guaranteed=4, limit=8)
    runner = FakeRunner(tmp_path)  # STAND-IN for the engine processes
    c = ServiceController(alloc, backend=backend(runner, Calls(), tmp_path), drain_timeout_s=30)
    c.start()
    yield c, runner
    store.close()


def two_ready(c: ServiceController) -> tuple[str, str, str]:
    sid = c.deploy(spec(2, 2, 0)).service.id
    c.step()
    assert c.backend is not None
    by_number = {r.number: c.backend.url(r.port or 0) for r in stored.replicas(c.store, sid)}
    assert sorted(c.ready_urls(sid)) == sorted(by_number.values())
    return sid, by_number[1], by_number[2]  # scaling down stops the newest: replica 2


def states(c: ServiceController, sid: str) -> dict[int, ReplicaState]:
    return {r.number: r.state for r in stored.replicas(c.store, sid, live=True)}


def test_a_replica_scaled_down_drains_until_its_last_request_ends(
    rig: tuple[ServiceController, FakeRunner],
) -> None:
    c, runner = rig
    sid, one, two = two_ready(c)
    c.traffic.enter(two)  # the gateway streams an answer from replica 2
    c.scale(sid, replicas=Replicas(min=1, max=1))
    assert c.ready_urls(sid) == (one,)  # no new request goes to it
    assert states(c, sid) == {1: ReplicaState.READY, 2: ReplicaState.STOPPING}
    c.step()
    c.step()
    assert runner.stops == []  # its answer goes on
    c.traffic.leave(two)
    c.step()
    assert [(n, g) for _, n, g in runner.stops] == [(2, 10.0)]
    c.step()
    assert states(c, sid) == {1: ReplicaState.READY}
    kinds = [e.kind for e in c.events(sid)]
    assert kinds.index("service.replica_draining") < kinds.index("service.replica_stopping")


def test_a_replica_that_does_not_drain_in_time_is_stopped(
    rig: tuple[ServiceController, FakeRunner],
) -> None:
    c, runner = rig
    clock = c._alloc.clock
    assert isinstance(clock, ManualClock)
    sid, _, two = two_ready(c)
    c.traffic.enter(two)  # never answered to the end
    c.scale(sid, replicas=Replicas(min=1, max=1))
    clock.advance(seconds=29)
    c.step()
    assert runner.stops == []
    clock.advance(seconds=2)
    c.step()
    assert [n for _, n, _ in runner.stops] == [2]


def test_a_replica_with_nothing_in_flight_is_stopped_at_once(
    rig: tuple[ServiceController, FakeRunner],
) -> None:
    c, runner = rig
    sid, one, _ = two_ready(c)
    c.scale(sid, replicas=Replicas(min=1, max=1))
    assert [n for _, n, _ in runner.stops] == [2]
    assert c.ready_urls(sid) == (one,)


def test_a_request_while_going_to_zero_puts_the_draining_replica_back(
    rig: tuple[ServiceController, FakeRunner],
) -> None:
    c, runner = rig
    sid = c.deploy(spec(0, 1, 0)).service.id
    c.step()
    (url,) = c.ready_urls(sid)
    c.traffic.enter(url)
    c.record_scaling(c.get(sid), 0, 60.0, None)  # the idle timer: to zero
    assert c.ready_urls(sid) == ()
    c.touch(sid)  # a request came: no ready replica, so the gateway wakes the service
    assert c.ready_urls(sid) == (url,)  # the same engine, loaded, without a cold start
    c.step()
    assert runner.stops == [] and len(runner.launched) == 1
    assert states(c, sid) == {1: ReplicaState.READY}


def test_after_a_restart_a_draining_replica_is_stopped(
    rig: tuple[ServiceController, FakeRunner], tmp_path: Path
) -> None:
    c, runner = rig
    sid, _, two = two_ready(c)
    c.traffic.enter(two)
    c.scale(sid, replicas=Replicas(min=1, max=1))
    runner.adoptable = [(sid, 1), (sid, 2)]
    again = ServiceController(c._alloc, backend=backend(runner, Calls(), tmp_path))
    again.start()
    again.step()  # the new gateway has nothing in flight to it
    assert [n for _, n, _ in runner.stops] == [2]
    again.step()
    assert states(again, sid) == {1: ReplicaState.READY}


@pytest.mark.parametrize("value", ["-1", "soon", "3601"])
def test_a_bad_drain_timeout_names_the_variable(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPORTAL_DRAIN_TIMEOUT_S", value)
    with pytest.raises(InvalidRequest, match="GPUPORTAL_DRAIN_TIMEOUT_S"):
        load_settings()


def test_serve_drains_for_the_configured_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPORTAL_DRAIN_TIMEOUT_S", "7.5")
    settings = load_settings(state_dir=tmp_path)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        controller = build_for_service(Allocator(store), settings)
        assert controller._drains.timeout_s == 7.5
    finally:
        store.close()
