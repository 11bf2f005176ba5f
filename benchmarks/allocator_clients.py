"""Concurrent mode of ``benchmarks.allocator``: N client threads share one allocator.

Each client issues requests and releases like the single-client driver (the same request mix,
the same fill band) and times every call from the call to its return, which the allocator
gives only after the decision's batch is committed and applied (group commit). Throughput is
decisions over the wall time of the measured phase.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks import allocator as single
from policies.errors import Forbidden
from policies.placement.scorers import policy as named_policy
from portal.allocator import Allocator
from portal.store.records import WorkloadState


class SharedClock:
    """Simulated time shared by the clients: one millisecond passes per decision."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        return self.now

    def tick(self, delta: timedelta) -> None:
        with self._lock:
            self.now += delta


def run_clients(
    gpus: int,
    decisions: int,
    seed: int,
    url: str,
    clients: int,
    policy_name: str | None = None,
) -> dict[str, Any]:
    nodes = single.inventory(gpus)
    total_gpus = sum(len(n.gpus) for n in nodes)
    clock = SharedClock()
    store = single.TimedStore(url)
    try:
        alloc = Allocator(
            store,
            clock=clock,
            policy=named_policy(policy_name) if policy_name else None,
        )
        rng = random.Random(seed)
        alloc.start(nodes)
        tenants = single.setup_tenants(alloc, rng)
        offered = [p for p in single.MIG_PROFILES if f"A100-80GB/{p}" in alloc.capacity]
        counter = iter(range(10**9))
        live: list[list[str]] = [[] for _ in range(clients)]
        band = (single.FILL_LOW + single.FILL_HIGH) / 2

        def submit(c: int, r: random.Random) -> str:
            try:
                s = alloc.request(
                    single.random_request(r, tenants, next(counter), offered),
                    expected_duration_s=r.uniform(600, 8 * 3600),
                )
            except Forbidden:
                return "refused"
            live[c].append(s.id)
            return s.state.value

        guard = 0
        while single._fill(alloc, total_gpus) < band and guard < gpus * 2:  # warm-up, one client
            guard += 1
            submit(guard % clients, rng)
            clock.tick(timedelta(seconds=1))

        lat: list[list[int]] = [[] for _ in range(clients)]
        outcomes: list[Counter[str]] = [Counter() for _ in range(clients)]
        left = [decisions]
        left_lock = threading.Lock()
        errors: list[BaseException] = []
        depths: list[list[int]] = [[] for _ in range(clients)]

        def client(c: int) -> None:
            r = random.Random(seed * 1000 + c)
            mine = live[c]
            try:
                while True:
                    with left_lock:
                        if left[0] <= 0:
                            return
                        left[0] -= 1
                    clock.tick(timedelta(milliseconds=1))
                    fill = single._fill(alloc, total_gpus)
                    ask = fill < single.FILL_LOW or (fill <= single.FILL_HIGH and r.random() < 0.5)
                    if not mine:
                        ask = True
                    depths[c].append(alloc.chain_depth)
                    t = time.perf_counter_ns()
                    if ask:
                        outcomes[c][f"request->{submit(c, r)}"] += 1
                    else:
                        wid = mine.pop(r.randrange(len(mine)))
                        st = alloc.release(wid)
                        outcomes[c][f"release->{st.state.value}"] += 1
                    lat[c].append(time.perf_counter_ns() - t)
            except BaseException as err:  # reported, not swallowed
                errors.append(err)

        commits0 = store.commits
        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        t0 = time.perf_counter_ns()
        cpu0 = time.process_time_ns()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall_s = (time.perf_counter_ns() - t0) / 1e9
        # All threads, the clients' own driving included; not the database server's.
        cpu_ns = time.process_time_ns() - cpu0
        if errors:
            raise errors[0]
        all_ns = [x for per in lat for x in per]
        total: Counter[str] = Counter()
        for o in outcomes:
            total.update(o)
        return {
            "db": url.split(":", 1)[0],
            "clients": clients,
            "gpus": sum(len(n.gpus) for n in nodes),
            "decisions": len(all_ns),
            "latency": single._stats(all_ns),
            "throughput_per_s": round(len(all_ns) / wall_s, 1) if wall_s else 0.0,
            "cpu_ms_per_decision": round(cpu_ns / max(1, len(all_ns)) / 1e6, 3),
            "transactions": store.commits - commits0,
            # Drafts a decision read through when it began (group commit's chains).
            "chain_depth_mean": round(sum(map(sum, depths)) / max(1, len(all_ns)), 2),
            "chain_depth_max": max((max(d) for d in depths if d), default=0),
            "outcomes": dict(sorted(total.items())),
            "invariant_violations": single.check_invariants(alloc),
            "workloads_running": sum(
                1 for s in alloc.workloads() if s.state is WorkloadState.RUNNING
            ),
        }
    finally:
        store.close()


def emptied(url: str) -> str:
    """``url``, with every portal table of that PostgreSQL database emptied (if it has them),
    so each run starts from nothing as it does on a new SQLite file."""
    import psycopg

    from portal.store.models import metadata

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        present = {
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        }
        tables = [t.name for t in metadata.sorted_tables if t.name in present and t.name != "meta"]
        if tables:
            conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE".encode())
    return url


def commit_floor(url: str, commits: int = 1000) -> dict[str, Any]:
    """The fastest a single client can commit on this server and disk: ``INSERT`` one row and
    ``COMMIT``, one after the other (each waits for its WAL flush). No decision can commit
    faster alone; only a batch shares one flush."""
    import psycopg

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    ns: list[int] = []
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_commit_floor (i integer)")
        conn.commit()
        try:
            for i in range(commits):
                t = time.perf_counter_ns()
                conn.execute("INSERT INTO bench_commit_floor VALUES (%s)", (i,))
                conn.commit()
                ns.append(time.perf_counter_ns() - t)
        finally:
            conn.execute("DROP TABLE bench_commit_floor")
            conn.commit()
        settings = {
            name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in ("fsync", "synchronous_commit", "wal_sync_method")
        }
    stats = single._stats(ns)
    return {
        "commits_per_s": round(len(ns) / (sum(ns) / 1e9), 1),
        "p50_ms": stats["p50_ms"],
        "p99_ms": stats["p99_ms"],
        **settings,
    }


def row(r: dict[str, Any]) -> str:
    s = r["latency"]
    per_tx = r["decisions"] / r["transactions"] if r["transactions"] else 0.0
    return (
        f"{r['db']:<20} {r['clients']:>7} {r['decisions']:>9} {r['throughput_per_s']:>11.0f} "
        f"{s['p50_ms']:>7.2f} {s['p99_ms']:>7.2f} {per_tx:>8.1f} "
        f"{r['chain_depth_mean']:>6.1f} {r['chain_depth_max']:>5} "
        f"{len(r['invariant_violations']):>4} {r['cpu_ms_per_decision']:>7.3f}"
    )


HEADER = (
    f"{'database':<20} {'clients':>7} {'decisions':>9} {'decisions/s':>11} "
    f"{'p50 ms':>7} {'p99 ms':>7} {'per tx':>8} {'chain':>6} {'max':>5} {'bad':>4} "
    f"{'CPU ms':>7}"
)


def compare(
    gpus: int,
    decisions: int,
    seed: int,
    clients: list[int],
    urls: dict[str, str],
    workdir: Path,
    policy_name: str | None,
) -> list[dict[str, Any]]:
    """Every client count on every database, alternating databases, printed as they end."""
    print(HEADER, flush=True)
    out = []
    for n in clients:
        for name, url in urls.items():
            if url.startswith("sqlite"):
                db = workdir / f"{name}-{n}.db"
                url = f"sqlite:///{db}"
            else:
                url = emptied(url)
            r = run_clients(gpus, decisions, seed, url, n, policy_name)
            r["db"] = name
            print(row(r), flush=True)
            out.append(r)
    return out
