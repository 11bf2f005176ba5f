"""What the queue order and the model cache keep, against a computation from scratch after
every step of a random sequence: the order reads fields each ``Live`` keeps from its record,
and ``models_for`` remembers its answer per request shape until the inventory changes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.requests import DeviceRequest, WorkloadRequest
from policies.topology import Topology
from portal.allocator import Allocator
from portal.allocator.state import State
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, gpus, share, wl
from tests.portal.allocator.test_properties import H100, inventory, seed_tenants


def l40s(name: str) -> Node:
    return Node(
        name,
        tuple(GPU(i, "L40S", 46068, uuid=f"GPU-{name}-{i}") for i in range(4)),
        cpu_milli=64_000,
        memory_mib=524_288,
        topology=Topology.from_numa([0, 0, 1, 1]),
        rack="r2",
    )


def _models_from_scratch(state: State, req: WorkloadRequest) -> list[str]:
    dev = req.devices
    cap = state.capacity()
    models = dev.models or {g.model for n in state.nodes.values() for g in n.gpus}
    return [m for m in sorted(models) if (fl := dev.flavor(m)) is not None and str(fl) in cap]


def _check(alloc: Allocator, clock: ManualClock) -> int:
    now = clock.now

    def read(state: State) -> int:
        queued = [state.live[w] for w in state.queued]
        expected = sorted(
            queued,
            key=lambda lv: (
                -lv.rec.priority,
                state.share(lv.rec.tenant, now),
                lv.rec.created_at.timestamp(),
                lv.seq,
            ),
        )
        assert [lv.rec.id for lv in state.order(now)] == [lv.rec.id for lv in expected]
        for a in queued:
            for b in queued[:5]:
                if a is not b:
                    assert state.precedes(a, b, now) == (expected.index(a) < expected.index(b))
        for lv in state.live.values():
            assert state.models_for(lv.req) == _models_from_scratch(state, lv.req)
        return len(queued)

    return alloc.read(read)


@pytest.mark.parametrize("seed", [1, 2])
def test_order_and_models_match_a_computation_from_scratch(
    tmp_path: Path, clock: ManualClock, seed: int
) -> None:
    rng = random.Random(seed)
    store = Store(f"sqlite:///{tmp_path}/portal.sqlite")
    try:
        alloc = Allocator(store, clock=clock)
        alloc.start(inventory())
        seed_tenants(alloc)
        ids: list[str] = []
        most_queued = 0
        for i in range(60):
            clock.advance(seconds=rng.randint(1, 900))
            step = rng.random()
            if step < 0.6 or not ids:
                kind = rng.random()
                dev = (
                    gpus(rng.choice([1, 2, 4]), H100)
                    if kind < 0.6
                    else share(500)
                    if kind < 0.8
                    else DeviceRequest(FlavorKind.GPU, count=1)  # any model
                )
                req = wl(f"t{rng.randrange(3)}", dev, name=f"w{i}", priority=rng.choice([0, 0, 5]))
                ids.append(alloc.request(req).id)
            elif step < 0.9:
                alloc.release(ids.pop(rng.randrange(len(ids))))
            elif step < 0.95:
                # A model the inventory did not have: "any model" requests gain a flavor.
                alloc.node_added(l40s(f"extra{i}"))
            else:
                alloc.tick()
            most_queued = max(most_queued, _check(alloc, clock))
        # The sequence did exercise the order: several workloads waited at once.
        assert most_queued >= 3
    finally:
        store.close()
