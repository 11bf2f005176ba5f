"""Commit latency of typical allocator decisions, on SQLite and PostgreSQL.

A decision is what the allocator commits when it starts a workload: one workload upsert, 1-8
allocations (each with its device claims) and one event. Every fourth decision also ends an
earlier workload (workload update + release). PostgreSQL runs with its durable defaults
(fsync and synchronous_commit on); SQLite in WAL with synchronous=NORMAL, as the store uses it.

Run: ``python -m benchmarks.store [--decisions N] [--skip-postgres]``.
"""

from __future__ import annotations

import argparse
import platform
import sqlite3
import statistics
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from portal.store.records import (
    AllocationRecord,
    ChangeSet,
    EventRecord,
    TenantRecord,
    WorkloadRecord,
    WorkloadState,
)
from portal.store.writer import Store

GPUS_PER_NODE = 8
SIZES = (1, 2, 4, 8)
T0 = datetime(2025, 3, 1, tzinfo=UTC)


def decision(i: int) -> tuple[ChangeSet, WorkloadRecord]:
    """The i-th decision: a workload with SIZES[i % 4] allocations of one whole GPU each."""
    now = T0 + timedelta(seconds=i)
    count = SIZES[i % len(SIZES)]
    w = WorkloadRecord(
        id=f"w{i}",
        tenant="acme",
        owner=f"user{i % 50}",
        name=f"job-{i}",
        kind="job",
        request={"members": [{"kind": "gpu", "count": 1}] * count},
        gang_size=count,
        priority=0,
        state=WorkloadState.RUNNING,
        created_at=now,
        started_at=now,
        idempotency_key=f"key-{i}",
    )
    allocations = [
        AllocationRecord(
            id=f"a{i}-{m}",
            workload_id=w.id,
            member=m,
            node=f"node-{i}",
            flavor="H100-80GB",
            amount=1,
            gpu_equivalent=1.0,
            gpus=(m % GPUS_PER_NODE,),
            gpu_uuids=(f"GPU-{i}-{m}",),
            milli=1000,
            gpu_memory_mib=81920,
            cpu_milli=8000,
            memory_mib=65536,
            created_at=now,
        )
        for m in range(count)
    ]
    event = EventRecord(
        at=now, kind="allocated", tenant="acme", workload_id=w.id, message=f"{count} GPUs"
    )
    return ChangeSet(workloads=[w], allocations=allocations, events=[event]), w


def run(url: str, decisions: int) -> dict[str, list[float]]:
    """Commit ``decisions`` decisions; latencies in ms by kind of decision."""
    latencies: dict[str, list[float]] = {f"{n} alloc": [] for n in SIZES}
    latencies["release"] = []
    with Store.open(url) as store:
        store.commit(ChangeSet(tenants=[TenantRecord("acme")]))
        started: list[WorkloadRecord] = []
        for i in range(decisions):
            changes, w = decision(i)
            t = time.perf_counter()
            store.commit(changes)
            latencies[f"{len(changes.allocations)} alloc"].append((time.perf_counter() - t) * 1000)
            started.append(w)
            if i % 4 == 3:
                old = started.pop(0)
                end = old.created_at + timedelta(minutes=5)
                ended = replace(old, state=WorkloadState.RELEASED, ended_at=end, version=2)
                released = [(f"a{old.id[1:]}-{m}", end) for m in range(old.gang_size)]
                t = time.perf_counter()
                store.commit(ChangeSet(workloads=[ended], released=released))
                latencies["release"].append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        state = store.load()
        latencies["load"] = [(time.perf_counter() - t) * 1000]
        latencies["load"].append(float(len(state.allocations)))
    return latencies


def report(name: str, latencies: dict[str, list[float]]) -> None:
    load_ms, active = latencies.pop("load")
    print(f"\n{name}")
    print(f"  {'decision':<10} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    everything: list[float] = []
    for kind, xs in latencies.items():
        everything += xs
        print(f"  {kind:<10} {len(xs):>6} {_q(xs, 50):>8.3f} {_q(xs, 99):>8.3f} {max(xs):>8.3f}")
    print(
        f"  {'all':<10} {len(everything):>6} {_q(everything, 50):>8.3f} "
        f"{_q(everything, 99):>8.3f} {max(everything):>8.3f}"
    )
    print(f"  load() with {int(active)} active allocations: {load_ms:.1f} ms")


def _q(xs: list[float], pct: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[pct - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=4000)
    parser.add_argument("--skip-postgres", action="store_true")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, SQLite {sqlite3.sqlite_version}")
    print(f"{args.decisions} decisions per engine, + 1 release per 4 decisions")
    with tempfile.TemporaryDirectory() as tmp:
        report(
            "SQLite (file, WAL, synchronous=NORMAL)",
            run(f"sqlite:///{Path(tmp) / 'bench.db'}", args.decisions),
        )
    if args.skip_postgres:
        return
    from tests.support.postgres import start_server, stop_server

    server = start_server(durable=True)
    try:
        server.execute('CREATE DATABASE "bench"')
        report(
            "PostgreSQL (local TCP, fsync on, synchronous_commit on)",
            run(server.url("bench"), args.decisions),
        )
    finally:
        stop_server(server)


if __name__ == "__main__":
    main()
