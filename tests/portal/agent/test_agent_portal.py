"""The agent end to end: fake NVML → sampler → reporter → the real portal API (uvicorn on
loopback, a real allocator and telemetry store on SQLite) → the stored series.

The portal's inventory is the node the agent discovers (the local backend), so the GPU UUIDs
match; a notebook server process on the allocated GPU carries the spawner's
``GPUPORTAL_WORKLOAD_ID`` in its environment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from policies.flavors import FlavorKind
from policies.inventory import Node
from policies.requests import DeviceRequest, WorkloadRequest
from portal.agent.attribution import ProcessAttributor
from portal.agent.reporter import Backoff, Reporter
from portal.agent.run import Agent, NvmlSource
from portal.allocator import Allocator
from portal.inventory import nvml
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock
from tests.support import fake_nvml
from tests.support.fake_nvml import FakeMachine, FakeProcess
from tests.support.portal_server import PREFIX, serve
from tests.support.ports import free_port


class Seconds:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Setup:
    def __init__(self, tmp_path: Path, machine: FakeMachine) -> None:
        self.machine = machine
        self.store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
        self.alloc = Allocator(self.store, clock=ManualClock())
        self.node = nvml.discover("gpu-1")
        self.alloc.start([self.node])
        self.alloc.set_tenant("team-a")
        self.alloc.set_quota("team-a", "T4", guaranteed=2, limit=2)
        request = DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({"T4"}))
        self.workload = self.alloc.request(WorkloadRequest("team-a", "alice", "nb", request)).id
        self.gpu = self.alloc.status(self.workload).allocations[0].gpu_uuids[0]
        index = next(g.index for g in self.node.gpus if g.uuid == self.gpu)
        # The notebook server (pid 300) runs on the allocated GPU at 61 %.
        usage = machine.gpus[index].usage
        usage.gpu_pct, usage.memory_used_mib = 61, 2000
        usage.processes = (FakeProcess(300, 2000, sm_pct=61),)
        proc = tmp_path / "proc" / "300"
        proc.mkdir(parents=True)
        proc.joinpath("environ").write_bytes(
            f"GPUPORTAL_WORKLOAD_ID={self.workload}\0JUPYTERHUB_USER=alice\0".encode()
        )
        self.source = NvmlSource("gpu-1", ProcessAttributor(tmp_path / "proc"))


@pytest.fixture
def setup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Setup]:
    machine = fake_nvml.t4_two_sockets()
    fake_nvml.install(monkeypatch, machine)
    s = Setup(tmp_path, machine)
    yield s
    s.source.close()
    s.store.close()


def series_of(base: str, workload: str) -> list[dict[str, object]]:
    r = httpx.get(
        f"{base}/api/v1/telemetry/series",
        params={"workload_id": workload, "resolution": "raw", "start": time.time() - 600},
        headers={"Authorization": "token ops"},
    )
    assert r.status_code == 200, r.text
    points: list[dict[str, object]] = r.json()["series"][0]["points"]
    return points


def test_agent_samples_reach_the_portal_attributed_to_the_workload(setup: Setup) -> None:
    with serve(setup.alloc, free_port()) as base, httpx.Client(base_url=base) as client:
        reporter = Reporter(client, "agent")
        agent = Agent(setup.source, reporter.submit, reporter.flush)

        assert agent.tick() == 2  # two T4s
        assert reporter.pending == 0
        assert reporter.stats.last_result is not None
        assert (reporter.stats.last_result.accepted, reporter.stats.last_result.rejected) == (2, 0)

        points = series_of(base, setup.workload)
    assert len(points) == 1
    assert points[0]["utilization_avg"] == 61
    assert points[0]["memory_used_avg"] == 2000


def test_portal_outage_keeps_batches_and_delivers_them_when_it_is_back(setup: Setup) -> None:
    port = free_port()
    clock = Seconds()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}{PREFIX}", timeout=2) as client:
        reporter = Reporter(client, "agent", backoff=Backoff(first=1, cap=4), clock=clock)
        agent = Agent(setup.source, reporter.submit, reporter.flush)
        for _ in range(3):  # nothing listens: no exception, the batches wait
            agent.tick()
            time.sleep(0.01)  # distinct sample times
        assert (reporter.pending, reporter.stats.failures) == (3, 1)  # backing off after one
        assert "portal unreachable" in reporter.stats.last_error

        with serve(setup.alloc, port) as base:
            assert not reporter.flush()  # still inside the 1 s backoff: no attempt
            clock.t += 1
            assert reporter.flush()
            assert (reporter.pending, reporter.stats.sent, reporter.stats.failures) == (0, 3, 0)
            points = series_of(base, setup.workload)
    assert len(points) == 3


def test_a_full_buffer_drops_the_oldest_batch(setup: Setup) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{free_port()}", timeout=2) as client:
        reporter = Reporter(client, "agent", max_batches=2, clock=Seconds())
        agent = Agent(setup.source, reporter.submit, reporter.flush)
        times = []
        for _ in range(3):
            agent.tick()
            times.append(time.time())
            time.sleep(0.01)
        assert (reporter.pending, reporter.stats.dropped) == (2, 1)
        kept = [b.samples[0].at for b in reporter.queued]
    # The first round's batch (sampled before times[0]) is the one dropped.
    assert times[0] < kept[0] < times[1] < kept[1] < times[2]


def test_a_token_without_the_scope_keeps_the_batch_for_a_fixed_token(setup: Setup) -> None:
    with serve(setup.alloc, free_port()) as base, httpx.Client(base_url=base) as client:
        clock = Seconds()
        reporter = Reporter(client, "ops", clock=clock)
        agent = Agent(setup.source, reporter.submit, reporter.flush)
        agent.tick()
        assert reporter.pending == 1
        assert reporter.stats.last_error.startswith("portal answered 403")


def test_a_wrong_portal_url_is_an_error_not_a_success(setup: Setup) -> None:
    with serve(setup.alloc, free_port()) as base:
        origin = base.removesuffix(PREFIX)
        with httpx.Client(base_url=f"{origin}/elsewhere") as client:
            reporter = Reporter(client, "agent", clock=Seconds())
            Agent(setup.source, reporter.submit, reporter.flush).tick()
    assert reporter.pending == 1
    assert reporter.stats.last_error.startswith("portal answered 404")


def test_a_lost_gpu_is_logged_and_the_loop_rediscovers_until_it_is_back(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    delivered: list[object] = []
    agent = Agent(setup.source, delivered.append)
    assert agent.tick() == 2
    setup.machine.gpus[0].lost = True  # fell off the bus

    assert agent.tick() == 0
    assert agent.tick() == 0  # rediscovery fails too while it is lost
    assert caplog.text.count("sampling failed, retrying next round") == 2
    setup.machine.gpus[0].lost = False
    assert agent.tick() == 2
    assert len(delivered) == 2


def test_the_loop_runs_on_schedule_until_stopped(setup: Setup) -> None:
    delivered: list[object] = []
    stop = threading.Event()
    agent = Agent(setup.source, delivered.append, interval_s=0.05)
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    time.sleep(0.5)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert 4 <= len(delivered) <= 12


def test_rediscovery_announces_changed_nodes_and_retries_failed_announcements(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    machine = fake_nvml.h100_mig()
    fake_nvml.install(monkeypatch, machine)
    clock = Seconds()
    announced: list[int] = []
    answers = iter([False, True, True])

    def announce(node: Node) -> bool:
        announced.append(len(node.gpus[0].mig_layout))
        return next(answers)

    source = NvmlSource(
        "n1", ProcessAttributor(tmp_path), rediscover_s=60, on_discovered=announce, clock=clock
    )
    source.batches()  # first discovery: the write fails
    clock.t += 60
    source.batches()  # same node, but not announced yet: again, and it works
    clock.t += 60
    source.batches()  # unchanged: nothing to announce
    machine.gpus[0].instances = machine.gpus[0].instances[:1]  # an instance was destroyed
    clock.t += 60
    source.batches()
    source.close()

    assert announced == [2, 2, 1]


def test_a_backlog_drains_a_limited_number_of_batches_per_flush(setup: Setup) -> None:
    with serve(setup.alloc, free_port()) as base, httpx.Client(base_url=base) as client:
        reporter = Reporter(client, "agent")
        for _ in range(5):
            for batch in setup.source.batches():
                reporter.submit(batch)
            time.sleep(0.01)

        assert not reporter.flush(limit=2)
        assert (reporter.pending, reporter.stats.sent) == (3, 2)
        assert reporter.flush(limit=3)
        assert (reporter.pending, reporter.stats.sent) == (0, 5)
