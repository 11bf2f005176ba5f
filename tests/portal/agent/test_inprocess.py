"""The agent inside the service (local backend): the service's loop registry and telemetry,
a real allocator on SQLite, the fake NVML underneath."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadRequest
from portal.agent import inprocess
from portal.allocator import Allocator
from portal.inventory import nvml
from portal.service.loops import Loops
from portal.store.writer import Store
from portal.telemetry.reads import Point, Resolution, series
from portal.telemetry.service import Telemetry
from portal.telemetry.wire import IngestResult, SampleBatch
from tests.portal.allocator.conftest import ManualClock
from tests.support import fake_nvml
from tests.support.fake_nvml import Driver, FakeProcess


def test_the_service_loop_samples_this_host_into_the_portals_telemetry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    machine = fake_nvml.t4_two_sockets()
    fake_nvml.install(monkeypatch, machine)
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([nvml.discover("box")])
    alloc.set_tenant("team-a")
    alloc.set_quota("team-a", "T4", guaranteed=1, limit=1)
    request = DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({"T4"}))
    workload = alloc.request(WorkloadRequest("team-a", "alice", "nb", request)).id
    gpu = alloc.status(workload).allocations[0].gpu_uuids[0]
    machine.gpus[[g.uuid for g in machine.gpus].index(gpu)].usage.gpu_pct = 44
    machine.gpus[0].usage.processes = (FakeProcess(321, 100),)  # nobody's: not attributed
    telemetry = Telemetry(alloc, attribution_ttl_s=0)
    loops = Loops()

    source = inprocess.register(loops, telemetry, "box", interval_s=0.05, proc_root=tmp_path)
    assert source is not None
    loops.start()
    try:
        points = _raw_points(telemetry, workload, at_least=2)
    finally:
        loops.stop()
        source.close()
        store.close()
    assert len(points) >= 2
    assert {p.utilization_avg for p in points} == {44.0}


def test_without_a_driver_no_loop_is_added(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake_nvml.install(monkeypatch, fake_nvml.no_driver(Driver.MISSING))
    loops = Loops()
    assert inprocess.register(loops, _NoIngest(), "box") is None
    assert "node agent not started: no NVIDIA driver found" in caplog.text
    loops.add(inprocess.LOOP_NAME, 1.0, lambda: None)  # the name is still free


def _raw_points(telemetry: Telemetry, workload: str, at_least: int) -> list[Point]:
    """The workload's raw points of the last minute once there are ``at_least`` (or what
    there is after 10 s)."""
    deadline = time.monotonic() + 10
    points: list[Point] = []
    while len(points) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
        now = time.time()
        points = series(
            telemetry.store.engine,
            resolution=Resolution.RAW,
            start=now - 60,
            end=now + 1,
            workload_id=workload,
        )
    return points


class _NoIngest:
    def ingest(self, batch: SampleBatch) -> IngestResult:
        raise AssertionError("nothing may be ingested")


def test_a_simulated_inventory_gets_synthetic_samples_attributed_to_its_workloads(
    tmp_path: Path,
) -> None:
    from portal.inventory.simulated import generate

    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store)
    alloc.start(generate({"t4-2": 1}))
    alloc.set_tenant("team-a")
    alloc.set_quota("team-a", "T4", guaranteed=1, limit=1)
    request = DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({"T4"}))
    workload = alloc.request(WorkloadRequest("team-a", "alice", "nb", request)).id
    (uuid,) = alloc.status(workload).allocations[0].gpu_uuids
    assert uuid.startswith("GPU-sim-t4-2-1-")
    telemetry = Telemetry(alloc, attribution_ttl_s=0)
    loops = Loops()
    inprocess.register_simulated(
        loops, telemetry, lambda: alloc.inspect(lambda c: [s.node for s in c]), interval_s=0.05
    )
    loops.start()
    try:
        points = _raw_points(telemetry, workload, at_least=1)
    finally:
        loops.stop()
        store.close()
    # The demo wave stays within 50 ± 45 %.
    assert points and all(
        p.utilization_avg is not None and 5.0 <= p.utilization_avg <= 95.0 for p in points
    )
