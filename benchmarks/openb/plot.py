"""Allocation % vs arrived % per policy from the harness's JSON outputs (like the paper's figure).

``python -m benchmarks.openb.plot OUT.png A.json [B.json ...]``
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out, inputs = Path(args[0]), [Path(a) for a in args[1:]]
    # Left: the whole curve; right: the saturated end, where the policies differ.
    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(12, 4.8), width_ratios=(1.2, 1))
    styles = ["-", "--", "-.", ":"]
    seeds: set[int] = set()
    n = 0
    for path in inputs:
        for name, rep in json.loads(path.read_text()).items():
            seeds.update(rep.get("seeds", []))
            curve = {int(b): v for b, v in rep["allocation_by_arrived"].items()}
            xs = sorted(b for b in curve if b >= 50)
            ys = [curve[b] for b in xs]
            label = f"{name} ({rep['unalloc100_mean']:.2f} % unalloc. @100 %)"
            style = {"linestyle": styles[n % len(styles)], "linewidth": 1.6}
            ax.plot(xs, ys, label=label, **style)
            zoom.plot(xs, ys, label=name, **style)
            n += 1
    for a in (ax, zoom):
        a.plot([50, 100], [50, 100], color="grey", linestyle=":", linewidth=0.8)
        a.set_xlabel("arrived GPU demand (% of cluster GPUs)")
        a.grid(alpha=0.3)
    ax.set_ylabel("GPU allocation (%)")
    seed_text = f"mean of {len(seeds)} seeds" if seeds else "mean of seeds"
    ax.set_title(f"openb trace, 1,213 nodes, {seed_text}")
    ax.legend(fontsize=8)
    zoom.set_xlim(85, 130)
    zoom.set_ylim(84, 97)
    zoom.set_title("zoom: 85-130 % arrived")
    zoom.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
