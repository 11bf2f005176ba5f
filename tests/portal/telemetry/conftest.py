"""A real allocator on a real store (SQLite, and PostgreSQL where marked), and sample builders.

Inventory: node ``n1`` with eight whole H100 GPUs (``GPU-n1-0`` ..), node ``n2`` with two
shareable T4 GPUs (``GPU-n2-0``, ``GPU-n2-1``). Tenants ``team-a`` and ``team-b``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadRequest
from portal.allocator import Allocator
from portal.store.writer import Store
from portal.telemetry.attribution import AllocationIndex, AllocatorIndexSource
from portal.telemetry.store import TelemetryStore
from portal.telemetry.wire import SampleBatch
from tests.portal.allocator.conftest import ManualClock, hgx, t4

T0 = ManualClock().now.timestamp()  # the allocator's start time, on an hour boundary
assert T0 % 3600 == 0


@dataclass
class Portal:
    store: Store
    alloc: Allocator
    telemetry: TelemetryStore
    clock: ManualClock

    def index(self) -> AllocationIndex:
        return AllocatorIndexSource(self.alloc, ttl_s=0)()

    def gpus(self, tenant: str, n: int, owner: str = "alice", name: str = "nb") -> str:
        req = DeviceRequest(FlavorKind.GPU, count=n, models=frozenset({"H100-80GB"}))
        return self.alloc.request(WorkloadRequest(tenant, owner, name, req)).id

    def share(self, tenant: str, milli: int, owner: str = "alice", name: str = "nb") -> str:
        req = DeviceRequest(FlavorKind.SHARE, milli=milli, models=frozenset({"T4"}))
        return self.alloc.request(WorkloadRequest(tenant, owner, name, req)).id

    def devices_of(self, workload_id: str) -> list[str]:
        return [u for a in self.alloc.status(workload_id).allocations for u in a.gpu_uuids]


def make_portal(url: str) -> Portal:
    store = Store(url)
    clock = ManualClock()
    alloc = Allocator(store, clock=clock)
    alloc.start([hgx("n1"), t4("n2")])
    for t in ("team-a", "team-b"):
        alloc.set_tenant(t)
        alloc.set_quota(t, "H100-80GB", guaranteed=4, limit=8)
        # Each tenant may take both T4s (no cohort to borrow in): over-committed on purpose.
        alloc.set_quota(t, "T4/share", guaranteed=2000, limit=2000, overcommit=True)
    return Portal(store, alloc, TelemetryStore(store.engine), clock)


@pytest.fixture
def portal(db_url: str) -> Iterator[Portal]:
    p = make_portal(db_url)
    yield p
    p.store.close()


def sample(gpu: str, at: float, util: float | None = 50.0, **kw: object) -> dict[str, object]:
    return {
        "gpu_uuid": gpu,
        "at": at,
        "utilization_pct": util,
        "memory_used_mib": 1000.0,
        "memory_total_mib": 81920.0,
        **kw,
    }


def batch(node: str, *samples: dict[str, object], source: str = "nvml") -> SampleBatch:
    return SampleBatch.model_validate({"node": node, "source": source, "samples": list(samples)})
