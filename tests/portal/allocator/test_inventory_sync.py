"""The allocator follows a live inventory source: nodes added, cordoned and lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from policies.inventory import Node
from portal.allocator import Allocator
from portal.allocator.inventory_sync import follow
from portal.inventory.simulated import SimulatedInventory
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import gpus, wl

Make = Callable[[list[Node]], Allocator]

TWO_NODES = """
version: 1
nodes:
  - {name: hgx, preset: hgx-h100-8, count: 2}
"""
CORDONED_AND_GROWN = """
version: 1
nodes:
  - {name: hgx-1, preset: hgx-h100-8, schedulable: false}
  - {name: hgx-3, preset: hgx-h100-8}
"""


async def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "inventory change not applied"
        await asyncio.sleep(0.02)


async def test_inventory_changes_reach_the_allocator_live(
    make_allocator: Make, tmp_path: Path
) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(TWO_NODES)
    source = SimulatedInventory.from_file(path, poll_s=0.02)
    a = make_allocator(source.snapshot())
    a.set_tenant("team-a")
    a.set_quota("team-a", "H100-80GB", guaranteed=16, limit=24)
    on_1 = a.request(wl("team-a", gpus(8), name="on-1"))
    on_2 = a.request(wl("team-a", gpus(8), name="on-2"))
    lost = on_1 if on_1.allocations[0].node == "hgx-2" else on_2
    kept = on_2 if lost is on_1 else on_1
    task = asyncio.create_task(follow(source, a))
    try:
        path.write_text(CORDONED_AND_GROWN)
        await wait_for(lambda: "hgx-3" in {s.name for s in a.cluster})
        await wait_for(lambda: "hgx-2" not in {s.name for s in a.cluster})
    finally:
        task.cancel()
    # hgx-2 is gone: its workload failed and gave its quota back.
    assert a.status(lost.id).state is WorkloadState.FAILED
    assert a.status(lost.id).reason == "node-lost"
    # hgx-1 is cordoned: its workload keeps running there, nothing new lands on it.
    assert a.status(kept.id).state is WorkloadState.RUNNING
    assert not a.cluster.node("hgx-1").schedulable
    new = a.request(wl("team-a", gpus(1), name="new"))
    assert new.allocations[0].node == "hgx-3"
    assert a.capacity["H100-80GB"] == 16
