"""The command line of ``python -m benchmarks.inference`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.inference import breakdown, overhead
from benchmarks.inference.replay import (
    Cell,
    Engine,
    QuotaWatch,
    deploy,
    replay,
    report,
    settle,
)
from benchmarks.inference.serve import Portal
from benchmarks.inference.strategies import STRATEGIES, Forecast, Strategy
from benchmarks.inference.traces import Trace, TraceKind, bursty, diurnal
from portal.inference.testengine import read_model
from portal.jobs.launch import free_port


@dataclass(frozen=True, slots=True)
class Config:
    load_seconds: tuple[float, ...] = (5.0, 20.0, 60.0)
    traces: tuple[TraceKind, ...] = (TraceKind.BURSTY, TraceKind.DIURNAL)
    strategies: tuple[str, ...] = tuple(STRATEGIES)
    duration_s: float = 300.0
    seed: int = 1
    rate: float = 1.5  # a burst's rate, the day's peak rate
    burst_on_s: float = 15.0
    burst_off_s: float = 60.0
    day_s: float = 150.0
    engine: Engine = field(default_factory=Engine)
    overhead_rate: float = 200.0
    overhead_s: float = 10.0
    overhead: bool = True
    history_days: int = 3  # simulated days of arrivals the forecast strategy starts from
    compare: str | None = None  # another tree (e.g. an export of main): its gateway too


QUICK = Config(
    load_seconds=(0.5,),
    duration_s=12.0,
    rate=3.0,
    burst_on_s=2.0,
    burst_off_s=5.0,
    day_s=12.0,
    engine=Engine(down_window_s=3.0, idle_s=2.0),
    overhead_s=1.0,
)


def make_trace(kind: TraceKind, cfg: Config) -> Trace:
    if kind is TraceKind.BURSTY:
        return bursty(cfg.seed, cfg.duration_s, cfg.rate, cfg.burst_on_s, cfg.burst_off_s)
    return diurnal(cfg.seed, cfg.duration_s, cfg.day_s, cfg.rate)


def history(kind: TraceKind, cfg: Config) -> tuple[tuple[float, ...], float]:
    """The simulated days before the replay: the same process under another seed, shifted
    to negative times; and how long they last."""
    span = cfg.history_days * cfg.day_s
    if span <= 0:
        return (), 0.0
    past = make_trace(kind, replace(cfg, seed=cfg.seed + 1000, duration_s=span))
    return tuple(t - span for t in past.arrivals), span


def strategy(name: str, trace: Trace, load_s: float, cfg: Config) -> Strategy:
    """The named strategy for one cell (a forecast planner of its own, with its history)."""
    if name != "forecast":
        return STRATEGIES[name]
    past, span = history(trace.kind, cfg)
    e = cfg.engine
    return Forecast(
        day_s=cfg.day_s,
        load_s=load_s,
        history=past,
        history_s=span,
        target=e.target,
        request_s=e.max_tokens * e.token_seconds,
    )


def run(cfg: Config, work: Path) -> dict[str, Any]:
    traces = [make_trace(k, cfg) for k in cfg.traces]
    cells = [
        Cell(t, load, strategy(s, t, load, cfg))
        for t in traces
        for load in cfg.load_seconds
        for s in cfg.strategies
    ]
    quotas = {c.tenant: c.bounds(cfg.engine).gpus for c in cells} | {overhead.TENANT: 1}
    model = work / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"\1" * (1 << 20))
    uri, digest = model.as_uri(), read_model(model)[1]
    portal = Portal(work, quotas, free_port("127.0.0.1"))
    began = time.monotonic()
    portal.start()
    rows: list[dict[str, Any]] = []
    watch = QuotaWatch()
    try:
        settled = replayed = time.monotonic()
        if cells:
            ids = deploy(portal, cells, cfg.engine, uri, digest)
            settle_s = 3 * max(cfg.load_seconds) + cfg.engine.idle_s + 120
            settle(portal, cells, ids, cfg.engine, settle_s)
            settled = time.monotonic()
            tallies, watch, start, end = asyncio.run(replay(portal, cells, ids, cfg.engine))
            rows = report(portal, cells, ids, tallies, watch, (start, end), cfg.engine)
            for row, cell, tally in zip(rows, cells, tallies, strict=True):
                plans: list[tuple[float, int, str]] = []
                if isinstance(cell.strategy, Forecast):
                    row["plan_reasons"] = dict(cell.strategy.reasons)
                    plans = cell.strategy.timeline
                cold, why = breakdown.classify(tally.requests, tally.states, plans, cell.load_s)
                row["cold_load"] = len(cold)
                row["cold_load_share"] = round(len(cold) / row["requests"], 4) if cold else 0.0
                row["cold_why"] = dict(why)
                row["raw"] = {"requests": tally.requests, "states": tally.states, "plans": plans}
                if cell.trace.kind is TraceKind.DIURNAL:
                    row["cold_by_hour"] = dict(sorted(breakdown.by_hour(cold, cfg.day_s).items()))
            replayed = time.monotonic()
        gateway: list[dict[str, Any]] = []
        if cfg.overhead:
            replica = overhead.deploy_ready(portal, uri, digest, 120)
            others: list[tuple[str, Portal]] = []
            if cfg.compare is not None:
                (work / "compare").mkdir()
                other = Portal(
                    work / "compare",
                    {overhead.TENANT: 1},
                    free_port("127.0.0.1"),
                    source=Path(cfg.compare),
                )
                others.append((f"{Path(cfg.compare).name} (compared)", other))
                other.start()
                overhead.deploy_ready(other, uri, digest, 120)
            try:
                gateway = asyncio.run(
                    overhead.measure(portal, replica, cfg.overhead_rate, cfg.overhead_s, others)
                )
            finally:
                for _label, other in others:
                    other.stop()
        measured = time.monotonic()
    finally:
        portal.stop()
    return {
        "config": {**asdict(cfg), "strategies": list(cfg.strategies)},
        "load_average": os.getloadavg(),
        "wall_s": {
            "setup_and_settle": round(settled - began, 1),
            "replay": round(replayed - settled, 1),
            "overhead": round(measured - replayed, 1),
            "total": round(time.monotonic() - began, 1),
        },
        "quota_samples": watch.samples,
        "quota_samples_missed": watch.missed,
        "quota_violations": sum(watch.violations.values()),
        "cells": rows,
        "gateway_overhead": gateway,
        "forecast_vs_reactive": versus(rows),
    }


def versus(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per trace and load time with both: the forecast strategy's cold share and GPU-seconds
    (serving + warm) against reactive's, and whether issue #23's goal is met (cold share at
    most half, GPU-seconds at most 10 % more)."""
    by = {(r["trace"], r["load_s"], r["strategy"]): r for r in rows}
    out = []
    for (trace, load, name), f in by.items():
        r = by.get((trace, load, "reactive"))
        if name != "forecast" or r is None:
            continue
        gpu_f = f["gpu_s_serving"] + f["gpu_s_warm"]
        gpu_r = r["gpu_s_serving"] + r["gpu_s_warm"]
        cold_ratio = f["cold_share"] / r["cold_share"] if r["cold_share"] else None
        load_f, load_r = f.get("cold_load_share"), r.get("cold_load_share")
        load_ratio = load_f / load_r if load_f is not None and load_r else None
        gpu_ratio = gpu_f / gpu_r if gpu_r else None
        out.append(
            {
                "trace": trace,
                "load_s": load,
                "cold_share_reactive": r["cold_share"],
                "cold_share_forecast": f["cold_share"],
                "cold_ratio": None if cold_ratio is None else round(cold_ratio, 3),
                "cold_load_share_reactive": load_r,
                "cold_load_share_forecast": load_f,
                "cold_load_ratio": None if load_ratio is None else round(load_ratio, 3),
                "gpu_s_reactive": round(gpu_r, 1),
                "gpu_s_forecast": round(gpu_f, 1),
                "gpu_ratio": None if gpu_ratio is None else round(gpu_ratio, 3),
                "goal_met": cold_ratio is not None
                and gpu_ratio is not None
                and cold_ratio <= 0.5
                and gpu_ratio <= 1.1,
            }
        )
    return out


def markdown(out: dict[str, Any]) -> str:
    lines = [
        "| trace | load s | strategy | requests | answered | cold | cold share | TTFT p50 s "
        "| TTFT p99 s | GPU-s serving | GPU-s warm | most GPUs / quota | quota violations |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in out["cells"]:
        lines.append(
            f"| {r['trace']} | {r['load_s']:g} | {r['strategy']} | {r['requests']} "
            f"| {r['answered']} | {r['cold']} | {r['cold_share']:.1%} | {r['ttft_p50_s']} "
            f"| {r['ttft_p99_s']} | {r['gpu_s_serving']} | {r['gpu_s_warm']} "
            f"| {r['most_gpus_used']} / {r['quota_limit']} | {r['quota_violations']} |"
        )
    variant = any("variant" in g for g in out["gateway_overhead"])
    lines += [
        "",
        ("| variant " if variant else "")
        + "| route | rate/s | direct p50 ms | direct p99 ms | gateway p50 ms | gateway p99 ms "
        "| added p50 ms | added p99 ms | portal CPU ms/request | net of idle ms/request "
        "| errors (direct, gateway) |",
        ("|---" if variant else "") + "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for g in out["gateway_overhead"]:
        lines.append(
            (f"| {g['variant']} " if variant else "")
            + f"| {g['route']} | {g['rate_per_s']:g} | {g['direct_p50_ms']} | {g['direct_p99_ms']} "
            f"| {g['gateway_p50_ms']} | {g['gateway_p99_ms']} | {g['added_p50_ms']} "
            f"| {g['added_p99_ms']} | {g.get('portal_cpu_ms_per_request', 'n/a')} "
            f"| {g.get('portal_cpu_ms_per_request_net', 'n/a')} "
            f"| {g['direct_errors']}, {g['gateway_errors']} |"
        )
    if any("cold_why" in r for r in out["cells"]):
        lines += [
            "",
            "| trace | load s | strategy | held (cold or wake) | met a load | "
            + " | ".join(breakdown.CLASSES)
            + f" | {breakdown.SLOW} | met a load per simulated hour |",
            "|---|---:|---|---:|---:|" + "---:|" * (len(breakdown.CLASSES) + 1) + "---|",
        ]
        for r in out["cells"]:
            why = r.get("cold_why", {})
            hours = ", ".join(f"{h}h: {n}" for h, n in r.get("cold_by_hour", {}).items())
            lines.append(
                f"| {r['trace']} | {r['load_s']:g} | {r['strategy']} | {r['cold']} "
                f"| {r.get('cold_load', 'n/a')} | "
                + " | ".join(str(why.get(c, 0)) for c in (*breakdown.CLASSES, breakdown.SLOW))
                + f" | {hours or '—'} |"
            )
    if out.get("forecast_vs_reactive"):
        lines += [
            "",
            "| trace | load s | cold share reactive | cold share forecast | ratio "
            "| GPU-s reactive | GPU-s forecast | ratio | goal (≤ 0.5, ≤ 1.1) met |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for v in out["forecast_vs_reactive"]:
            lines.append(
                f"| {v['trace']} | {v['load_s']:g} | {v['cold_share_reactive']:.1%} "
                f"| {v['cold_share_forecast']:.1%} | {v['cold_ratio']} | {v['gpu_s_reactive']} "
                f"| {v['gpu_s_forecast']} | {v['gpu_ratio']} | {'yes' if v['goal_met'] else 'no'} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.inference", description=__doc__)
    p.add_argument(
        "--quick", action="store_true", help="a tiny configuration: seconds, not minutes"
    )
    p.add_argument("--load-seconds", type=float, nargs="+", help="engine load times")
    p.add_argument("--traces", nargs="+", choices=[k.value for k in TraceKind])
    p.add_argument("--strategies", nargs="+", choices=list(STRATEGIES))
    p.add_argument("--duration", type=float, help="seconds each trace lasts")
    p.add_argument("--seed", type=int)
    p.add_argument("--overhead-seconds", type=float, help="seconds of each mode per route")
    p.add_argument("--overhead-rate", type=float, help="requests/s of the overhead phase")
    p.add_argument("--overhead-only", action="store_true", help="no traces: the gateway only")
    p.add_argument("--no-overhead", action="store_true", help="traces only: no overhead phase")
    p.add_argument("--day-seconds", type=float, help="seconds of a compressed day (diurnal)")
    p.add_argument("--history-days", type=int, help="days the forecast strategy starts from")
    p.add_argument(
        "--compare",
        type=Path,
        help="another source tree (e.g. an export of main): its portal's gateway is measured "
        "in the same alternating blocks",
    )
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    cfg = QUICK if args.quick else Config()
    changes: dict[str, Any] = {}
    if args.load_seconds:
        changes["load_seconds"] = tuple(args.load_seconds)
    if args.traces:
        changes["traces"] = tuple(TraceKind(t) for t in args.traces)
    if args.strategies:
        changes["strategies"] = tuple(args.strategies)
    if args.duration is not None:
        changes["duration_s"] = args.duration
    if args.overhead_only:
        changes["traces"] = ()
    if args.no_overhead:
        changes["overhead"] = False
    if args.day_seconds is not None:
        changes["day_s"] = args.day_seconds
    if args.history_days is not None:
        changes["history_days"] = args.history_days
    if args.seed is not None:
        changes["seed"] = args.seed
    if args.overhead_seconds is not None:
        changes["overhead_s"] = args.overhead_seconds
    if args.overhead_rate is not None:
        changes["overhead_rate"] = args.overhead_rate
    if args.compare is not None:
        changes["compare"] = str(args.compare.resolve())
    cfg = replace(cfg, **changes)
    with tempfile.TemporaryDirectory() as tmp:
        out = run(cfg, Path(tmp))
    print(markdown(out))
    print(
        f"quota samples {out['quota_samples']}, violations {out['quota_violations']}; "
        f"wall {out['wall_s']['total']} s (replay {out['wall_s']['replay']} s)"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0
