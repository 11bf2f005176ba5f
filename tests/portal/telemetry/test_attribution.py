"""MIG instances are attributed to the workload holding them, by MIG UUID or by process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.mig import MigInstance
from policies.requests import DeviceRequest, WorkloadRequest
from portal.allocator import Allocator
from portal.store.writer import Store
from portal.telemetry.attribution import AllocationIndex, hub_server
from portal.telemetry.reads import Resolution, series
from portal.telemetry.store import TelemetryStore
from tests.portal.allocator.conftest import ManualClock
from tests.portal.telemetry.conftest import T0, batch, sample

PROFILE = "3g.40gb"


def mig_node(*uuids: str | None) -> Node:
    layout = tuple(MigInstance(PROFILE, s, uuid=u) for s, u in zip((0, 4), uuids, strict=True))
    return Node(
        "m1",
        (GPU(0, "A100-80GB", 81920, uuid="GPU-m1-0", mig_enabled=True, mig_layout=layout),),
        cpu_milli=64_000,
        memory_mib=524_288,
    )


@pytest.fixture
def mig_portal(tmp_path: Path) -> Iterator[tuple[Allocator, TelemetryStore, list[str]]]:
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store, clock=ManualClock())
    # The allocator's inventory has no MIG UUIDs here (instances created by the portal before
    # an agent reported them); the index below sees the same layout with the agent's UUIDs.
    # Allocations on instances known by UUID: the last test of this module.
    alloc.start([mig_node(None, None)])
    alloc.set_tenant("team-a")
    alloc.set_quota("team-a", f"A100-80GB/{PROFILE}", guaranteed=2, limit=2)
    req = DeviceRequest(FlavorKind.MIG, mig_profile=PROFILE, models=frozenset({"A100-80GB"}))
    ids = [
        alloc.request(WorkloadRequest("team-a", "alice", f"alice/nb{i}", req)).id for i in (0, 1)
    ]
    yield alloc, TelemetryStore(store.engine), ids
    store.close()


def test_mig_samples_go_to_the_holder_of_the_instance(
    mig_portal: tuple[Allocator, TelemetryStore, list[str]],
) -> None:
    alloc, telemetry, ids = mig_portal
    start_of = {wid: alloc.status(wid).allocations[0].mig_start for wid in ids}
    on_first = next(w for w, s in start_of.items() if s == 0)
    on_second = next(w for w, s in start_of.items() if s == 4)
    idx = AllocationIndex.build([mig_node("MIG-first", "MIG-second")], alloc.workloads())
    result = telemetry.ingest(
        batch(
            "m1",
            # By MIG UUID: the instance at slice 0.
            sample("GPU-m1-0", T0 + 1, util=11.0, gpu_instance_id=1, mig_uuid="MIG-first"),
            # No MIG UUID (DCGM gives GPU_I_ID only): by the process's workload.
            sample(
                "GPU-m1-0",
                T0 + 1,
                util=22.0,
                gpu_instance_id=2,
                processes=[{"workload_id": on_second, "memory_used_mib": 100}],
            ),
        ),
        idx,
        now=T0 + 2,
    )
    assert result.accepted == 2
    telemetry.roll_up(now=T0 + 60)

    def util(wid: str) -> list[float | None]:
        pts = series(
            telemetry.engine, resolution=Resolution.MINUTE, start=T0, end=T0 + 60, workload_id=wid
        )
        return [p.utilization_avg for p in pts]

    assert util(on_first) == [11.0]
    assert util(on_second) == [22.0]
    assert {h.mig_slices for h in idx.holders["GPU-m1-0"]} == {3}
    assert {h.mig_total_slices for h in idx.holders["GPU-m1-0"]} == {7}


@pytest.mark.parametrize(
    ("owner", "name", "server"),
    [
        ("alice", "alice/default", ""),
        ("alice", "alice/gpu", "gpu"),
        ("alice", "bob/gpu", "bob/gpu"),
        ("alice", "training", "training"),
    ],
)
def test_a_notebook_workload_names_its_hub_server(owner: str, name: str, server: str) -> None:
    assert hub_server(owner, name) == server


def test_an_allocation_of_an_instance_known_by_uuid_is_held_on_its_gpu(tmp_path: Path) -> None:
    # Discovered instances carry MIG UUIDs, and an allocation on one names it; samples name the
    # physical GPU and the GPU instance, so the holder must be found under the GPU.
    node = mig_node("MIG-first", "MIG-second")
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    try:
        alloc = Allocator(store, clock=ManualClock())
        alloc.start([node])
        alloc.set_tenant("team-a")
        alloc.set_quota("team-a", f"A100-80GB/{PROFILE}", guaranteed=1, limit=1)
        req = DeviceRequest(FlavorKind.MIG, mig_profile=PROFILE, models=frozenset({"A100-80GB"}))
        wid = alloc.request(WorkloadRequest("team-a", "alice", "alice/nb", req)).id
        (placed,) = alloc.status(wid).allocations
        assert placed.gpu_uuids[0].startswith("MIG-")
        idx = AllocationIndex.build([node], alloc.workloads())
        assert [
            (h.workload_id, h.mig_slices, h.mig_total_slices) for h in idx.holders["GPU-m1-0"]
        ] == [(wid, 3, 7)]
        assert placed.gpu_uuids[0] not in idx.holders
        telemetry = TelemetryStore(store.engine)
        gi = 1 if placed.mig_start == 0 else 2
        s = sample("GPU-m1-0", T0 + 1, util=None, gpu_instance_id=gi, mig_uuid=placed.gpu_uuids[0])
        assert telemetry.ingest(batch("m1", s), idx, now=T0 + 2).accepted == 1
        points = series(
            store.engine, resolution=Resolution.RAW, start=T0, end=T0 + 60, workload_id=wid
        )
        assert [(p.utilization_avg, p.memory_used_avg) for p in points] == [(None, 1000.0)]
    finally:
        store.close()
