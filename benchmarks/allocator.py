"""Allocator decision latency on a big simulated cluster.

``python -m benchmarks.allocator --gpus 10000 [--decisions 5000] [--seed 1] [--db-url URL]
[--json OUT.json]`` builds N GPUs as 8-GPU nodes (mostly H100-80GB NVSwitch, some A100-80GB with
MIG layouts, some shareable T4), 20 tenants with per-flavor quotas (some in cohorts), fills the
cluster to about 80 % and then drives the real ``Allocator`` over a real database with a seeded
stream of requests (whole GPUs, MIG, shares, gangs) and releases that keeps it 70-90 % full.

Each ``request()``/``release()`` is timed with ``perf_counter_ns``; the time spent in
``Store.commit`` is measured separately by a ``Store`` subclass, so the report splits each
decision into database commit and in-memory deciding.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from policies import mig
from policies.errors import Forbidden
from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.placement.scorers import policy as named_policy
from policies.requests import DeviceRequest, TopologyRequirement, WorkloadKind, WorkloadRequest
from policies.topology import LinkClass, Topology
from portal.allocator import Allocator
from portal.allocator.memory import Live
from portal.allocator.state import State
from portal.inventory.simulated import generate
from portal.store.records import ChangeSet, WorkloadState
from portal.store.writer import Store

GPUS_PER_NODE = 8
TENANTS = 20
FILL_LOW, FILL_HIGH = 0.70, 0.90
MAX_QUEUED = 300  # a queue longer than this is trimmed by cancelling (users give up)

# A100-80GB MIG layouts (profile, start); every node uses one layout on all its GPUs.
MIG_LAYOUTS: tuple[tuple[tuple[str, int], ...], ...] = (
    tuple(("1g.10gb", s) for s in range(7)),
    (("3g.40gb", 0), ("3g.40gb", 4)),
    (("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)),
    (("4g.40gb", 0), ("3g.40gb", 4)),
)
MIG_PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb")


class TimedStore(Store):
    """A store that adds the wall time of every commit to ``commit_ns`` and, with
    ``cpu=True``, the CPU time this process spent in it (all threads) to ``commit_cpu_ns``.

    The CPU split is off by default: a CPU clock read is a system call, and two of them
    inside every timed decision made decisions 2-5x slower in wall time (p50) on the loaded
    2-core machine, at the same CPU per decision (benchmarks/results/allocator.md)."""

    def __init__(self, url: str, *, cpu: bool = False) -> None:
        super().__init__(url)
        self.cpu = cpu
        self.commit_ns = 0
        self.commit_cpu_ns = 0
        self.commits = 0

    def commit_all(self, batch: Iterable[ChangeSet]) -> None:
        t0 = time.perf_counter_ns()
        c0 = time.process_time_ns() if self.cpu else 0
        try:
            super().commit_all(batch)
        finally:
            self.commit_ns += time.perf_counter_ns() - t0
            if self.cpu:
                self.commit_cpu_ns += time.process_time_ns() - c0
            self.commits += 1


@dataclass
class Clock:
    """Simulated time: one second passes per decision."""

    now: datetime = field(default_factory=lambda: datetime(2026, 11, 2, 9, 0, tzinfo=UTC))

    def __call__(self) -> datetime:
        return self.now


def _a100_mig(name: str, rack: str, layout: tuple[tuple[str, int], ...]) -> Node:
    geom = mig.geometry("A100-80GB")
    insts = tuple(mig.MigInstance(p, s) for p, s in layout)
    mig.validate_layout(geom, insts)
    return Node(
        name,
        tuple(
            GPU(i, "A100-80GB", 81920, uuid=f"GPU-{name}-{i}", mig_enabled=True, mig_layout=insts)
            for i in range(GPUS_PER_NODE)
        ),
        cpu_milli=128_000,
        memory_mib=1024 * 1024,
        topology=Topology.uniform(GPUS_PER_NODE, LinkClass.NVSWITCH),
        rack=rack,
    )


def _t4(name: str, rack: str) -> Node:
    return Node(
        name,
        tuple(
            GPU(i, "T4", 15360, uuid=f"GPU-{name}-{i}", shareable=True)
            for i in range(GPUS_PER_NODE)
        ),
        cpu_milli=64_000,
        memory_mib=256 * 1024,
        topology=Topology.uniform(GPUS_PER_NODE, LinkClass.SAME_NUMA),
        rack=rack,
    )


def inventory(gpus: int) -> list[Node]:
    """``gpus`` // 8 nodes: 80 % 8x H100 (preset hgx-h100-8), 12 % 8x A100 MIG, 8 % 8x T4."""
    n = max(3, gpus // GPUS_PER_NODE)
    n_a100 = max(1, n * 12 // 100)
    n_t4 = max(1, n * 8 // 100)
    n_h100 = n - n_a100 - n_t4
    nodes = [replace_uuids(nd) for nd in generate({"hgx-h100-8": n_h100}, nodes_per_rack=8)]
    racks = len(nodes) // 8 + 1
    for i in range(n_a100):
        nodes.append(_a100_mig(f"a100-mig-{i + 1}", f"r{racks + i // 8}", MIG_LAYOUTS[i % 4]))
    racks += n_a100 // 8 + 1
    for i in range(n_t4):
        nodes.append(_t4(f"t4-8-{i + 1}", f"r{racks + i // 8}"))
    return nodes


def replace_uuids(node: Node) -> Node:
    from dataclasses import replace

    gpus = tuple(replace(g, uuid=f"GPU-{node.name}-{g.index}") for g in node.gpus)
    return replace(node, gpus=gpus)


def setup_tenants(alloc: Allocator, rng: random.Random) -> list[str]:
    """20 tenants; 12 in three cohorts of 4. Per flavor: guaranteed shares sum to ~90 % of
    capacity, limits are 1.5-3x guaranteed (cohort members borrow)."""
    names = [f"team-{i:02d}" for i in range(TENANTS)]
    cap = alloc.capacity
    weights = [rng.uniform(0.5, 1.5) for _ in names]
    total_w = sum(weights)
    for i, t in enumerate(names):
        alloc.set_tenant(t, cohort=f"cohort-{i // 4}" if i < 12 else None)
    for fl, amount in sorted(cap.items()):
        for t, w in zip(names, weights, strict=True):
            g = int(amount * 0.9 * w / total_w)
            lim = max(g, int(g * rng.uniform(1.5, 3.0)))
            alloc.set_quota(t, fl, guaranteed=g, limit=lim)
    return names


def random_request(
    rng: random.Random, tenants: Sequence[str], i: int, profiles: Sequence[str] = MIG_PROFILES
) -> WorkloadRequest:
    tenant = rng.choice(tenants)
    r = rng.random()
    gang = 1
    kind = WorkloadKind.NOTEBOOK
    if r < 0.62:
        count = rng.choices((1, 2, 4, 8), weights=(45, 25, 18, 12))[0]
        dev = DeviceRequest(
            FlavorKind.GPU,
            count=count,
            models=frozenset({"H100-80GB"}),
            cpu_milli=8000 * count,
            memory_mib=65536 * count,
            topology=TopologyRequirement.NVLINK if count > 1 else TopologyRequirement.ANY,
        )
    elif r < 0.80:
        dev = DeviceRequest(
            FlavorKind.MIG,
            mig_profile=rng.choice(profiles),
            models=frozenset({"A100-80GB"}),
            cpu_milli=4000,
            memory_mib=32768,
        )
    elif r < 0.97:
        dev = DeviceRequest(
            FlavorKind.SHARE,
            milli=rng.choice((250, 500)),
            gpu_memory_mib=4096,
            models=frozenset({"T4"}),
            cpu_milli=2000,
            memory_mib=8192,
        )
    else:
        gang = rng.choice((2, 4))
        kind = WorkloadKind.JOB
        dev = DeviceRequest(
            FlavorKind.GPU,
            count=8,
            models=frozenset({"H100-80GB"}),
            cpu_milli=64000,
            memory_mib=524288,
            topology=TopologyRequirement.SAME_RACK,
        )
    return WorkloadRequest(tenant, "u", f"wl-{i}", dev, kind=kind, gang_size=gang)


def random_request_whole(tenant: str, count: int) -> WorkloadRequest:
    """A plain whole-GPU H100 request (for tests)."""
    dev = DeviceRequest(FlavorKind.GPU, count=count, models=frozenset({"H100-80GB"}))
    return WorkloadRequest(tenant, "u", f"whole-{count}", dev)


def _pct(sorted_ns: list[int], q: float) -> float:
    if not sorted_ns:
        return 0.0
    k = min(len(sorted_ns) - 1, round(q * (len(sorted_ns) - 1)))
    return sorted_ns[k] / 1e6


def _stats(ns: list[int]) -> dict[str, float | int]:
    s = sorted(ns)
    return {
        "count": len(s),
        "p50_ms": round(_pct(s, 0.50), 3),
        "p90_ms": round(_pct(s, 0.90), 3),
        "p99_ms": round(_pct(s, 0.99), 3),
        "max_ms": round(s[-1] / 1e6, 3) if s else 0.0,
        "mean_ms": round(sum(s) / len(s) / 1e6, 3) if s else 0.0,
    }


def check_invariants(alloc: Allocator) -> list[str]:
    """Compare every live allocation against every other: no whole GPU handed out twice, no
    overlapping MIG instances, shares of one GPU within 1000 milli and never on a whole GPU."""
    problems: list[str] = []
    whole: dict[tuple[str, int], str] = {}
    mig_slots: dict[tuple[str, int], list[tuple[int, int, str]]] = {}
    milli: Counter[tuple[str, int]] = Counter()
    for a in alloc.allocations():
        for g in a.gpus:
            key = (a.node, g)
            if a.mig_profile is not None:
                geom = mig.geometry(alloc.cluster.node(a.node).node.gpus[g].model)
                size = geom.profile(a.mig_profile).memory_slices
                start = a.mig_start or 0
                for s0, s1, other in mig_slots.get(key, []):
                    if start < s1 and s0 < start + size:
                        problems.append(f"MIG overlap on {key}: {a.id} and {other}")
                mig_slots.setdefault(key, []).append((start, start + size, a.id))
            elif a.milli:
                milli[key] += a.milli
            else:
                if key in whole:
                    problems.append(f"GPU {key} held by {whole[key]} and {a.id}")
                whole[key] = a.id
    for key, m in milli.items():
        if m > 1000:
            problems.append(f"GPU {key} shared over 1000 milli ({m})")
        if key in whole:
            problems.append(f"GPU {key} both shared and held whole by {whole[key]}")
    for key in mig_slots:
        if key in whole or key in milli:
            problems.append(f"GPU {key} both MIG and whole/shared")
    return problems


def _live(state: State, wid: str) -> Live | None:
    return state.live.get(wid)


def _fill(alloc: Allocator, total_gpus: int) -> float:
    """The share of the cluster's GPUs in use. The driver asks before every decision, under
    the allocator's lock: ``total_gpus`` is counted once, since a walk of every node here
    would hold the lock (and the interpreter) long enough to slow the decisions measured."""

    def fill(state: State) -> float:
        used = sum(sum(v.values()) for v in state.ledger.gpu_equivalents.values())
        return used / max(1, total_gpus)

    return alloc.read(fill)


def run(
    gpus: int,
    decisions: int,
    seed: int,
    db_url: str | None,
    workdir: Path,
    policy_name: str | None = None,
    commit_cpu: bool = False,
) -> dict[str, Any]:
    rng = random.Random(seed)
    url = db_url or f"sqlite:///{workdir / 'allocator-bench.db'}"
    nodes = inventory(gpus)
    total_gpus = sum(len(n.gpus) for n in nodes)
    clock = Clock()
    store = TimedStore(url, cpu=commit_cpu)
    try:
        alloc = Allocator(
            store, clock=clock, policy=named_policy(policy_name) if policy_name else None
        )
        t0 = time.perf_counter()
        alloc.start(nodes)
        tenants = setup_tenants(alloc, rng)
        setup_s = time.perf_counter() - t0
        live: list[str] = []
        n_req = 0
        offered = [p for p in MIG_PROFILES if f"A100-80GB/{p}" in alloc.capacity]

        def submit() -> str:
            """The request's outcome: a workload state, or ``refused`` when no quota of the
            tenant could ever admit it (a gang above its limit)."""
            nonlocal n_req
            n_req += 1
            dur = rng.uniform(600, 8 * 3600)
            try:
                s = alloc.request(
                    random_request(rng, tenants, n_req, offered), expected_duration_s=dur
                )
            except Forbidden:
                return "refused"
            live.append(s.id)
            return s.state.value

        def pick(want: WorkloadState | None) -> str | None:
            for _ in range(20):
                if not live:
                    return None
                k = rng.randrange(len(live))
                wid = live[k]
                lv = alloc.read(partial(_live, wid=wid))
                if lv is None:  # finished meanwhile (preempted, cancelled)
                    live[k] = live[-1]
                    live.pop()
                    continue
                if want is None or lv.rec.state is want:
                    live[k] = live[-1]
                    live.pop()
                    return wid
            return None

        # Warm-up: fill to the middle of the band (not measured).
        t0 = time.perf_counter()
        guard = 0
        while _fill(alloc, total_gpus) < (FILL_LOW + FILL_HIGH) / 2 and guard < gpus * 2:
            guard += 1
            submit()
            clock.now += timedelta(seconds=1)
        warmup_s = time.perf_counter() - t0
        warm_requests = n_req

        req_ns: list[int] = []
        rel_ns: list[int] = []
        req_commit_ns: list[int] = []
        rel_commit_ns: list[int] = []
        outcomes: Counter[str] = Counter()
        fills: list[float] = []
        queued_est = 0
        t_start = time.perf_counter_ns()
        measured_ns = 0
        # CPU time of this process inside the timed calls: unlike wall time, barely moved by
        # other processes on a shared machine (the database server's own CPU is not in it).
        cpu_ns = 0
        rel_cpu_ns = 0  # of it, inside releases (their partial scheduling cycles)
        commit_cpu0 = store.commit_cpu_ns
        for i in range(decisions):
            clock.now += timedelta(seconds=1)
            fill = _fill(alloc, total_gpus)
            if i % 100 == 0:
                fills.append(fill)
                queued_est = alloc.read(lambda state: len(state.queued))
            do_request = fill < FILL_LOW or (fill <= FILL_HIGH and rng.random() < 0.5)
            if do_request and queued_est < MAX_QUEUED:
                c0 = store.commit_ns
                cpu = time.process_time_ns()
                t = time.perf_counter_ns()
                state = submit()
                dt = time.perf_counter_ns() - t
                cpu_ns += time.process_time_ns() - cpu
                req_ns.append(dt)
                req_commit_ns.append(store.commit_ns - c0)
                outcomes[f"request->{state}"] += 1
                if state == WorkloadState.QUEUED.value:
                    queued_est += 1
            else:
                want = WorkloadState.QUEUED if queued_est >= MAX_QUEUED else WorkloadState.RUNNING
                wid = pick(want) or pick(None)
                if wid is None:
                    continue
                c0 = store.commit_ns
                cpu = time.process_time_ns()
                t = time.perf_counter_ns()
                st = alloc.release(wid)
                dt = time.perf_counter_ns() - t
                cpu = time.process_time_ns() - cpu
                cpu_ns += cpu
                rel_cpu_ns += cpu
                rel_ns.append(dt)
                rel_commit_ns.append(store.commit_ns - c0)
                outcomes[f"release->{st.state.value}"] += 1
                if st.state is WorkloadState.CANCELLED:
                    queued_est -= 1
            measured_ns += dt
        wall_s = (time.perf_counter_ns() - t_start) / 1e9
        all_ns = req_ns + rel_ns
        commit_total = sum(req_commit_ns) + sum(rel_commit_ns)
        decided = len(all_ns)
        problems = check_invariants(alloc)
        states = alloc.read(lambda st: Counter(lv.rec.state.value for lv in st.live.values()))
        return {
            "benchmark": "allocator",
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "machine": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpus": _cpus(),
            },
            "params": {
                "policy": alloc.policy.name,
                "gpus": total_gpus,
                "nodes": len(nodes),
                "decisions": decisions,
                "seed": seed,
                "db": url.split(":", 1)[0],
            },
            "capacity": alloc.capacity,
            "setup_s": round(setup_s, 2),
            "warmup": {"requests": warm_requests, "seconds": round(warmup_s, 2)},
            "latency": {
                "all": _stats(all_ns),
                "request": _stats(req_ns),
                "release": _stats(rel_ns),
            },
            "throughput_per_s": round(decided / (measured_ns / 1e9), 1) if measured_ns else 0.0,
            "throughput_wall_per_s": round(decided / wall_s, 1) if wall_s else 0.0,
            "commit_share": round(commit_total / measured_ns, 3) if measured_ns else 0.0,
            "cpu_ms_per_decision": {
                "all": round(cpu_ns / max(1, decided) / 1e6, 3),
                "request": round((cpu_ns - rel_cpu_ns) / max(1, len(req_ns)) / 1e6, 3),
                "release": round(rel_cpu_ns / max(1, len(rel_ns)) / 1e6, 3),
                "commit": (
                    round((store.commit_cpu_ns - commit_cpu0) / max(1, decided) / 1e6, 3)
                    if commit_cpu
                    else None
                ),
            },
            "commit_ms": {
                "request": _stats(req_commit_ns),
                "release": _stats(rel_commit_ns),
            },
            "fill": {
                "min": round(min(fills), 3) if fills else 0.0,
                "max": round(max(fills), 3) if fills else 0.0,
                "end": round(_fill(alloc, total_gpus), 3),
            },
            "outcomes": dict(sorted(outcomes.items())),
            "end_states": dict(sorted(states.items())),
            "allocations": len(alloc.allocations()),
            "invariant_violations": problems,
        }
    finally:
        store.close()


def _cpus() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 0


def table(r: dict[str, Any]) -> str:
    p = r["params"]
    lines = [
        f"allocator: {p['gpus']} GPUs / {p['nodes']} nodes, {p['decisions']} decisions, "
        f"seed {p['seed']}, {p['db']}",
        f"{'':10} {'count':>6} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}",
    ]
    for k in ("all", "request", "release"):
        s = r["latency"][k]
        lines.append(
            f"{k:10} {s['count']:>6} {s['p50_ms']:>8.3f} {s['p90_ms']:>8.3f} "
            f"{s['p99_ms']:>8.3f} {s['max_ms']:>8.3f}"
        )
    lines.append(
        f"throughput {r['throughput_per_s']:.0f} decisions/s "
        f"(wall incl. driver {r['throughput_wall_per_s']:.0f}/s); "
        f"Store.commit share {r['commit_share'] * 100:.1f} %"
    )
    cpu = r["cpu_ms_per_decision"]
    split = (
        f" (of which in Store.commit {cpu['commit']:.3f} ms)" if cpu["commit"] is not None else ""
    )
    lines.append(
        f"CPU of this process per decision {cpu['all']:.3f} ms{split}; "
        f"request {cpu['request']:.3f} ms, release {cpu['release']:.3f} ms"
    )
    lines.append(
        f"fill {r['fill']['min']:.2f}-{r['fill']['max']:.2f}; outcomes {r['outcomes']}; "
        f"invariant violations {len(r['invariant_violations'])}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.allocator", description=__doc__)
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--decisions", type=int, default=5_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--db-url", default=None, help="default: SQLite in a temporary directory")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--policy", default=None, help="placement policy (default: the allocator's default)"
    )
    ap.add_argument(
        "--clients",
        default=None,
        help="concurrent mode: comma-separated client thread counts (e.g. 1,4,8), each run "
        "on SQLite and on PostgreSQL (--db-url or --postgres) side by side",
    )
    ap.add_argument(
        "--postgres",
        action="store_true",
        help="start a throwaway local PostgreSQL with fsync and synchronous_commit on",
    )
    ap.add_argument(
        "--both",
        action="store_true",
        help="single-client mode: run on SQLite, then on PostgreSQL (--db-url or --postgres), "
        "and measure PostgreSQL's bare commit floor in the same run",
    )
    ap.add_argument(
        "--commit-cpu",
        action="store_true",
        help="single-client mode: also the CPU time inside Store.commit (reads the CPU clock "
        "around every commit, which adds wall time to each decision on a loaded machine)",
    )
    args = ap.parse_args(argv)
    server = None
    if args.postgres:
        from tests.support.postgres import start_server

        server = start_server(durable=True)
        server.execute('CREATE DATABASE "bench"')
        args.db_url = server.url("bench")
    try:
        with tempfile.TemporaryDirectory(prefix="allocator-bench-") as tmp:
            if args.clients:
                return _concurrent(args, Path(tmp), argv)
            if args.both and args.db_url:
                return _both(args, Path(tmp), argv)
            r = run(
                args.gpus,
                args.decisions,
                args.seed,
                args.db_url,
                Path(tmp),
                args.policy,
                args.commit_cpu,
            )
    finally:
        if server is not None:
            from tests.support.postgres import stop_server

            stop_server(server)
    r["command"] = "python -m benchmarks.allocator " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    print(table(r))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(r, indent=2, default=str) + "\n", encoding="utf-8")
    return r


def _both(args: argparse.Namespace, tmp: Path, argv: Sequence[str] | None) -> dict[str, Any]:
    """Single client on SQLite, then on PostgreSQL, with PostgreSQL's commit floor."""
    from benchmarks.allocator_clients import commit_floor, emptied

    command = "python -m benchmarks.allocator " + " ".join(sys.argv[1:] if argv is None else argv)
    floor = commit_floor(args.db_url)
    print(
        f"PostgreSQL commit floor (INSERT one row; COMMIT, one client): "
        f"{floor['commits_per_s']:.0f}/s, p50 {floor['p50_ms']:.2f} ms, "
        f"p99 {floor['p99_ms']:.2f} ms",
        flush=True,
    )
    runs = []
    for url in (None, emptied(args.db_url)):
        r = run(args.gpus, args.decisions, args.seed, url, tmp, args.policy, args.commit_cpu)
        print(table(r), flush=True)
        runs.append(r)
    out = {"benchmark": "allocator-both", "command": command, "floor": floor, "runs": runs}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=str) + "\n", encoding="utf-8")
    return out


def _concurrent(args: argparse.Namespace, tmp: Path, argv: Sequence[str] | None) -> dict[str, Any]:
    from benchmarks import allocator_clients

    urls = {"sqlite": "sqlite://"}
    if args.db_url:
        urls["postgresql"] = args.db_url
    counts = [int(x) for x in args.clients.split(",")]
    floor = None
    if args.db_url:
        floor = allocator_clients.commit_floor(args.db_url)
        print(
            f"PostgreSQL commit floor (INSERT one row; COMMIT, one client): "
            f"{floor['commits_per_s']:.0f}/s, p50 {floor['p50_ms']:.2f} ms, "
            f"p99 {floor['p99_ms']:.2f} ms",
            flush=True,
        )
    runs = allocator_clients.compare(
        args.gpus, args.decisions, args.seed, counts, urls, tmp, args.policy
    )
    r = {
        "benchmark": "allocator-clients",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "command": "python -m benchmarks.allocator "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "floor": floor,
        "runs": runs,
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(r, indent=2, default=str) + "\n", encoding="utf-8")
    return r


if __name__ == "__main__":
    main()
