"""Builders for allocator tests: a manual clock, small inventories, request shorthands."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.requests import DeviceRequest, TopologyRequirement, WorkloadKind, WorkloadRequest
from policies.topology import LinkClass, Topology
from portal.allocator import Allocator
from portal.store.writer import Store


@dataclass
class ManualClock:
    now: datetime = field(default_factory=lambda: datetime(2026, 11, 2, 9, 0, tzinfo=UTC))

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kw: float) -> None:
        self.now += timedelta(**kw)


def hgx(name: str, rack: str = "r1", gpus: int = 8) -> Node:
    return Node(
        name,
        tuple(GPU(i, "H100-80GB", 81920, uuid=f"GPU-{name}-{i}") for i in range(gpus)),
        cpu_milli=128_000,
        memory_mib=1_048_576,
        topology=Topology.uniform(gpus, LinkClass.NVSWITCH),
        rack=rack,
    )


def t4(name: str) -> Node:
    return Node(
        name,
        tuple(GPU(i, "T4", 15360, uuid=f"GPU-{name}-{i}", shareable=True) for i in range(2)),
        cpu_milli=32_000,
        memory_mib=131_072,
        topology=Topology.from_numa([0, 1]),
    )


def gpus(n: int, model: str = "H100-80GB", **kw: object) -> DeviceRequest:
    return DeviceRequest(FlavorKind.GPU, count=n, models=frozenset({model}), **kw)  # type: ignore[arg-type]


def share(milli: int) -> DeviceRequest:
    return DeviceRequest(FlavorKind.SHARE, milli=milli, models=frozenset({"T4"}))


def wl(
    tenant: str,
    devices: DeviceRequest,
    name: str = "nb",
    owner: str = "u",
    gang: int = 1,
    priority: int = 0,
    kind: WorkloadKind = WorkloadKind.NOTEBOOK,
) -> WorkloadRequest:
    return WorkloadRequest(
        tenant, owner, name, devices, kind=kind, gang_size=gang, priority=priority
    )


__all__ = ["TopologyRequirement"]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_allocator(db_url: str, clock: ManualClock) -> Iterator[Callable[[list[Node]], Allocator]]:
    """Start an allocator on ``db_url`` (SQLite and PostgreSQL) with the given nodes; calling
    it again opens a second allocator on the same database (a restart)."""
    stores: list[Store] = []

    def make(nodes: list[Node]) -> Allocator:
        store = Store(db_url)
        stores.append(store)
        alloc = Allocator(store, clock=clock)
        alloc.start(nodes)
        return alloc

    yield make
    for s in stores:
        s.close()
