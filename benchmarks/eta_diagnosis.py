"""Where the replay's ETAs err: each long wait's error, split by what happened while it waited.

``python -m benchmarks.eta_diagnosis [replay options] --modes declared --orders gpuportal``
runs ``benchmarks.replay`` and sorts every ETA read of a wait over a minute by what came
between the read and the admission that the forward replay of the queue (``policies.eta_sim``)
does not foresee:

- *overtaken*: a workload that arrived after the read was admitted before it (a later arrival
  that the order put ahead, or a smaller one that fit where it did not);
- *preemption*: some workload was preempted in between (its devices change hands out of turn);
- *neither*: nothing of the above; what is left is the replay's model itself — counts instead
  of devices (placement, fragmentation), its reservation, and run lengths when limits are not
  exact.

For each group: its share of the reads, the median relative error of the raw replayed point
and of the portal's ``eta_s``, and the median realized / estimated ratio (above 1: the
estimate was too short). The median error over the reads *outside* a group says how far the
estimate would be from the goal if that source were fixed and nothing else.
"""

from __future__ import annotations

import argparse
import bisect
import math
import statistics
import sys
import tempfile
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import replay
from benchmarks.openb.trace import DEFAULT_NODES, DEFAULT_PODS

GROUPS = (
    "overtaken, higher priority",
    "overtaken, same or lower priority",
    "preemption",
    "neither",
)


def classify(pods: Sequence[replay.Pod], first_only: bool, order: str) -> list[dict[str, Any]]:
    """One row per ETA read of a wait over a minute: its errors and what it waited through."""
    # (arrival, admission, priority) of every admitted pod, by arrival
    started = sorted((p.submit, p.start, _priority(p, order)) for p in pods if p.start is not None)
    arrivals = [a for a, _, _ in started]
    preempted = sorted(p.preempted_at for p in pods if p.preempted_at is not None)
    rows = []
    for pod in pods:
        if pod.start is None:
            continue
        mine = _priority(pod, order)
        for s in pod.samples:
            if first_only and not s.first:
                continue
            waited = pod.start - s.at
            if waited <= replay.LONG_WAIT_S or not s.raw:
                continue
            later = started[bisect.bisect_right(arrivals, s.at) :]
            ahead = [pr for sub, st, pr in later if sub < pod.start and st < pod.start]
            i = bisect.bisect_left(preempted, s.at)
            preempt = i < len(preempted) and preempted[i] < pod.start
            if any(pr > mine for pr in ahead):
                group = GROUPS[0]
            elif ahead:
                group = GROUPS[1]
            else:
                group = "preemption" if preempt else "neither"
            rows.append(
                {
                    "group": group,
                    "raw_error": abs(s.raw - waited) / waited,
                    "portal_error": None if s.portal is None else abs(s.portal - waited) / waited,
                    "ratio": waited / s.raw,
                }
            )
    return rows


def _priority(p: replay.Pod, order: str) -> int:
    return 0 if order == "fifo" else replay.PRIORITY.get(p.trace.qos, 0)


def _median(xs: Sequence[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return statistics.median(got) if got else None


def breakdown(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for g in (*GROUPS, "all"):
        inside = [r for r in rows if g in ("all", r["group"])]
        outside = [r for r in rows if g != "all" and r["group"] != g]
        out.append(
            {
                "group": g,
                "reads": len(inside),
                "share": len(inside) / len(rows) if rows else None,
                "raw_error": _median([r["raw_error"] for r in inside]),
                "portal_error": _median([r["portal_error"] for r in inside]),
                "ratio": _median([r["ratio"] for r in inside]),
                "raw_error_without": _median([r["raw_error"] for r in outside]),
            }
        )
    return out


def _p(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f} %"


def _r(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def table(results: Sequence[tuple[str, str, str, list[dict[str, Any]]]]) -> str:
    lines = [
        "| mode | order | reads | group | reads in group | share | error, replayed point "
        "| error, portal eta_s | realized / estimated (median) | error of the other reads |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, order, label, rows in results:
        for b in breakdown(rows):
            lines.append(
                f"| {mode} | {order} | {label} | {b['group']} | {b['reads']} | {_p(b['share'])} "
                f"| {_p(b['raw_error'])} | {_p(b['portal_error'])} "
                f"| {_r(b['ratio'])} "
                f"| {_p(b['raw_error_without'])} |"
            )
    return "\n".join(lines)


class _Ratios:
    """The newest ``window`` ratios realized / first estimated wait, kept sorted."""

    def __init__(self, window: int = 1000) -> None:
        self.sorted: list[float] = []
        self.order: deque[float] = deque()
        self.window = window

    def add(self, r: float) -> None:
        bisect.insort(self.sorted, r)
        self.order.append(r)
        if len(self.order) > self.window:
            old = self.order.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]

    def q(self, q: float) -> float:
        n = len(self.sorted)
        return self.sorted[min(n - 1, max(0, math.ceil(q * n) - 1))]


# Point corrections tried: how each read's point and interval come out of the ratios learned
# so far (only from workloads admitted before the read: never from the future). Key: which
# workloads' ratios apply (all, or the read's own tenant or shape once it has OWN_MIN).
SCHEMES = (
    "interval only (as shipped)",
    "point × median, all",
    "point × median, per tenant",
    "point × median, per shape",
)
OWN_MIN = 20


def corrections(pods: Sequence[replay.Pod]) -> dict[str, dict[str, tuple[float, float, int]]]:
    """Per scheme and read kind ("at submission", "all reads"): the median relative error of
    the corrected point, the interval's coverage, and the reads, for waits over a minute."""
    reads = sorted(
        ((s.at, p, s) for p in pods if p.start is not None for s in p.samples if s.raw),
        key=lambda r: r[0],
    )
    firsts: dict[str, tuple[float, float, replay.Pod]] = {}  # first raw point per workload
    for at, p, s in reads:
        firsts.setdefault(p.wid, (at, s.raw or 0.0, p))
    learned = sorted(
        (p.start or 0.0, (p.start or 0.0) - at, raw, p) for at, raw, p in firsts.values()
    )
    out: dict[str, dict[str, tuple[float, float, int]]] = {}
    for scheme in SCHEMES:
        pools: dict[object, _Ratios] = {}
        everyone = _Ratios()
        li = 0
        got: dict[str, list[tuple[float, bool]]] = {"at submission": [], "all reads": []}
        for at, p, s in reads:
            while li < len(learned) and learned[li][0] <= at:
                _, waited, raw, q = learned[li]
                li += 1
                everyone.add(waited / raw)
                pools.setdefault(_key(scheme, q), _Ratios()).add(waited / raw)
            waited = (p.start or 0.0) - at
            if waited <= replay.LONG_WAIT_S:
                continue
            raw = s.raw or 0.0
            own = pools.get(_key(scheme, p))
            src = own if own is not None and len(own.sorted) >= OWN_MIN else everyone
            if len(everyone.sorted) < 5:
                point = low = high = raw
            else:
                low, high = raw * src.q(0.2), raw * src.q(0.8)
                point = min(high, max(low, raw)) if scheme == SCHEMES[0] else raw * src.q(0.5)
            row = (abs(point - waited) / waited, low <= waited <= high)
            got["all reads"].append(row)
            if s.first:
                got["at submission"].append(row)
        out[scheme] = {
            k: (statistics.median(e for e, _ in v), sum(c for _, c in v) / len(v), len(v))
            for k, v in got.items()
            if v
        }
    return out


def _key(scheme: str, p: replay.Pod) -> object:
    if scheme.endswith("per tenant"):
        return p.tenant
    if scheme.endswith("per shape"):
        return (p.trace.num_gpu, p.trace.gpu_milli)
    return None


Run = tuple[
    list[tuple[str, str, str, list[dict[str, Any]]]],
    tuple[str, str, dict[str, dict[str, tuple[float, float, int]]]],
    dict[str, Any],
]


def _one(args: tuple[Any, ...]) -> Run:
    nodes, pods, mode, order, seed, reread_s = args
    kept: list[replay.Pod] = []
    with tempfile.TemporaryDirectory() as tmp:
        result = replay.replay(nodes, pods, mode, order, seed, Path(tmp), reread_s, keep=kept)
    groups = [
        (mode, order, "at submission", classify(kept, True, order)),
        (mode, order, "all reads", classify(kept, False, order)),
    ]
    return groups, (mode, order, corrections(kept)), result


def corrections_table(results: Sequence[tuple[str, str, dict[str, Any]]]) -> str:
    lines = [
        "| mode | order | correction | error at submission | error, all reads "
        "| coverage at submission | coverage, all reads |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, order, by_scheme in results:
        for scheme, got in by_scheme.items():
            sub, every = got.get("at submission"), got.get("all reads")
            lines.append(
                f"| {mode} | {order} | {scheme} | {_p(sub[0] if sub else None)} "
                f"| {_p(every[0] if every else None)} | {_p(sub[1] if sub else None)} "
                f"| {_p(every[1] if every else None)} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.eta_diagnosis", description=__doc__)
    ap.add_argument("--nodes", type=Path, default=DEFAULT_NODES)
    ap.add_argument("--pods", type=Path, default=DEFAULT_PODS)
    ap.add_argument("--gpus", type=int, default=48)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reread-s", type=float, default=300.0)
    ap.add_argument("--modes", default="declared")
    ap.add_argument("--orders", default=",".join(replay.ORDERS))
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    if not 0 < args.scale <= 1:
        ap.error(f"--scale {args.scale}: a fraction in (0, 1]")
    nodes, pods = replay.select(args.nodes, args.pods, args.gpus, args.scale, args.limit, args.seed)
    runs = [
        (nodes, pods, m, o, args.seed, args.reread_s)
        for m in args.modes.split(",")
        for o in args.orders.split(",")
    ]
    if args.jobs > 1 and len(runs) > 1:
        with ProcessPoolExecutor(min(args.jobs, len(runs))) as pool:
            got = list(pool.map(_one, runs))
    else:
        got = [_one(r) for r in runs]
    text = (
        # The replay's own table first: one run gives both (a run takes minutes).
        replay.table([r for _, _, r in got])
        + "\n\n"
        + table([row for groups, _, _ in got for row in groups])
        + "\n\nPoint corrections learned online from past admissions:\n\n"
        + corrections_table([c for _, c, _ in got])
    )
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
