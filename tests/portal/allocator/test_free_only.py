"""``Allocator.request(free_only=True)``: started now on free capacity, or nothing at all —
no queued record, no reservation taken, a reserved node left to its holder (real allocator
and store, SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import func, select

from policies.inventory import Node
from portal.allocator import Allocator
from portal.allocator.intake import NoFreeRoom
from portal.store.jobs import WORKLOADS
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import gpus, hgx, wl

Make = Callable[[list[Node]], Allocator]


def stored_workloads(a: Allocator) -> int:
    with a.store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(WORKLOADS)).scalar_one())


def test_free_only_starts_on_free_capacity_or_changes_nothing(make_allocator: Make) -> None:
    a = make_allocator([hgx(f"n{i}") for i in range(1, 5)])
    a.set_tenant("team-a")
    a.set_quota("team-a", "H100-80GB", guaranteed=32, limit=32)
    held = [a.request(wl("team-a", gpus(n))) for n in (8, 4, 6, 5)]
    big = a.request(wl("team-a", gpus(8), name="big"))  # waits; reserves the 4 free on n2
    assert (big.state, big.reason) == (WorkloadState.QUEUED, "capacity")
    before = (stored_workloads(a), a.queue("team-a"), a.status(big.id))
    with pytest.raises(NoFreeRoom, match="capacity"):
        a.request(wl("team-a", gpus(8), name="extra"), free_only=True)
    with pytest.raises(NoFreeRoom):  # would fit only on the node reserved for big
        a.request(wl("team-a", gpus(4), name="extra"), free_only=True)
    assert (stored_workloads(a), a.queue("team-a"), a.status(big.id)) == before
    small = a.request(wl("team-a", gpus(2), name="extra"), free_only=True)
    assert small.state is WorkloadState.RUNNING
    assert small.allocations[0].node != held[1].allocations[0].node
    a.release(held[1].id)
    assert a.status(big.id).state is WorkloadState.RUNNING  # its reservation was kept
