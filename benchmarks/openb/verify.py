"""Check a placements CSV independently of the placement code.

``python -m benchmarks.openb.verify PLACEMENTS.csv --nodes NODES.csv``: replays every placed
arrival per (policy, seed) on plain counters, fails if any node's CPU or memory or any GPU's
1000 milli is exceeded (or a GPU index does not exist), and recomputes unallocated GPU % at
arrived 100 % and 130 %.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.openb.trace import DEFAULT_NODES, read_nodes

MILLI = 1000


def verify(
    placements: Path, nodes_csv: Path
) -> tuple[list[str], dict[tuple[str, int], dict[int, float]]]:
    """(violations, {(policy, seed): {arrived bin: unallocated %}} at 100 and 130)."""
    nodes = {n.name: n for n in read_nodes(nodes_csv)}
    capacity = sum(n.gpus for n in nodes.values()) * MILLI
    errors: list[str] = []
    runs: dict[tuple[str, int], list[dict[str, str]]] = {}
    with placements.open(newline="") as f:
        for row in csv.DictReader(f):
            runs.setdefault((row["policy"], int(row["seed"])), []).append(row)
    figures: dict[tuple[str, int], dict[int, float]] = {}
    for key, rows in runs.items():
        cpu = dict.fromkeys(nodes, 0)
        mem = dict.fromkeys(nodes, 0)
        gpu = {n: [0] * nodes[n].gpus for n in nodes}
        arrived = allocated = 0
        sums: dict[int, list[float]] = {}
        for row in sorted(rows, key=lambda r: int(r["seq"])):
            num, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            arrived += num * milli
            name = row["node"]
            if name:
                where = f"{key[0]} seed {key[1]} seq {row['seq']} on {name}"
                if name not in nodes:
                    errors.append(f"{where}: unknown node")
                    continue
                idx = [int(g) for g in row["gpus"].split(";") if g]
                if num and len(idx) != num:
                    errors.append(f"{where}: {len(idx)} GPUs listed, pod asks {num}")
                cpu[name] += int(row["cpu_milli"])
                mem[name] += int(row["memory_mib"])
                if cpu[name] > nodes[name].cpu_milli:
                    errors.append(f"{where}: CPU {cpu[name]}m > {nodes[name].cpu_milli}m")
                if mem[name] > nodes[name].memory_mib:
                    errors.append(f"{where}: memory {mem[name]}Mi > {nodes[name].memory_mib}Mi")
                for g in idx:
                    if not 0 <= g < nodes[name].gpus:
                        errors.append(f"{where}: GPU {g} does not exist")
                        continue
                    gpu[name][g] += milli
                    if gpu[name][g] > MILLI:
                        errors.append(f"{where}: GPU {g} at {gpu[name][g]} milli > {MILLI}")
                allocated += num * milli
            b = math.floor(arrived * 100 / capacity + 0.5)
            acc = sums.setdefault(b, [0.0, 0.0])
            acc[0] += 1
            acc[1] += 100.0 * allocated / capacity
        figures[key] = {b: 100.0 - sums[b][1] / sums[b][0] for b in (100, 130) if b in sums}
    return errors, figures


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.openb.verify", description=__doc__)
    ap.add_argument("placements", type=Path)
    ap.add_argument("--nodes", type=Path, default=DEFAULT_NODES)
    args = ap.parse_args(argv)
    errors, figures = verify(args.placements, args.nodes)
    for (pol, seed), fig in sorted(figures.items()):
        shown = "  ".join(f"unalloc@{b}%={v:.2f}" for b, v in sorted(fig.items()))
        print(f"{pol:<11} seed {seed}: {shown}")
    for e in errors[:50]:
        print("VIOLATION", e)
    if errors:
        print(f"{len(errors)} violations")
        return 1
    print("ok: no node or GPU over capacity")
    return 0


if __name__ == "__main__":
    sys.exit(main())
