"""The pool of pre-started environments over a real allocator and store (SQLite and
PostgreSQL): placeholders of the platform's tenant at the lowest priority, sized by the
planner, given back before any user waits, adopted by a spawn, found again after a restart."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from policies.requests import MAX_PRIORITY
from portal.allocator import Allocator
from portal.prestart import PrestartPool, PrestartSpec
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, wl

H100 = "H100-80GB"
ONE = PrestartSpec("gpu:H100-80GB:1", H100, gpus(1), 1.0)
TWO = PrestartSpec("gpu:H100-80GB:2", H100, gpus(2), 2.0)


@pytest.fixture
def alloc(db_url: str) -> Iterator[Allocator]:
    store = Store(db_url)
    a = Allocator(store, clock=ManualClock())
    a.start([hgx("n1")])  # 8 GPUs
    a.set_tenant("platform")
    a.set_quota("platform", H100, guaranteed=0, limit=4)
    a.set_tenant("team-a")
    a.set_quota("team-a", H100, guaranteed=4, limit=8)
    yield a
    store.close()


def pool(alloc: Allocator, rates: dict[str, float], budget: float = 4.0) -> PrestartPool:
    return PrestartPool(
        alloc, tenant="platform", options=[ONE, TWO], rates=lambda: rates, budget=budget
    )


def used(alloc: Allocator, tenant: str) -> int:
    return sum(u.used for u in alloc.usage(tenant) if u.flavor == H100)


def test_holds_the_planned_placeholders_charged_to_the_platform(alloc: Allocator) -> None:
    # 6/h over 10 min: mean 1, two kept of ONE; 3/h: one of TWO. 2 + 2 = 4 GPU-equivalents.
    p = pool(alloc, {ONE.key: 6.0, TWO.key: 3.0})
    plan = p.reconcile()
    assert [(t.key, t.count) for t in plan] == [(ONE.key, 2), (TWO.key, 1)]
    held = p.held()
    assert {k: len(v) for k, v in held.items()} == {ONE.key: 2, TWO.key: 1}
    assert used(alloc, "platform") == 4 and used(alloc, "team-a") == 0
    recs = alloc.read(lambda st: [st.live[w].rec for ids in held.values() for w in ids])
    assert {(r.tenant, r.owner, r.priority) for r in recs} == {
        ("platform", "gpuportal-prestart", -MAX_PRIORITY)
    }
    p.reconcile()  # steady: nothing more is requested
    assert used(alloc, "platform") == 4
    # A restart: a new pool finds the same placeholders by their keys.
    assert pool(alloc, {ONE.key: 6.0, TWO.key: 3.0}).held() == held
    # Demand gone: all given back.
    pool(alloc, {}).reconcile()
    assert used(alloc, "platform") == 0


def test_never_blocks_a_user_placeholders_go_when_someone_queues(alloc: Allocator) -> None:
    p = pool(alloc, {ONE.key: 6.0, TWO.key: 3.0})
    p.reconcile()
    fill = alloc.request(wl("team-a", gpus(4)))
    assert fill.state is WorkloadState.RUNNING  # 4 platform + 4 team-a: the node is full
    waiting = alloc.request(wl("team-a", gpus(2), name="late"))
    assert waiting.state is WorkloadState.QUEUED  # the placeholders hold the rest
    p.reconcile()  # someone waits: every placeholder goes, and the release admits the user
    assert alloc.status(waiting.id, estimate=False).state is WorkloadState.RUNNING
    assert used(alloc, "team-a") == 6
    # Nobody waits now: the 2 free GPUs hold ONE's two (TWO's would not fit beside them).
    plan = p.reconcile()
    assert [(t.count, t.reason.value) for t in plan] == [(2, "forecast"), (0, "capacity")]
    assert used(alloc, "platform") == 2


def test_a_spawn_adopts_a_placeholder_of_its_option(alloc: Allocator) -> None:
    p = pool(alloc, {ONE.key: 6.0}, budget=8.0)
    p.reconcile()
    alloc.request(wl("team-a", gpus(6)))  # the 2 placeholders hold the last 2 GPUs
    assert p.adopt(ONE.key)
    spawn = alloc.request(wl("team-a", gpus(1), name="alice"))
    assert spawn.state is WorkloadState.RUNNING
    assert not p.adopt(TWO.key)  # none held for that option
    assert len(p.held()[ONE.key]) == 1
