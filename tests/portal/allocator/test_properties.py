"""Property-based test of the allocator over random histories on a real SQLite database.

Random sequences of requests (whole GPUs, MIG instances, fractional shares, gangs), releases,
quota changes, node losses and returns, clock advances and restarts. After every step:

- no device is held twice (whole GPUs exclusive, shares within 1000 milli and the GPU's
  memory, MIG instances exclusive), and the in-memory free capacity matches the allocations;
- no admission took a tenant above its limit;
- the in-memory state equals the state rebuilt from the database by a fresh allocator;
- a tenant asking within its guaranteed share gets it within one reclaim (grace period).
"""

from __future__ import annotations

import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from policies.errors import Forbidden, InvalidRequest
from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.mig import MigInstance
from policies.requests import DeviceRequest, TopologyRequirement
from policies.topology import LinkClass, Topology
from portal.allocator import Allocator
from portal.store.records import AllocationRecord, WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, t4, wl

TENANTS = ("t0", "t1", "t2")
H100 = "H100-80GB"
GRACE_S = 300


def a100_mig(name: str) -> Node:
    layout = (MigInstance("3g.40gb", 0), MigInstance("2g.20gb", 4), MigInstance("1g.10gb", 6))
    return Node(
        name,
        tuple(
            GPU(i, "A100-80GB", 81920, uuid=f"GPU-{name}-{i}", mig_enabled=True, mig_layout=layout)
            for i in range(2)
        ),
        cpu_milli=64_000,
        memory_mib=262_144,
        topology=Topology.uniform(2, LinkClass.NVLINK),
        rack="r2",
    )


def inventory() -> list[Node]:
    return [hgx("h1", "r1", gpus=4), hgx("h2", "r1", gpus=4), t4("s1"), a100_mig("m1")]


device_requests = st.one_of(
    st.sampled_from([1, 1, 2, 4]).map(lambda n: gpus(n, H100)),
    st.sampled_from([250, 500, 750]).map(
        lambda m: DeviceRequest(FlavorKind.SHARE, milli=m, models=frozenset({"T4"}))
    ),
    st.sampled_from(["3g.40gb", "2g.20gb", "1g.10gb"]).map(
        lambda p: DeviceRequest(FlavorKind.MIG, mig_profile=p, models=frozenset({"A100-80GB"}))
    ),
)


def assert_no_device_held_twice(
    allocations: Iterable[AllocationRecord],
) -> tuple[Counter[tuple[str, int]], dict[tuple[str, int], int]]:
    """Whole GPUs and MIG instances held once, shares within 1000 milli, no GPU both whole and
    shared. Returns holders of each whole GPU and the milli shared of each shared one."""
    whole: Counter[tuple[str, int]] = Counter()
    shared: defaultdict[tuple[str, int], int] = defaultdict(int)
    mig: Counter[tuple[str, int, int | None]] = Counter()
    for a in allocations:
        if a.mig_profile is not None:
            mig[(a.node, a.gpus[0], a.mig_start)] += 1
        elif a.milli == 1000:
            for g in a.gpus:
                whole[(a.node, g)] += 1
        else:
            for g in a.gpus:
                shared[(a.node, g)] += a.milli
    assert all(v == 1 for v in whole.values()), whole
    assert all(v == 1 for v in mig.values()), mig
    assert all(v <= 1000 for v in shared.values()), shared
    assert not set(whole) & set(shared)
    return whole, shared


def seed_tenants(alloc: Allocator, h100_budget_gpu_hours: float | None = None) -> None:
    """t0 and t1 in one cohort, t2 alone; each with quotas on every flavor of ``inventory``."""
    alloc.set_tenant("t0", cohort="c")
    alloc.set_tenant("t1", cohort="c")
    alloc.set_tenant("t2")
    for t in TENANTS:
        alloc.set_quota(t, H100, guaranteed=2, limit=6, budget_gpu_hours=h100_budget_gpu_hours)
        alloc.set_quota(t, "T4/share", guaranteed=500, limit=2000)
        alloc.set_quota(t, "A100-80GB/3g.40gb", guaranteed=0, limit=2)
        alloc.set_quota(t, "A100-80GB/2g.20gb", guaranteed=0, limit=1)
        alloc.set_quota(t, "A100-80GB/1g.10gb", guaranteed=0, limit=2)


class AllocatorHistory(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gp-prop-"))
        self.url = f"sqlite:///{self.dir}/portal.sqlite"
        self.clock = ManualClock()
        self.nodes = {n.name: n for n in inventory()}
        self.stores: list[Store] = []
        self.alloc = self._open()
        seed_tenants(self.alloc)
        self.n = 0

    def _open(self) -> Allocator:
        store = Store(self.url)
        self.stores.append(store)
        alloc = Allocator(store, clock=self.clock)
        alloc.start(list(self.nodes.values()))
        return alloc

    def teardown(self) -> None:
        for s in getattr(self, "stores", []):
            s.close()

    # ---------------------------------------------------------------- rules

    @rule(
        tenant=st.sampled_from(TENANTS),
        dev=device_requests,
        gang=st.sampled_from([1, 1, 1, 2]),
        priority=st.sampled_from([0, 0, 10]),
    )
    def request(self, tenant: str, dev: DeviceRequest, gang: int, priority: int) -> None:
        self.n += 1
        if gang > 1 and dev.kind is FlavorKind.GPU:
            dev = DeviceRequest(
                FlavorKind.GPU,
                count=dev.count,
                models=dev.models,
                topology=TopologyRequirement.SAME_RACK,
            )
        req = wl(tenant, dev, name=f"w{self.n}", gang=gang, priority=priority)
        limits = {q.flavor: q.limit for q in self.alloc.quotas(tenant)}
        admissible = any(
            0 < dev.amount() * gang <= limits.get(str(dev.flavor(m)), 0)
            for m in (dev.models or {H100})
        )
        before = self._snapshot(self.alloc)
        try:
            s = self.alloc.request(req)
        except Forbidden:
            # Refused only when no quota of the tenant could ever admit it, changing nothing.
            assert not admissible
            assert self._snapshot(self.alloc) == before
            return
        assert admissible
        if s.state is WorkloadState.RUNNING:
            self._assert_within_limits(only=(tenant, s.allocations[0].flavor))
        else:
            assert s.state is WorkloadState.QUEUED and s.reason in (
                "quota",
                "capacity",
                "topology",
                "budget",
            ), s

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        live = self.alloc.workloads()
        if live:
            victim = data.draw(st.sampled_from([w.id for w in live]))
            self.alloc.release(victim)

    @rule(
        tenant=st.sampled_from(TENANTS),
        guaranteed=st.integers(0, 4),
        extra=st.integers(0, 4),
        overcommit=st.booleans(),
    )
    def change_quota(self, tenant: str, guaranteed: int, extra: int, overcommit: bool) -> None:
        before = self.alloc.quotas()
        try:
            self.alloc.set_quota(
                tenant,
                H100,
                guaranteed=guaranteed,
                limit=guaranteed + extra,
                overcommit=overcommit,
            )
        except InvalidRequest:
            # Guarantees past the capacity without over-commit: refused, nothing changed.
            assert not overcommit
            assert self.alloc.quotas() == before

    @precondition(lambda self: "h2" in self.nodes)
    @rule()
    def lose_node(self) -> None:
        node = self.nodes.pop("h2")
        self.lost = node
        self.alloc.node_removed(node.name)

    @precondition(lambda self: "h2" not in self.nodes)
    @rule()
    def node_returns(self) -> None:
        self.nodes["h2"] = self.lost
        self.alloc.node_added(self.lost)

    @rule(seconds=st.sampled_from([1, 60, GRACE_S + 1]))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds=seconds)
        self.alloc.tick()

    @rule()
    def restart(self) -> None:
        before = self._snapshot(self.alloc)
        self.alloc = self._open()
        assert self._snapshot(self.alloc) == before

    @precondition(lambda self: "h2" in self.nodes)
    @rule(tenant=st.sampled_from(TENANTS))
    def claim_guaranteed(self, tenant: str) -> None:
        """Within its guaranteed share a tenant gets one more GPU within one reclaim."""
        quota = next(q for q in self.alloc.quotas(tenant) if q.flavor == H100)
        used = next((u.used for u in self.alloc.usage(tenant) if u.flavor == H100), 0)
        guaranteed_total = sum(
            q.guaranteed for t in TENANTS for q in self.alloc.quotas(t) if q.flavor == H100
        )
        if used + 1 > quota.guaranteed or guaranteed_total > self.alloc.capacity.get(H100, 0):
            return
        self.n += 1
        s = self.alloc.request(wl(tenant, gpus(1, H100), name=f"claim{self.n}", priority=10**6))
        if s.state is not WorkloadState.RUNNING:
            self.clock.advance(seconds=GRACE_S + 1)
            self.alloc.tick()
            s = self.alloc.status(s.id)
        assert s.state is WorkloadState.RUNNING, (s.reason, s.message)

    # ---------------------------------------------------------------- invariants

    @invariant()
    def no_device_is_held_twice(self) -> None:
        whole, shared = assert_no_device_held_twice(self.alloc.allocations())
        for st_ in self.alloc.cluster:
            for g, free in enumerate(st_.free_milli):
                if st_.node.gpus[g].mig_enabled:
                    continue
                held = 1000 * whole[(st_.name, g)] + shared[(st_.name, g)]
                assert free == 1000 - held, (st_.name, g, free, held)

    @invariant()
    def memory_equals_the_database(self) -> None:
        stored = self.alloc._store.load()
        assert sorted(a.id for a in stored.allocations) == sorted(
            a.id for a in self.alloc.allocations()
        )
        live = {w.id: w.state for w in self.alloc.workloads()}
        assert {w.id: w.state for w in stored.workloads} == live

    # ---------------------------------------------------------------- helpers

    def _assert_within_limits(self, only: tuple[str, str]) -> None:
        tenant, flavor = only
        q = next((q for q in self.alloc.quotas(tenant) if q.flavor == flavor), None)
        assert q is not None, f"{tenant} runs {flavor} without a quota"
        used = next(u.used for u in self.alloc.usage(tenant) if u.flavor == flavor)
        assert used <= q.limit, f"{tenant} uses {used} of {flavor}, limit {q.limit}"

    @staticmethod
    def _snapshot(a: Allocator) -> tuple[object, ...]:
        allocs = sorted((x.id, x.node, x.gpus, x.milli, x.mig_start) for x in a.allocations())
        queue = [(e.workload_id, e.reason) for e in a.queue()]
        usage = a.usage()
        free = sorted((s.name, tuple(s.free_milli), s.cpu_free, s.mem_free) for s in a.cluster)
        return (allocs, queue, usage, free)


AllocatorHistory.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_allocator_histories = AllocatorHistory.TestCase
