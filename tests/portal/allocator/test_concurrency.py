"""1,000 concurrent requests from 20 tenants against 64 GPUs, on SQLite and PostgreSQL."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from policies.errors import Forbidden
from policies.inventory import Node
from portal.allocator import Allocator, WorkloadStatus
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import gpus, hgx, wl

Make = Callable[[list[Node]], Allocator]


def test_concurrent_requests_never_double_allocate_or_exceed_a_quota(make_allocator: Make) -> None:
    a = make_allocator([hgx(f"n{i}", rack=f"r{i % 2}") for i in range(8)])  # 64 GPUs
    tenants = [f"team-{i:02d}" for i in range(20)]
    for i, t in enumerate(tenants):
        a.set_tenant(t, cohort="all" if i % 2 else None)
        a.set_quota(t, "H100-80GB", guaranteed=3, limit=3 + i % 5)
    rng = random.Random(7)
    jobs = [(tenants[rng.randrange(20)], rng.choice([1, 1, 1, 2, 4])) for _ in range(1000)]

    def ask(job: tuple[str, int]) -> WorkloadStatus | Forbidden:
        tenant, count = job
        try:
            return a.request(wl(tenant, gpus(count), name=f"w-{tenant}-{count}", owner=tenant))
        except Forbidden as refused:  # more than the tenant's limit: never admissible
            return refused

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(ask, jobs))

    assert len(results) == 1000
    limit_of = {t: 3 + i % 5 for i, t in enumerate(tenants)}
    for (tenant, count), r in zip(jobs, results, strict=True):
        assert isinstance(r, Forbidden) == (count > limit_of[tenant]), (tenant, count, r)
    answers = [r for r in results if not isinstance(r, Forbidden)]
    held: Counter[tuple[str, int]] = Counter()
    used: Counter[str] = Counter()
    for s in answers:
        assert s.state in (WorkloadState.RUNNING, WorkloadState.QUEUED)
        if s.state is WorkloadState.QUEUED:
            assert s.reason in ("quota", "capacity") and s.message
    for alloc in a.allocations():
        for g in alloc.gpus:
            held[(alloc.node, g)] += 1
    for s in a.workloads():
        if s.state is WorkloadState.RUNNING:
            used[s.tenant] += sum(len(x.gpus) for x in s.allocations)
    assert held and max(held.values()) == 1, "a GPU is held twice"
    limits = {q.tenant: q.limit for q in a.quotas()}
    for tenant, n in used.items():
        assert n <= limits[tenant], f"{tenant} holds {n} > limit {limits[tenant]}"
    assert sum(held.values()) <= 64
    # The database agrees with memory.
    stored = a._store.load()
    assert sorted(x.id for x in stored.allocations) == sorted(x.id for x in a.allocations())
    queued = {s.id for s in a.workloads() if s.state is WorkloadState.QUEUED}
    assert {w.id for w in stored.workloads if w.state is WorkloadState.QUEUED} == queued
