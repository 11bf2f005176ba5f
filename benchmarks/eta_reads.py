"""How long reading calibrated ETAs takes with 10,000 pending workloads.

``python -m benchmarks.eta_reads [--pending 10000] [--holders 2000] [--reads 200]`` builds the
release curves of ``--holders`` running workloads (half with a declared end, half estimated
from a run-length history of 5,000 runs) and times, ``--reads`` times each: one read of the
whole queue's intervals (building the curves and walking all pending workloads, as a queue
view does) and single reads of one workload's interval deep in the queue. Pure policy code
(policies.eta): the allocator's own queue order and its lock are not in these figures.

The portal's intervals come from replaying the queue forward (policies.eta_sim), recomputed
once per admission or release and read from a cache in between: ``--recomputes`` times (CPU
per replay of the first ``MAX_QUEUE`` queued workloads over all holders, 24 samples) and the
cached read of one workload's interval. The replay runs both ways in the same process: by the
counts (``replay_recompute_*``) and placing by node as the allocator does
(``replay_by_node_*``: the holders packed on 8-GPU nodes, the portal's placement policy, at
``place_tries`` placements per sample for the cluster's size).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence

from policies import quota
from policies.eta import IntervalCurve, Release, RunLengths, WaitCalibration, release_of
from policies.eta_sim import MAX_QUEUE, Holder, Placing, Shape, Waiting, place_tries, simulate
from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.placement.framework import PlacementContext
from policies.placement.scorers import policy
from policies.placement.state import ClusterState, Placement
from policies.requests import DeviceRequest
from policies.topology import LinkClass, Topology

NOW = 1_000_000.0


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def run(
    pending: int, holders: int, reads: int, seed: int = 1, recomputes: int = 5
) -> dict[str, float]:
    rng = random.Random(seed)
    history = RunLengths()
    for _ in range(5000):
        history.add((f"team-{rng.randrange(10)}", "job"), rng.expovariate(1 / 3600))
    calibration = WaitCalibration()
    for _ in range(500):
        calibration.add(rng.uniform(60, 3600), rng.uniform(60, 7200))
    held = [
        (
            rng.choice((1, 2, 4, 8)),
            NOW - rng.uniform(0, 7200),
            NOW + rng.uniform(0, 7200) if i % 2 else None,
            (f"team-{rng.randrange(10)}", "job"),
        )
        for i in range(holders)
    ]
    needs = [rng.choice((1, 2, 4, 8)) for _ in range(pending)]

    def whole_queue() -> int:
        curve = IntervalCurve([release_of(a, s, e, g, history, NOW) for a, s, e, g in held])
        ahead = known = 0
        for i, need in enumerate(needs):
            got = curve.interval(ahead, 0, need, NOW, i, "H100")
            if got is not None:
                calibration.apply(got)
                known += 1
            ahead += need
        return known

    whole_ms = []
    for _ in range(reads):
        t = time.perf_counter()
        whole_queue()
        whole_ms.append((time.perf_counter() - t) * 1e3)
    releases: list[Release] = [release_of(a, s, e, g, history, NOW) for a, s, e, g in held]
    curve = IntervalCurve(releases)
    single_ms = []
    prefix = [0]
    for n in needs:
        prefix.append(prefix[-1] + n)
    for _ in range(reads * 50):
        k = rng.randrange(pending)
        t = time.perf_counter()
        got = curve.interval(prefix[k], 0, needs[k], NOW, k, "H100")
        if got is not None:
            calibration.apply(got)
        single_ms.append((time.perf_counter() - t) * 1e3)
    replay_cpu_ms, cached_ms, node_cpu_ms, capped, nodes = _replayed(
        rng, history, held, needs, recomputes, reads * 50
    )
    return {
        "replay_recompute_cpu_p50_ms": _pct(replay_cpu_ms, 0.5),
        "replay_recompute_cpu_max_ms": max(replay_cpu_ms),
        "replay_by_node_cpu_p50_ms": _pct(node_cpu_ms, 0.5),
        "replay_by_node_cpu_max_ms": max(node_cpu_ms),
        "replay_by_node_at_least": capped,
        "replay_by_node_nodes": nodes,
        "replay_by_node_tries_per_sample": place_tries(nodes),
        "replay_cached_read_p99_ms": _pct(cached_ms, 0.99),
        "pending": pending,
        "holders": holders,
        "whole_queue_p50_ms": _pct(whole_ms, 0.5),
        "whole_queue_p99_ms": _pct(whole_ms, 0.99),
        "single_p50_ms": _pct(single_ms, 0.5),
        "single_p99_ms": _pct(single_ms, 0.99),
    }


def _replayed(
    rng: random.Random,
    history: RunLengths,
    held: list[tuple[int, float, float | None, tuple[str, str]]],
    needs: list[int],
    recomputes: int,
    reads: int,
) -> tuple[list[float], list[float], list[float], int, int]:
    """CPU of the forward replay over the whole state (one flavor, ten tenants whose limits
    add up to the capacity the holders fill), of a read from its result, of the same replay
    placing by node, how many workloads that one answered only "at least", and its nodes."""
    fl = "H100-80GB"
    capacity = sum(a for a, _, _, _ in held)
    cluster, placed = _packed(held, fl)
    tenants = [f"team-{i}" for i in range(10)]
    book = quota.QuotaBook(
        tenants={
            t: quota.TenantQuota(t, {fl: quota.FlavorQuota(0, capacity)}, cohort="c")
            for t in tenants
        },
        capacity={fl: capacity},
    )
    usage: dict[tuple[str, str], int] = {}
    hs = []
    for (a, start, end, g), p in zip(held, placed, strict=True):
        usage[(g[0], fl)] = usage.get((g[0], fl), 0) + a
        limit = None if end is None else end - start
        hs.append(Holder(g[0], ((fl, a),), start, g, limit, placed=(p,)))
    shapes = {n: Shape(_gpus(n), 1, PlacementContext(), ((MODEL, fl),)) for n in (1, 2, 4, 8)}
    queue = [
        Waiting(
            f"w{i}", rng.choice(tenants), (fl,), n, (rng.choice(tenants), "job"), None, shapes[n]
        )
        for i, n in enumerate(needs)
    ]
    cpu_ms = []
    got = {}
    for k in range(recomputes):
        t = time.process_time()
        got = simulate(NOW, book, usage, hs, queue, history, seed=k)
        cpu_ms.append((time.process_time() - t) * 1e3)
    node_ms = []
    placing = Placing(cluster, policy("gpuportal"), place_tries(len(cluster)))
    capped = 0
    for k in range(recomputes):
        t = time.process_time()
        by_node = simulate(NOW, book, usage, hs, queue, history, seed=k, placing=placing)
        node_ms.append((time.process_time() - t) * 1e3)
        capped = sum(e.at_least is not None for e in by_node.values())
    ids = list(got) or ["w0"]
    read_ms = []
    for _ in range(reads):
        wid = ids[rng.randrange(len(ids))]
        t = time.perf_counter()
        got.get(wid)
        read_ms.append((time.perf_counter() - t) * 1e3)
    assert len(got) == min(MAX_QUEUE, len(queue))
    return cpu_ms, read_ms, node_ms, capped, len(cluster)


MODEL = "H100-80GB"


def _gpus(n: int) -> DeviceRequest:
    return DeviceRequest(FlavorKind.GPU, count=n, models=frozenset({MODEL}))


def _packed(
    held: list[tuple[int, float, float | None, tuple[str, str]]], fl: str
) -> tuple[ClusterState, list[Placement]]:
    """8-GPU nodes with the holders packed on them (largest first, so the powers of two fill
    every node): the placement of each holder, in ``held``'s order."""
    order = sorted(range(len(held)), key=lambda i: -held[i][0])
    placed: dict[int, Placement] = {}
    node, used = 0, 8
    for i in order:
        a = held[i][0]
        if used + a > 8:
            node, used = node + 1, 0
        placed[i] = Placement(f"n{node}", tuple(range(used, used + a)), milli=1000)
        used += a
    cluster = ClusterState(
        Node(
            f"n{k}",
            tuple(GPU(g, MODEL, 81920, uuid=f"GPU-n{k}-{g}") for g in range(8)),
            cpu_milli=128_000,
            memory_mib=1_048_576,
            topology=Topology.uniform(8, LinkClass.NVSWITCH),
        )
        for k in range(1, node + 1)
    )
    out = [placed[i] for i in range(len(held))]
    for p in out:
        cluster.apply(p)
    return cluster, out


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.eta_reads", description=__doc__)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--holders", type=int, default=2_000)
    ap.add_argument("--reads", type=int, default=200)
    ap.add_argument("--recomputes", type=int, default=5)
    args = ap.parse_args(argv)
    if min(args.pending, args.holders, args.reads) < 1:
        ap.error("--pending, --holders and --reads: at least 1")
    r = run(args.pending, args.holders, args.reads, recomputes=args.recomputes)
    for k, v in r.items():
        print(f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}")
    return r


if __name__ == "__main__":
    main(sys.argv[1:])
