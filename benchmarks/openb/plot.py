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
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for path in inputs:
        for name, rep in json.loads(path.read_text()).items():
            curve = {int(b): v for b, v in rep["allocation_by_arrived"].items()}
            xs = sorted(b for b in curve if b >= 50)
            label = f"{name} ({rep['unalloc100_mean']:.2f} % unalloc. @100 %)"
            ax.plot(xs, [curve[b] for b in xs], label=label)
    ax.plot([50, 100], [50, 100], color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("arrived GPU demand (% of cluster GPUs)")
    ax.set_ylabel("GPU allocation (%)")
    ax.set_title("openb trace, 1,213 nodes, mean of seeds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
