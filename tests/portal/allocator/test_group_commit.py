"""Group commit: concurrent decisions share one transaction, and each caller returns only after
its batch is committed and applied; a failed batch fails every caller in it and changes
nothing. On SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import create_engine, text

from policies.errors import Forbidden
from portal.allocator import Allocator, WorkloadStatus
from portal.allocator.draft import Draft
from portal.allocator.memory import Memory
from portal.store.records import ChangeSet, WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, wl
from tests.portal.allocator.test_faults import StoreDown, rebuilt


class GateStore(Store):
    """A real store whose commits wait for ``gate`` while it is closed, and whose next batch
    can be made to fail; it records the size of every batch."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_at: int | None = None  # the index (in ``batches``) of a batch to refuse
        self.batches: list[int] = []

    def commit_all(self, batch: Iterable[ChangeSet]) -> None:
        work = [c for c in batch if not c.empty()]
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        self.batches.append(len(work))
        if self.fail_at == len(self.batches) - 1:
            raise StoreDown("commit refused")
        super().commit_all(work)


def _wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _queued(a: Allocator) -> int:
    return len(a._queued)


def _setup(db_url: str, tenants: int = 4) -> tuple[Allocator, GateStore, ManualClock]:
    store = GateStore(db_url)
    clock = ManualClock()
    a = Allocator(store, clock=clock)
    a.start([hgx(f"n{i}") for i in range(4)])  # 32 GPUs
    for i in range(tenants):
        a.set_tenant(f"t{i}")
        a.set_quota(f"t{i}", "H100-80GB", guaranteed=4, limit=6)
    return a, store, clock


def test_callers_return_only_after_their_batch_commits(db_url: str) -> None:
    a, store, _ = _setup(db_url)
    try:
        store.gate.clear()
        store.entered.clear()
        store.batches.clear()
        returned: list[WorkloadStatus] = []

        def ask(tenant: str) -> None:
            returned.append(a.request(wl(tenant, gpus(1))))

        with ThreadPoolExecutor(max_workers=6) as pool:
            first = pool.submit(ask, "t0")
            assert store.entered.wait(20), "the first commit never started"
            rest = [pool.submit(ask, f"t{i % 4}") for i in range(1, 6)]
            # The others decide on top of the first, uncommitted decision and queue.
            _wait_for(lambda: _queued(a) == 5, "callers did not queue behind the commit")
            time.sleep(0.05)
            assert returned == [], "a caller returned before its decision was committed"
            assert a.workloads() == [], "memory shows decisions that are not committed"
            store.gate.set()
            for f in [first, *rest]:
                f.result(timeout=30)
        assert store.batches == [1, 5], store.batches  # one transaction for the five
        assert len({s.id for s in returned}) == 6
        assert all(s.state is WorkloadState.RUNNING for s in returned)
        assert a.snapshot() == rebuilt(a, db_url, [hgx(f"n{i}") for i in range(4)])
    finally:
        store.gate.set()
        store.close()


def test_a_failed_batch_fails_every_caller_in_it_and_changes_nothing(db_url: str) -> None:
    nodes = [hgx(f"n{i}") for i in range(4)]
    a, store, _ = _setup(db_url)
    try:
        kept = a.request(wl("t0", gpus(2)))
        store.gate.clear()
        store.entered.clear()
        with ThreadPoolExecutor(max_workers=5) as pool:
            first = pool.submit(a.release, kept.id)
            assert store.entered.wait(20)
            # Decided on top of the uncommitted release.
            rest = [pool.submit(a.request, wl(f"t{i % 4}", gpus(2))) for i in range(4)]
            _wait_for(lambda: _queued(a) == 4, "callers did not queue behind the commit")
            store.fail_at = len(store.batches)  # the release's own commit fails ...
            store.gate.set()
            with pytest.raises(StoreDown):
                first.result(timeout=30)
            # ... so the decisions taken on top of it are decided again, and commit.
            after = [f.result(timeout=30) for f in rest]
        assert all(s.state is WorkloadState.RUNNING for s in after)
        assert a.status(kept.id).state is WorkloadState.RUNNING
        assert a.snapshot() == rebuilt(a, db_url, nodes)

        # Now a batch of several fails as a whole.
        a.release(kept.id)
        before = a.snapshot()
        store.gate.clear()
        store.entered.clear()
        with ThreadPoolExecutor(max_workers=5) as pool:
            first = pool.submit(a.request, wl("t0", gpus(1), name="head"))
            assert store.entered.wait(20)
            rest = [pool.submit(a.request, wl(f"t{i % 4}", gpus(1))) for i in range(4)]
            _wait_for(lambda: _queued(a) == 4, "callers did not queue behind the commit")
            store.fail_at = len(store.batches) + 1  # the head commits, the four do not
            store.gate.set()
            head = first.result(timeout=30)
            errors = []
            for f in rest:
                with pytest.raises(StoreDown):
                    f.result(timeout=30)
                errors.append(f.exception())
        assert head.state is WorkloadState.RUNNING
        assert store.batches[-1] == 4, store.batches
        assert len(errors) == 4
        assert a.snapshot() != before  # the head is in
        assert a.snapshot() == rebuilt(a, db_url, nodes)
        assert {s.id for s in a.workloads()} == {head.id} | {s.id for s in after}
    finally:
        store.gate.set()
        store.close()


def test_many_threads_requesting_and_releasing_never_double_allocate(db_url: str) -> None:
    nodes = [hgx(f"n{i}", rack=f"r{i % 2}") for i in range(8)]  # 64 GPUs
    store = Store(db_url)
    a = Allocator(store, clock=ManualClock())
    try:
        a.start(nodes)
        tenants = [f"team-{i:02d}" for i in range(10)]
        for i, t in enumerate(tenants):
            a.set_tenant(t, cohort="all" if i % 2 else None)
            a.set_quota(t, "H100-80GB", guaranteed=4, limit=4 + i % 5)

        def client(c: int) -> int:
            rng = random.Random(c)
            mine: list[str] = []
            for _ in range(40):
                if mine and rng.random() < 0.4:
                    a.release(mine.pop(rng.randrange(len(mine))))
                    continue
                t = tenants[rng.randrange(len(tenants))]
                with contextlib.suppress(Forbidden):
                    mine.append(a.request(wl(t, gpus(rng.choice([1, 1, 2, 4])), owner=t)).id)
            return len(mine)

        with ThreadPoolExecutor(max_workers=16) as pool:
            assert sum(pool.map(client, range(16))) > 0
        engine = create_engine(db_url)
        try:
            with engine.connect() as conn:
                held = conn.execute(
                    text(
                        "SELECT a.node, a.gpus, w.tenant FROM allocations a JOIN workloads w "
                        "ON w.id = a.workload_id WHERE a.released_at IS NULL"
                    )
                ).all()
        finally:
            engine.dispose()
        assert held, "nothing is allocated"
        devices: Counter[tuple[str, str]] = Counter()
        used: Counter[str] = Counter()
        for node, gpu_list, tenant in held:
            for g in json.loads(gpu_list) if isinstance(gpu_list, str) else gpu_list:
                devices[(node, str(g))] += 1
                used[tenant] += 1
        assert max(devices.values()) == 1, "a GPU is held twice in the database"
        limits = {q.tenant: q.limit for q in a.quotas()}
        for tenant, n in used.items():
            assert n <= limits[tenant], f"{tenant} holds {n} > limit {limits[tenant]}"
        assert a.snapshot() == rebuilt(a, db_url, nodes)
    finally:
        store.close()


def _view(m: Memory) -> tuple[object, ...]:
    """Everything a decision can read from ``m``'s containers, as plain values."""
    ledger = m.ledger
    return (
        dict(m.nodes),
        dict(m.tenants),
        dict(m.quotas),
        dict(m.live),
        set(m.queued),
        set(m.preempting),
        dict(m.preempting_amount),
        dict(m.history),
        dict(m.period),
        dict(ledger.usage),
        dict(ledger.borrowed),
        {k: dict(v) for k, v in ledger.gpu_equivalents.items() if v},
        {k: dict(v) for k, v in ledger.holders.items() if v},
    )


def _depth(m: Memory) -> int:
    depth = 0
    while isinstance(m, Draft):
        m, depth = m.base, depth + 1
    return depth


class SecondGateStore(GateStore):
    """Closes the gate again behind the next batch it lets through, once armed."""

    armed = False

    def commit_all(self, batch: Iterable[ChangeSet]) -> None:
        super().commit_all(batch)
        if self.armed:
            self.armed = False
            self.gate.clear()


def test_drafts_waiting_behind_an_applied_batch_read_the_state_directly(db_url: str) -> None:
    nodes = [hgx(f"n{i}") for i in range(4)]
    store = SecondGateStore(db_url)
    a = Allocator(store, clock=ManualClock())
    try:
        a.start(nodes)
        for i in range(4):
            a.set_tenant(f"t{i}")
            a.set_quota(f"t{i}", "H100-80GB", guaranteed=4, limit=6)
        kept = a.request(wl("t0", gpus(2)))
        store.batches.clear()
        store.gate.clear()
        store.entered.clear()
        store.armed = True
        with ThreadPoolExecutor(max_workers=5) as pool:
            first = pool.submit(a.release, kept.id)
            assert store.entered.wait(20)
            rest = [pool.submit(a.request, wl(f"t{i}", gpus(i + 1))) for i in range(4)]
            _wait_for(lambda: _queued(a) == 4, "callers did not queue behind the commit")
            waiting = [q.draft for q in a._queued]
            assert all(d is not None for d in waiting)
            tip = waiting[-1]
            assert tip is not None
            assert _depth(tip) == 5  # the release's draft, then the four on top of it
            before = _view(tip)
            store.entered.clear()
            store.gate.set()  # the release commits; the gate closes behind it
            assert first.result(timeout=30) is not None
            assert store.entered.wait(20)  # the four are committing now
            with a._lock:
                assert _depth(tip) == 4, "the first waiting draft still reads the release's"
                assert waiting[0] is not None and waiting[0].base is a._state
                assert _view(tip) == before
            store.gate.set()
            after = [f.result(timeout=30) for f in rest]
        assert [s.state for s in after] == [WorkloadState.RUNNING] * 4
        assert store.batches == [1, 4], store.batches
        assert a.snapshot() == rebuilt(a, db_url, nodes)
    finally:
        store.gate.set()
        store.close()
