"""The openb trace replayed in time through the real allocator, and how good its ETAs are.

``python -m benchmarks.replay [--gpus 48] [--limit N] [--scale F] [--seed 1] [--json OUT]``
reads the openb nodes and pods (``benchmarks.openb.trace``), keeps a seeded sample of nodes
holding about ``--gpus`` GPUs (the whole cluster of the trace never queues: its peak demand is
about 1 % of it) and replays every GPU pod at its creation time on a virtual clock, through
``portal.allocator.Allocator`` over SQLite in a temporary directory. A pod runs for its real
length (deletion − creation) from the moment the allocator admits it; the replay releases it
then. Pods go to 10 tenants by a seeded hash; each flavor's guaranteed quotas add up to its
capacity and every limit is twice the guarantee (one cohort: a tenant borrows what others
leave and gives it back, by preemption, when they claim their guarantee). A pod larger than
its tenant's limit is refused, as the portal refuses it, and counted.

Three modes: ``declared`` (each request declares its real length as a time limit,
``expected_duration_s``: an exact limit, the easy case), ``limit`` (each declares a time limit
rounded up from its real length to a step people pick — 10 min, 30 min, 1 h, 2 h, 4 h, 8 h,
1 d, 3 d, 7 d, 30 d —, an upper bound as real limits are) and ``unknown`` (none does; only
run-length history can tell). Three
queue orders over the same allocator: ``gpuportal`` (its own: priority, the tenant's dominant
share, arrival), ``priority`` (strict priority, then arrival) and ``fifo`` (arrival only, every
pod at one priority). The baselines replace the allocator's ordering function
(``policies.fairness.queue_order``) for the run: every other rule (quotas, borrowing,
placement, preemption) is the allocator's own.

Every ETA the portal gives is recorded at submission and re-read (the whole queue at once)
at most every ``--reread-s`` virtual seconds while pods wait, against the wait that followed:
the replayed interval (``estimates.queue_intervals``, fed the completed run lengths per tenant
and kind), the portal's calibrated ``eta_s`` and interval (the allocator's own
``WaitLearning``, fed by its admissions) and the baseline position × mean service time.
``--jobs N`` runs the modes and orders in N processes (each run is independent).
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks.allocator import Clock, check_invariants
from benchmarks.openb.trace import DEFAULT_NODES, DEFAULT_PODS, TracePod, read_nodes, read_pods
from policies import eta as eta_policy
from policies import fairness
from policies.errors import Forbidden, InvalidRequest
from policies.requests import WorkloadKind, WorkloadRequest
from portal.allocator import Allocator, estimates
from portal.allocator.draft import Decision
from portal.store.records import WorkloadState
from portal.store.writer import Store

TENANTS = 10
LONG_WAIT_S = 60.0
PRIORITY = {"LS": 10, "Guaranteed": 10, "Burstable": 5, "BE": 0}
MODES = ("declared", "limit", "unknown")
# Time limits people pick: a real run's limit is the first step at or above its length.
LIMIT_STEPS_S = (600, 1800, 3600, 7200, 14400, 28800, 86400, 3 * 86400, 7 * 86400, 30 * 86400)


def time_limit(length: float) -> float:
    """The ``limit`` mode's declared time limit of a run of ``length`` seconds: rounded up to
    a step of ``LIMIT_STEPS_S`` (beyond the last, to whole multiples of it)."""
    for step in LIMIT_STEPS_S:
        if length <= step:
            return float(step)
    last = LIMIT_STEPS_S[-1]
    return float(math.ceil(length / last) * last)


ORDERS = ("gpuportal", "priority", "fifo")


def tenant_of(name: str, seed: int) -> str:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return f"team-{int.from_bytes(digest[:4], 'big') % TENANTS}"


def _hash_fraction(name: str, seed: int) -> float:
    digest = hashlib.sha256(f"sample:{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class Sample:
    """One ETA read while a pod waited: when, its queue position and what each estimator said."""

    at: float
    position: int
    portal: float | None
    point: float | None
    low: float | None
    high: float | None
    baseline: float | None
    first: bool
    raw: float | None = None  # the calibrated point before calibration (what it learns from)
    raw_low: float | None = None
    raw_high: float | None = None


@dataclass
class Pod:
    wid: str
    trace: TracePod
    tenant: str
    submit: float
    duration: float
    start: float | None = None
    end: float | None = None
    preempted: bool = False
    preempted_at: float | None = None
    samples: list[Sample] = field(default_factory=list)


def _fifo(items: Iterable[Any], shares: Any) -> list[Any]:
    return sorted(items, key=lambda i: (i.enqueued_at, i.seq))


def _strict(items: Iterable[Any], shares: Any) -> list[Any]:
    return sorted(items, key=lambda i: (-i.priority, i.enqueued_at, i.seq))


@contextmanager
def queue_order(order: str) -> Iterator[None]:
    """Run the allocator with a baseline queue order (module docstring)."""
    original = fairness.queue_order
    replacement: Callable[..., Any] | None = {"fifo": _fifo, "priority": _strict}.get(order)
    if replacement is not None:
        fairness.queue_order = replacement
    try:
        yield
    finally:
        fairness.queue_order = original


def select(
    nodes_path: Path, pods_path: Path, gpus: int, scale: float, limit: int | None, seed: int
) -> tuple[list[Any], list[TracePod]]:
    """Nodes in a seeded order until ``gpus`` GPUs; GPU pods sampled by ``scale`` (a seeded
    hash), by creation time, the first ``limit``."""
    nodes = [n for n in read_nodes(nodes_path) if n.gpus > 0]
    random.Random(seed).shuffle(nodes)
    kept, total = [], 0
    for n in nodes:
        if total >= gpus:
            break
        kept.append(n)
        total += n.gpus
    pods = [
        p
        for p in read_pods(pods_path)
        if p.total_milli > 0
        and p.deletion_time is not None
        and _hash_fraction(p.name, seed) < scale
    ]
    pods.sort(key=lambda p: (p.creation_time, p.name))
    return kept, pods[:limit] if limit is not None else pods


def _set_quotas(alloc: Allocator) -> None:
    names = [f"team-{i}" for i in range(TENANTS)]
    for t in names:
        alloc.set_tenant(t, cohort="replay")
    for fl, cap in sorted(alloc.capacity.items()):
        for i, t in enumerate(names):
            g = cap // TENANTS + (1 if i < cap % TENANTS else 0)
            alloc.set_quota(t, fl, guaranteed=g, limit=min(cap, max(2 * g, 1)))


def replay(
    nodes: Sequence[Any],
    pods: Sequence[TracePod],
    mode: str,
    order: str,
    seed: int,
    workdir: Path,
    reread_s: float = 300.0,
    keep: list[Pod] | None = None,
) -> dict[str, Any]:
    """One run's report; ``keep``, when given, receives every pod with its ETA reads (for
    ``benchmarks.eta_diagnosis``)."""
    if mode not in MODES:
        raise InvalidRequest("mode", mode, " or ".join(MODES))
    if order not in ORDERS:
        raise InvalidRequest("order", order, " or ".join(ORDERS))
    clock = Clock()
    base = clock.now.timestamp()
    store = Store(f"sqlite:///{workdir / f'replay-{mode}-{order}.db'}")
    t_wall = time.perf_counter()
    with queue_order(order):
        try:
            return _run(nodes, pods, mode, order, seed, clock, base, store, reread_s, t_wall, keep)
        finally:
            store.close()


def _run(
    nodes: Sequence[Any],
    pods: Sequence[TracePod],
    mode: str,
    order: str,
    seed: int,
    clock: Clock,
    base: float,
    store: Store,
    reread_s: float,
    t_wall: float,
    keep: list[Pod] | None = None,
) -> dict[str, Any]:
    alloc = Allocator(store, clock=clock)
    alloc.start([n.to_node() for n in nodes])
    _set_quotas(alloc)
    by_id: dict[str, Pod] = {}
    history = eta_policy.RunLengths()
    learning = alloc.wait_learning  # the portal's own calibration, fed by its admissions
    ends: list[tuple[float, str]] = []  # (virtual end, wid) of running pods, a heap
    waiting: set[str] = set()
    preemptions = 0
    admitted_times: list[float] = []
    problems: list[str] = []
    eta_cpu: list[float] = []  # CPU seconds of each whole-queue estimate

    def now() -> float:
        return clock.now.timestamp() - base

    def observe(decision: Decision) -> None:
        nonlocal preemptions
        for rec in decision.changes.workloads:
            pod = by_id.get(rec.id)
            if pod is None:
                continue
            if rec.started_at is not None and pod.start is None:
                # Admitted (perhaps preempted again in the same decision: only the last
                # state of a decision shows, its start stays).
                pod.start = rec.started_at.timestamp() - base
                waiting.discard(rec.id)
                admitted_times.append(pod.start)
                heapq.heappush(ends, (pod.start + pod.duration, rec.id))
            if rec.state is WorkloadState.PREEMPTING and not pod.preempted:
                pod.preempted = True
                pod.preempted_at = now()
                preemptions += 1
            if rec.state.terminal and pod.end is None and pod.start is not None:
                pod.end = now()
                pod.preempted = pod.preempted or rec.reason == "preempted"
                if not pod.preempted:  # a cut-short run says nothing of how long runs take
                    history.add(
                        (pod.tenant, rec.kind), pod.end - pod.start, rec.expected_duration_s
                    )

    alloc.subscribe(observe)
    arrivals = sorted(pods, key=lambda p: (p.creation_time, p.name))
    refused = 0
    last_reread = -math.inf
    allocation: list[tuple[float, float]] = []  # (virtual time, GPUs held)
    span = max(1, (arrivals[-1].creation_time - arrivals[0].creation_time) if arrivals else 1)
    sample_every = span / 200
    next_sample = 0.0

    def held_gpus() -> float:
        return sum((a.milli / 1000 if a.milli else 1.0) * len(a.gpus) for a in alloc.allocations())

    def advance(t: float) -> None:
        clock.now = clock.now + timedelta(seconds=max(0.0, t - now()))

    def read_etas(first: str | None) -> None:
        t = now()
        c0 = time.process_time()
        raw = alloc.read(lambda st: estimates.queue_intervals(st, clock(), history))
        eta_cpu.append(time.process_time() - c0)
        # Calibrated and built into the queue as Allocator.queue does, on these same raw
        # intervals: recomputing them there would double the replay's cost, and the
        # allocator's throttle for slow recomputes (SLOW_INTERVALS_S, wall time) would make
        # the figures depend on the load.
        learning.seen(raw, clock().timestamp())
        intervals = learning.apply(raw)
        entries = alloc.read(lambda st: estimates.queue_entries(st, clock(), intervals))
        if first is not None:
            entries = [e for e in entries if e.workload_id == first]
        rate = _service_time(admitted_times, t)
        for e in entries:
            raw_iv = raw.get(e.workload_id)
            got = intervals.get(e.workload_id)
            by_id[e.workload_id].samples.append(
                Sample(
                    t,
                    e.position,
                    e.eta_s,
                    got.point if got else None,
                    got.low if got else None,
                    got.high if got else None,
                    e.position * rate if rate is not None else None,
                    first is not None,
                    raw_iv.point if raw_iv else None,
                    raw_iv.low if raw_iv else None,
                    raw_iv.high if raw_iv else None,
                )
            )

    i = 0
    while i < len(arrivals) or ends:
        t_arrive = float(arrivals[i].creation_time) if i < len(arrivals) else math.inf
        if ends and ends[0][0] <= t_arrive:
            t_end, wid = heapq.heappop(ends)
            advance(t_end)
            if by_id[wid].end is None:  # not ended by preemption meanwhile
                alloc.release(wid)
        else:
            p = arrivals[i]
            i += 1
            advance(t_arrive)
            dur = float(max(1, (p.deletion_time or 0) - p.creation_time))
            tenant = tenant_of(p.name, seed)
            req = WorkloadRequest(
                tenant,
                "replay",
                p.name,
                p.to_request(),
                WorkloadKind.JOB,
                priority=0 if order == "fifo" else PRIORITY.get(p.qos, 0),
            )
            try:
                declared = {"declared": dur, "limit": time_limit(dur)}.get(mode)
                st = alloc.request(req, expected_duration_s=declared)
            except (Forbidden, InvalidRequest):
                refused += 1
                continue
            pod = Pod(st.id, p, tenant, now(), dur)
            by_id[st.id] = pod
            if st.started_at is not None and pod.start is None:
                pod.start = now()
                admitted_times.append(pod.start)
                heapq.heappush(ends, (pod.start + dur, st.id))
            elif st.state is WorkloadState.QUEUED:
                waiting.add(st.id)
                read_etas(st.id)
        if not ends and i >= len(arrivals) and waiting:
            # Nothing left to release but preempted work in its grace period: let time pass.
            for _ in range(100):
                advance(now() + 600)
                alloc.tick()
                if ends or not waiting:
                    break
            if not ends:
                break  # nothing runs and nothing admits what waits: stuck
        if waiting and now() - last_reread >= reread_s:
            last_reread = now()
            read_etas(None)
        if now() >= next_sample:
            allocation.append((now(), held_gpus()))
            next_sample = now() + sample_every
            problems.extend(check_invariants(alloc))
    problems.extend(check_invariants(alloc))
    stuck = sorted(waiting)
    if keep is not None:
        keep.extend(by_id.values())
    return _report(
        mode,
        order,
        list(by_id.values()),
        preemptions,
        refused,
        stuck,
        allocation,
        problems,
        sum(n.gpus for n in nodes),
        time.perf_counter() - t_wall,
        eta_cpu,
    )


def _service_time(admitted: list[float], t: float) -> float | None:
    """Mean seconds between admissions so far (the baseline's service rate, inverted)."""
    if len(admitted) < 2 or admitted[-1] <= admitted[0]:
        return None
    return (t - admitted[0]) / len(admitted)


def _pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def eta_quality(pods: Sequence[Pod], first_only: bool) -> dict[str, Any]:
    """Error of each estimator on the samples whose realized wait exceeds a minute."""
    rel: dict[str, list[float]] = {"portal": [], "raw": [], "calibrated": [], "baseline": []}
    missing: dict[str, int] = dict.fromkeys(rel, 0)
    inside = inside_raw = 0
    n = 0
    for pod in pods:
        if pod.start is None:
            continue
        for s in pod.samples:
            if first_only and not s.first:
                continue
            waited = pod.start - s.at
            if waited <= LONG_WAIT_S:
                continue
            n += 1
            for name, est in (
                ("portal", s.portal),
                ("raw", s.raw),
                ("calibrated", s.point),
                ("baseline", s.baseline),
            ):
                if est is None:
                    missing[name] += 1
                else:
                    rel[name].append(abs(est - waited) / waited)
            if s.low is not None and s.high is not None and s.low <= waited <= s.high:
                inside += 1
            if s.raw_low is not None and s.raw_high is not None:
                inside_raw += s.raw_low <= waited <= s.raw_high
    return {
        "samples": n,
        "median_rel_error": {k: statistics.median(v) if v else None for k, v in rel.items()},
        "no_estimate": missing,
        "interval_coverage": inside / n if n else None,
        "raw_interval_coverage": inside_raw / n if n else None,
    }


def _report(
    mode: str,
    order: str,
    pods: list[Pod],
    preemptions: int,
    refused: int,
    stuck: list[str],
    allocation: list[tuple[float, float]],
    problems: list[str],
    gpus: int,
    wall_s: float,
    eta_cpu: Sequence[float] = (),
) -> dict[str, Any]:
    started = [p for p in pods if p.start is not None]
    waits = [p.start - p.submit for p in started if p.start is not None]
    per_tenant: dict[str, list[float]] = {}
    for p in started:
        if p.start is not None:
            per_tenant.setdefault(p.tenant, []).append(p.start - p.submit)
    return {
        "mode": mode,
        "order": order,
        "gpus": gpus,
        "pods": len(pods),
        "refused": refused,
        "admitted": len(started),
        "stuck": len(stuck),
        "preemptions": preemptions,
        "wait_mean_s": statistics.fmean(waits) if waits else 0.0,
        "wait_p95_s": _pct(waits, 0.95),
        "waited_over_60s": sum(1 for w in waits if w > LONG_WAIT_S),
        "wait_by_tenant": {
            t: {"mean_s": statistics.fmean(ws), "p95_s": _pct(ws, 0.95), "pods": len(ws)}
            for t, ws in sorted(per_tenant.items())
        },
        "allocation": allocation,
        "eta_at_submission": eta_quality(pods, first_only=True),
        "eta_all_reads": eta_quality(pods, first_only=False),
        "min_wait_s": min(waits) if waits else 0.0,
        "problems": problems[:20],
        "wall_s": wall_s,
        "eta_cpu_ms": {
            "reads": len(eta_cpu),
            "mean": 1e3 * statistics.fmean(eta_cpu) if eta_cpu else None,
            "p99": 1e3 * _pct(eta_cpu, 0.99) if eta_cpu else None,
        },
    }


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def _p(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f} %"


def table(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| mode | order | pods | admitted | stuck | preemptions | wait mean (s) | wait p95 (s) "
        "| waits > 60 s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['mode']} | {r['order']} | {r['pods']} | {r['admitted']} | {r['stuck']} "
            f"| {r['preemptions']} | {_s(r['wait_mean_s'])} | {_s(r['wait_p95_s'])} "
            f"| {r['waited_over_60s']} |"
        )
    lines += [
        "",
        "ETA quality for waits over 60 s (median |estimate − realized| / realized; coverage: "
        "realized wait inside the p20–p80 interval, uncalibrated and calibrated; "
        "goal ≤ 25 % and 55–65 %):",
        "",
        "| mode | order | reads | samples | portal eta_s (calibrated point) "
        "| replayed point, uncalibrated | calibrated point | baseline "
        "| coverage, uncalibrated (replay p20–p80) | coverage, portal (calibrated) "
        "| no estimate (portal / calibrated / baseline) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for label, key in (("at submission", "eta_at_submission"), ("all reads", "eta_all_reads")):
            q = r[key]
            m = q["median_rel_error"]
            miss = q["no_estimate"]
            lines.append(
                f"| {r['mode']} | {r['order']} | {label} | {q['samples']} | {_p(m['portal'])} "
                f"| {_p(m['raw'])} "
                f"| {_p(m['calibrated'])} | {_p(m['baseline'])} "
                f"| {_p(q['raw_interval_coverage'])} | {_p(q['interval_coverage'])} "
                f"| {miss['portal']} / {miss['calibrated']} / {miss['baseline']} |"
            )
    lines += [
        "",
        "CPU of one whole-queue estimate (the replay's reads; ms, process CPU):",
        "",
        "| mode | order | estimates | mean | p99 |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        c = r["eta_cpu_ms"]
        lines.append(
            f"| {r['mode']} | {r['order']} | {c['reads']} | {_f(c['mean'])} | {_f(c['p99'])} |"
        )
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__)
    ap.add_argument("--nodes", type=Path, default=DEFAULT_NODES)
    ap.add_argument("--pods", type=Path, default=DEFAULT_PODS)
    ap.add_argument("--gpus", type=int, default=48, help="GPUs of the sampled cluster")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the GPU pods replayed")
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N pods")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reread-s", type=float, default=300.0)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--orders", default=",".join(ORDERS))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--jobs", type=int, default=1, help="runs replayed in parallel processes")
    args = ap.parse_args(argv)
    if not 0 < args.scale <= 1:
        ap.error(f"--scale {args.scale}: a fraction in (0, 1]")
    if args.gpus < 1:
        ap.error(f"--gpus {args.gpus}: at least 1")
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: at least 1")
    nodes, pods = select(args.nodes, args.pods, args.gpus, args.scale, args.limit, args.seed)
    runs = [(m, o) for m in args.modes.split(",") for o in args.orders.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        if args.jobs == 1 or len(runs) == 1:
            results = [
                replay(nodes, pods, m, o, args.seed, Path(tmp), args.reread_s) for m, o in runs
            ]
        else:
            # Each run is independent (its own allocator, database file and virtual clock)
            # and single-threaded: processes, one per run, up to --jobs at a time.
            with ProcessPoolExecutor(min(args.jobs, len(runs))) as pool:
                futures = [
                    pool.submit(replay, nodes, pods, m, o, args.seed, Path(tmp), args.reread_s)
                    for m, o in runs
                ]
                results = [f.result() for f in futures]
    print(table(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
