"""Fault injection: commits that fail and processes that die right after a commit.

The allocator decides on a working copy, commits, and only then applies the decision to
memory. So whatever fails, memory must equal a fresh rebuild from the database after every
step: allocations, queue order, ledger, fairness history, this month's GPU-hours. A hypothesis
state machine drives random histories with failures armed at random steps; a variant whose
``apply`` skips one kind of change must be caught by the same machine.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from policies.errors import Forbidden, InvalidRequest
from policies.inventory import Node
from portal.allocator import Allocator, WorkloadStatus
from portal.allocator.ops import SetHistory
from portal.allocator.state import State, released_this_month, snapshot
from portal.store.records import ChangeSet, WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, gpus, wl
from tests.portal.allocator.test_properties import (
    H100,
    TENANTS,
    assert_no_device_held_twice,
    device_requests,
    inventory,
    seed_tenants,
)


class StoreDown(Exception):
    """The database refused the commit (nothing was written)."""


class Died(Exception):
    """The process died right after the commit reached the database."""


class FlakyStore(Store):
    """A real store whose next commit can be made to fail, or to 'kill the process' after it
    is durable."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.armed: str | None = None

    def commit_all(self, batch: Iterable[ChangeSet]) -> None:
        work = [c for c in batch if not c.empty()]
        armed, self.armed = self.armed, None
        if armed == "fail" and work:
            raise StoreDown("commit refused")
        super().commit_all(work)
        if armed == "die" and work:
            raise Died("killed after commit")


def rebuilt(alloc: Allocator, url: str, nodes: list[Node]) -> dict[str, object]:
    """What a fresh process would hold: the state rebuilt from the database alone."""
    now = alloc.clock()
    with Store(url) as store:
        fresh = State(alloc.policy, alloc.read(lambda s: s.preemption), 24 * 3600.0)
        rebuilt = fresh.rebuild(nodes, store.load(), released_this_month(store, now))
    assert not rebuilt.lost, f"workloads on lost nodes survived in the database: {rebuilt.lost}"
    assert not rebuilt.conflicts, f"the database contradicts itself: {rebuilt.conflicts}"
    return snapshot(fresh, now)


class FaultyHistory(RuleBasedStateMachine):
    """Random requests, releases, quota changes, node losses, ticks and restarts, with commit
    failures and deaths after commit armed at random steps."""

    @initialize()
    def setup(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gp-faults-"))
        self.url = f"sqlite:///{self.dir}/portal.sqlite"
        self.clock = ManualClock()
        self.nodes = {n.name: n for n in inventory()}
        self.stores: list[Store] = []
        self.alloc = self._open()
        seed_tenants(self.alloc, h100_budget_gpu_hours=40.0)
        self.n = 0
        self.failures = Counter[str]()

    def _open(self) -> Allocator:
        store = FlakyStore(self.url)
        self.stores.append(store)
        alloc = Allocator(store, clock=self.clock)
        alloc.start(list(self.nodes.values()))
        return alloc

    def teardown(self) -> None:
        for s in getattr(self, "stores", []):
            s.close()

    def _store(self) -> FlakyStore:
        store = self.alloc.store
        assert isinstance(store, FlakyStore)
        return store

    def _run(self, op: object, *args: object, **kw: object) -> object:
        """Call an allocator operation; a refused commit changes nothing, a death after the
        commit is followed by a restart from the database."""
        try:
            return op(*args, **kw)  # type: ignore[operator]
        except StoreDown:
            self.failures["refused"] += 1
            return None
        except Died:
            self.failures["died"] += 1
            self.alloc = self._open()
            return None

    # ---------------------------------------------------------------- rules

    @rule(kind=st.sampled_from(["fail", "die"]))
    def arm(self, kind: str) -> None:
        self._store().armed = kind

    @rule(tenant=st.sampled_from(TENANTS), dev=device_requests, gang=st.sampled_from([1, 1, 2]))
    def request(self, tenant: str, dev: object, gang: int) -> None:
        self.n += 1
        req = wl(tenant, dev, name=f"w{self.n}", gang=gang)  # type: ignore[arg-type]
        try:
            got = self._run(self.alloc.request, req, expected_duration_s=3600.0)
        except Forbidden:
            return
        if isinstance(got, WorkloadStatus) and got.state is WorkloadState.RUNNING:
            flavor = got.allocations[0].flavor
            q = next(q for q in self.alloc.quotas(tenant) if q.flavor == flavor)
            used = next(u.used for u in self.alloc.usage(tenant) if u.flavor == flavor)
            assert used <= q.limit, f"{tenant} admitted to {used} of {flavor}, limit {q.limit}"

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        live = self.alloc.workloads()
        if live:
            victim = data.draw(st.sampled_from([w.id for w in live]))
            self._run(self.alloc.release, victim)

    @rule(
        tenant=st.sampled_from(TENANTS),
        guaranteed=st.integers(0, 4),
        extra=st.integers(0, 4),
        who=st.sampled_from(["platform", "platform-overcommit", "tenant-admin"]),
        ceiling=st.none() | st.integers(0, 10),
    )
    def change_quota(
        self, tenant: str, guaranteed: int, extra: int, who: str, ceiling: int | None
    ) -> None:
        # A tenant admin's edit above the ceiling, or guarantees past the capacity without
        # over-commit, are refused before anything is decided: nothing may change.
        try:
            self._run(
                self.alloc.set_quota,
                tenant,
                H100,
                guaranteed=guaranteed,
                limit=guaranteed + extra,
                budget_gpu_hours=40.0,
                ceiling_limit=ceiling if who != "tenant-admin" else None,
                overcommit=who == "platform-overcommit",
                within_ceiling=who == "tenant-admin",
            )
        except (Forbidden, InvalidRequest):
            return

    @rule(tenant=st.sampled_from(TENANTS), weight=st.sampled_from([0.5, 1.0, 3.0]))
    def change_tenant(self, tenant: str, weight: float) -> None:
        cohort = None if tenant == "t2" else "c"
        self._run(self.alloc.set_tenant, tenant, cohort=cohort, weight=weight)

    @precondition(lambda self: "h2" in self.nodes)
    @rule()
    def lose_node(self) -> None:
        node = self.nodes["h2"]
        before = self._store().armed
        self._run(self.alloc.node_removed, node.name)
        if before is None or self.alloc.read(lambda s: "h2" not in s.nodes):
            self.nodes.pop("h2")
            self.lost = node

    @precondition(lambda self: "h2" not in self.nodes)
    @rule()
    def node_returns(self) -> None:
        self._run(self.alloc.node_added, self.lost)
        if self.alloc.read(lambda s: "h2" in s.nodes):
            self.nodes["h2"] = self.lost

    @rule(seconds=st.sampled_from([1, 600, 3601]))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds=seconds)
        self._run(self.alloc.tick)

    @rule()
    def restart(self) -> None:
        self.alloc = self._open()

    # ---------------------------------------------------------------- invariants

    @invariant()
    def memory_equals_a_fresh_rebuild(self) -> None:
        if self._store().armed is not None:
            return  # checked after the armed step
        assert self.alloc.snapshot() == rebuilt(self.alloc, self.url, list(self.nodes.values()))

    @invariant()
    def no_device_is_held_twice(self) -> None:
        assert_no_device_held_twice(self.alloc.allocations())


FAULT_SETTINGS = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FaultyHistory.TestCase.settings = FAULT_SETTINGS
test_histories_with_failed_commits_and_deaths = FaultyHistory.TestCase


def test_the_machine_catches_an_apply_that_skips_one_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Break ``apply`` in one place (fairness history is never applied to memory): the
    machine must find the difference from the database."""
    original = State.apply

    def skipping(self: State, decision: object) -> None:
        ops = tuple(op for op in decision.ops if not isinstance(op, SetHistory))  # type: ignore[attr-defined]
        original(self, type(decision)(ops, decision.scalars, decision.changes, decision.at))  # type: ignore[attr-defined,call-arg]

    monkeypatch.setattr(State, "apply", skipping)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            FaultyHistory,
            settings=settings(
                FAULT_SETTINGS, max_examples=20, database=None, phases=[Phase.generate]
            ),
        )


def test_a_release_whose_commit_failed_once_charges_its_gpu_hours_once(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Regression: the month's GPU-hours went 8 -> 16 when a release was retried after its
    commit failed, because the period totals were updated before the commit."""
    url = f"sqlite:///{tmp_path}/portal.sqlite"
    nodes = inventory()
    store = FlakyStore(url)
    alloc = Allocator(store, clock=clock)
    alloc.start(nodes)
    alloc.set_tenant("t0")
    alloc.set_quota("t0", H100, guaranteed=8, limit=8, budget_gpu_hours=100.0)
    got = alloc.request(wl("t0", gpus(4, H100), name="a", gang=2))
    assert got.state is WorkloadState.RUNNING
    clock.advance(hours=1)
    store.armed = "fail"
    with pytest.raises(StoreDown):
        alloc.release(got.id)
    assert alloc.status(got.id).state is WorkloadState.RUNNING
    assert alloc.release(got.id).state is WorkloadState.RELEASED
    assert alloc.gpu_hours("t0", H100) == pytest.approx(8.0)
    with Store(url) as again:
        fresh = Allocator(again, clock=clock)
        fresh.start(nodes)
        assert fresh.gpu_hours("t0", H100) == pytest.approx(8.0)
    clock.advance(hours=1)
    assert alloc.gpu_hours("t0", H100) == pytest.approx(8.0)
    store.close()


def test_a_death_after_commit_loses_nothing_on_restart(tmp_path: Path, clock: ManualClock) -> None:
    url = f"sqlite:///{tmp_path}/portal.sqlite"
    nodes = inventory()
    store = FlakyStore(url)
    alloc = Allocator(store, clock=clock)
    alloc.start(nodes)
    alloc.set_tenant("t0")
    alloc.set_quota("t0", H100, guaranteed=4, limit=4)
    store.armed = "die"
    with pytest.raises(Died):
        alloc.request(wl("t0", gpus(2, H100), name="a"))
    with Store(url) as again:
        fresh = Allocator(again, clock=clock)
        fresh.start(nodes)
        running = [w for w in fresh.workloads() if w.state is WorkloadState.RUNNING]
        assert [w.name for w in running] == ["a"]
        assert fresh.snapshot() == rebuilt(fresh, url, nodes)
    store.close()
