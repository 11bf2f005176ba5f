"""Demand forecasts on the openb trace: Holt-Winters against seasonal-naive baselines.

``python -m benchmarks.forecast [--seed 1] [--step-hours 24] [--horizon 168] [--json OUT]``

The trace's GPU pods (``benchmarks.openb.trace``) go to ``benchmarks.replay``'s 10 tenants by
the same seeded hash; a pod's flavor is ``share`` (less than one GPU) or ``whole`` (the trace
names no GPU model for them). Each pod arrives at its creation time and holds
``num_gpu × gpu_milli / 1000`` GPUs until its deletion. Hourly series, binned as the portal
bins its history (``policies.forecast.hourly_counts``, ``hourly_gpu_hours``), per tenant ×
flavor and per flavor (all tenants), of arrivals and GPU-hours, from the first hour of the
trace's busy period (the day from which at least ``--busy-per-day`` GPU pods arrive daily: the
trace's first months hold a handful of pods).

Rolling-origin evaluation: from two weeks into the busy period, every ``--step-hours``, each
method forecasts the next ``--horizon`` hours from all history before the origin; errors are
taken per horizon band. MAE per series, and MASE: the MAE divided by the in-sample MAE of the
weekly seasonal-naive forecast one week ahead (below 1: better than that naive forecast was on
the history), averaged over series and origins (series whose history never varied have no
scale and are left out of MASE). Methods: ``holt-winters`` (``policies.forecast.holt_winters``,
the portal's), ``naive-weekly`` (each hour as one week before) and ``naive-daily`` (as one day
before).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.openb.trace import DEFAULT_PODS, TracePod, read_pods
from benchmarks.replay import tenant_of
from policies.flavors import MILLI_PER_GPU
from policies.forecast import (
    HOUR_S,
    HOURS_PER_DAY,
    HOURS_PER_WEEK,
    holt_winters,
    hourly_counts,
    hourly_gpu_hours,
    mae,
    naive_scale,
    seasonal_naive,
)

BANDS = ((1, 1), (2, 6), (7, 24), (25, 168))
"""Horizon bands in hours (inclusive): the next hour, the next few, the rest of the day, the
rest of the week."""

Forecaster = Callable[[Sequence[float], int], Sequence[float]]
METHODS: dict[str, Forecaster] = {
    "holt-winters": lambda h, n: holt_winters(h, n).values,
    "naive-weekly": lambda h, n: seasonal_naive(h, n, HOURS_PER_WEEK).values,
    "naive-daily": lambda h, n: seasonal_naive(h, n, HOURS_PER_DAY).values,
}


def flavor_of(pod: TracePod) -> str:
    return "share" if pod.gpu_milli < MILLI_PER_GPU else "whole"


def busy_start(pods: Sequence[TracePod], per_day: int) -> int:
    """The start (trace seconds) of the first day with at least ``per_day`` arrivals."""
    days: dict[int, int] = defaultdict(int)
    for p in pods:
        days[p.creation_time // 86_400] += 1
    first = min(d for d, n in days.items() if n >= per_day)
    return first * 86_400


def build_series(
    pods: Sequence[TracePod], seed: int, start: int, hours: int
) -> dict[tuple[str, str, str], list[float]]:
    """(signal, tenant or ``*``, flavor) → hourly series from ``start``."""
    times: dict[tuple[str, str], list[int]] = defaultdict(list)
    held: dict[tuple[str, str], list[tuple[int, int, float]]] = defaultdict(list)
    for p in pods:
        assert p.deletion_time is not None
        gpus = p.total_milli / MILLI_PER_GPU
        for tenant in (tenant_of(p.name, seed), "*"):
            key = (tenant, flavor_of(p))
            times[key].append(p.creation_time)
            held[key].append((p.creation_time, p.deletion_time, gpus))
    out: dict[tuple[str, str, str], list[float]] = {}
    for key in sorted(times.keys() | held.keys()):
        out[("arrivals", *key)] = hourly_counts(times[key], start, hours)
        out[("gpu_hours", *key)] = hourly_gpu_hours(held[key], start, hours)
    return out


def evaluate(
    series: dict[tuple[str, str, str], list[float]], origins: Sequence[int], horizon: int
) -> dict[str, Any]:
    """Per (signal, level, method, band): MAE and MASE averaged over series and origins."""
    errors: dict[tuple[str, str, str, str], dict[str, list[float]]] = defaultdict(
        lambda: {"mae": [], "mase": []}
    )
    fit_s: dict[str, float] = defaultdict(float)
    for (signal, tenant, _flavor), values in series.items():
        level = "flavor" if tenant == "*" else "tenant×flavor"
        for origin in origins:
            history, actual = values[:origin], values[origin : origin + horizon]
            scale = naive_scale(history, HOURS_PER_WEEK)
            for method, forecast in METHODS.items():
                began = time.perf_counter()
                predicted = forecast(history, horizon)
                fit_s[method] += time.perf_counter() - began
                for lo, hi in BANDS:
                    if hi > horizon:
                        continue
                    err = mae(actual[lo - 1 : hi], predicted[lo - 1 : hi])
                    cell = errors[(signal, level, method, f"{lo}-{hi}")]
                    cell["mae"].append(err)
                    if scale is not None:
                        cell["mase"].append(err / scale)
    rows = [
        {
            "signal": signal,
            "level": level,
            "method": method,
            "band_h": band,
            "mae": statistics.fmean(cell["mae"]),
            "mase": statistics.fmean(cell["mase"]) if cell["mase"] else None,
            "cases": len(cell["mae"]),
        }
        for (signal, level, method, band), cell in sorted(errors.items())
    ]
    return {"rows": rows, "fit_seconds": dict(fit_s)}


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: one line per (signal, level, band), MASE (MAE) per method."""
    methods = list(METHODS)
    lines = [
        "| signal | level | horizon h | " + " | ".join(f"{m} MASE (MAE)" for m in methods) + " |",
        "|---|---|---|" + "---:|" * len(methods),
    ]
    cells: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        cells[(r["signal"], r["level"], r["band_h"])][r["method"]] = r
    band_order = {f"{lo}-{hi}": i for i, (lo, hi) in enumerate(BANDS)}
    for key in sorted(cells, key=lambda k: (k[0], k[1], band_order[k[2]])):
        per = cells[key]
        best = min(methods, key=lambda m: per[m]["mae"])
        shown = []
        for m in methods:
            r = per[m]
            mase_text = "—" if r["mase"] is None else f"{r['mase']:.3f}"
            text = f"{mase_text} ({r['mae']:.3f})"
            shown.append(f"**{text}**" if m == best else text)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=Path, default=DEFAULT_PODS)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--step-hours", type=int, default=24)
    parser.add_argument("--horizon", type=int, default=HOURS_PER_WEEK)
    parser.add_argument("--busy-per-day", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    pods = [p for p in read_pods(args.pods) if p.total_milli > 0 and p.deletion_time is not None]
    start = busy_start(pods, args.busy_per_day)
    last = max(p.creation_time for p in pods)
    hours = (last - start) // HOUR_S + 1
    first_origin = 2 * HOURS_PER_WEEK
    origins = list(range(first_origin, hours - args.horizon + 1, args.step_hours))
    if not origins:
        print(f"too little history: {hours} hours from the busy start", file=sys.stderr)
        return 1
    series = build_series(pods, args.seed, start, hours)
    began = time.perf_counter()
    result = evaluate(series, origins, args.horizon)
    result.update(
        busy_start_day=start // 86_400,
        hours=hours,
        origins=len(origins),
        series=len(series),
        pods=len(pods),
        seconds=round(time.perf_counter() - began, 1),
    )
    print(
        f"{len(pods)} GPU pods; busy from day {start // 86_400} of the trace, {hours} hours; "
        f"{len(series)} series × {len(origins)} origins (every {args.step_hours} h), "
        f"horizon {args.horizon} h; {result['seconds']} s"
    )
    print(table(result["rows"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
