"""CLI: ``python -m benchmarks.openb --policy all [--seeds 42-51] [--json F] [--placements F]``."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.openb.protocol import RunResult, run, summarize
from benchmarks.openb.trace import DEFAULT_NODES, DEFAULT_PODS, read_nodes, read_pods
from policies.placement.scorers import POLICIES

PUBLISHED_ORDER = ["random", "dotprod", "gpupacking", "bestfit", "fgd", "gpuportal", "binpack"]
PLACEMENT_FIELDS = [
    "policy",
    "seed",
    "seq",
    "pod",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "node",
    "gpus",
]


def parse_seeds(text: str) -> list[int]:
    """``42-51`` or ``42,43,47`` (ranges and lists may mix)."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        seeds.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return seeds


def _one(args: tuple[str, Path, Path, int]) -> RunResult:
    name, nodes, pods, seed = args
    return run(name, read_nodes(nodes), read_pods(pods), seed)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.openb", description=__doc__)
    ap.add_argument("--nodes", type=Path, default=DEFAULT_NODES)
    ap.add_argument("--pods", type=Path, default=DEFAULT_PODS)
    ap.add_argument("--policy", default="all", help="a policy name or 'all'")
    ap.add_argument("--seeds", default="42-51", type=parse_seeds)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--json", type=Path, help="write summary and allocation curves here")
    ap.add_argument("--placements", type=Path, help="write every arrival here (CSV)")
    args = ap.parse_args(argv)
    names = [p for p in PUBLISHED_ORDER if p in POLICIES] if args.policy == "all" else [args.policy]
    for name in names:
        if name not in POLICIES:
            ap.error(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    work = [(n, args.nodes, args.pods, s) for n in names for s in args.seeds]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as ex:
            results = list(ex.map(_one, work))
    else:
        results = [_one(w) for w in work]
    by_policy: dict[str, list[RunResult]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    print(
        f"{'policy':<11} {'unalloc@100%':>14} {'unalloc@130%':>14} {'frag@90%':>12} "
        f"{'median ms':>9} {'p99 ms':>8}"
    )
    report = {}
    for name, rs in by_policy.items():
        s = summarize(rs)
        print(
            f"{name:<11} {s['unalloc100_mean']:6.2f} ± {s['unalloc100_std']:4.2f}  "
            f"{s['unalloc130_mean']:6.2f} ± {s['unalloc130_std']:4.2f}  "
            f"{s['frag90_mean']:5.1f} ± {s['frag90_std']:4.1f} "
            f"{s['time_median_ms']:9.3f} {s['time_p99_ms']:8.2f}"
        )
        bins = sorted({b for r in rs for b in r.alloc_by_bin})
        curve = {
            b: sum(r.alloc_by_bin[b] for r in rs if b in r.alloc_by_bin)
            / sum(1 for r in rs if b in r.alloc_by_bin)
            for b in bins
        }
        report[name] = {
            "seeds": [r.seed for r in rs],
            **s,
            "per_seed": {
                r.seed: {"unalloc100": r.unallocated_at(100), "unalloc130": r.unallocated_at(130)}
                for r in rs
            },
            "allocation_by_arrived": {str(b): round(v, 4) for b, v in curve.items()},
        }
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.placements:
        write_placements(args.placements, results)
    return 0


def write_placements(path: Path, results: Sequence[RunResult]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PLACEMENT_FIELDS)
        for r in results:
            for a in r.arrivals:
                p, pod = a.placement, a.pod
                w.writerow(
                    [
                        r.policy,
                        r.seed,
                        a.seq,
                        pod.name,
                        pod.cpu_milli,
                        pod.memory_mib,
                        pod.num_gpu,
                        pod.gpu_milli,
                        pod.gpu_spec,
                        "" if p is None else p.node,
                        "" if p is None else ";".join(str(g) for g in p.gpus),
                    ]
                )


if __name__ == "__main__":
    sys.exit(main())
