"""openb-format variants of the default trace, to check a scorer is not tuned to one mix.

``python -m benchmarks.openb.variants --out DIR [--seed 7]`` writes ``DIR/<variant>.csv`` pod
lists with as many pods as the default, resampled (with replacement, seeded) with weights:

- ``sharing``: fractional pods weigh 3×;
- ``multigpu``: pods with 2+ GPUs weigh 8×;
- ``typed``: like the default, but 40 % of GPU pods are constrained to one or two models;
- ``cpuheavy``: CPU-only pods weigh 3×.

Nodes stay the default node list. Outputs are large; keep them out of the repository.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from benchmarks.openb.trace import DEFAULT_NODES, DEFAULT_PODS, TracePod, read_nodes, read_pods

POD_FIELDS = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"]


def _weighted(weight: Callable[[TracePod], float]) -> Callable[..., list[TracePod]]:
    def make(pods: Sequence[TracePod], models: Sequence[str], rng: random.Random) -> list[TracePod]:
        return rng.choices(list(pods), weights=[weight(p) for p in pods], k=len(pods))

    return make


def _typed(pods: Sequence[TracePod], models: Sequence[str], rng: random.Random) -> list[TracePod]:
    out = rng.choices(list(pods), k=len(pods))
    for i, p in enumerate(out):
        if p.num_gpu and rng.random() < 0.4:
            allowed = sorted(rng.sample(list(models), k=rng.choice((1, 2))))
            out[i] = replace(p, gpu_spec="|".join(allowed))
    return out


VARIANTS: dict[str, Callable[..., list[TracePod]]] = {
    "sharing": _weighted(lambda p: 3.0 if p.num_gpu == 1 and 0 < p.gpu_milli < 1000 else 1.0),
    "multigpu": _weighted(lambda p: 8.0 if p.num_gpu >= 2 else 1.0),
    "typed": _typed,
    "cpuheavy": _weighted(lambda p: 3.0 if p.num_gpu == 0 else 1.0),
}


def write_pods(path: Path, pods: Sequence[TracePod]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(POD_FIELDS)
        for i, p in enumerate(pods):
            w.writerow(
                [
                    f"{path.stem}-pod-{i:05d}",
                    p.cpu_milli,
                    p.memory_mib,
                    p.num_gpu,
                    p.gpu_milli,
                    p.gpu_spec,
                ]
            )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.openb.variants", description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pods", type=Path, default=DEFAULT_PODS)
    ap.add_argument("--nodes", type=Path, default=DEFAULT_NODES)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    pods = read_pods(args.pods)
    # Only models that carry many GPUs, so constrained pods can still fit somewhere.
    counts: dict[str, int] = {}
    for n in read_nodes(args.nodes):
        counts[n.model] = counts.get(n.model, 0) + n.gpus
    models = sorted(m for m, c in counts.items() if c >= 200)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, make in VARIANTS.items():
        out = make(pods, models, random.Random(f"{name}-{args.seed}"))
        write_pods(args.out / f"{name}.csv", out)
        print(args.out / f"{name}.csv", len(out), "pods")
    return 0


if __name__ == "__main__":
    sys.exit(main())
