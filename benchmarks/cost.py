"""Cost reports over a month of history: cold and warm, and the Cost view's live update.

``python -m benchmarks.cost [--nodes 1250] [--days 30] [--workloads 3000] [--repeat 5]
[--rollups]`` replays the dashboards benchmark's month (``benchmarks.dashboards.seed``: 20
tenants, whole-GPU workloads arriving hourly over ``--days`` days on ``--nodes`` 8-GPU HGX
nodes) on SQLite. With ``--rollups`` every workload also gets an hourly utilization roll-up
for each hour it ran (``benchmarks.dashboards.seed_rollups``), and accounting reads them
(``TelemetryUtilization``).

Measured:

- **report**: ``Accounting.report`` of this month by tenant and day (the Cost view's main
  read) on a new ``Accounting`` (cold: every ended day priced) and again on the same one (warm:
  ended days kept, the last hour or so priced);
- **live update**: the Cost view served over HTTP (as in ``benchmarks.dashboards``), one
  ``refresh()`` with nothing changed, and one after the clock moved 7 minutes (the running
  workloads cost more: today's bars, the flavor table, budgets and headline change).
"""

from __future__ import annotations

import argparse
import functools
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import panel as pn

from benchmarks.dashboards import VIEWERS, Clock, seed, seed_rollups, serving
from dashboards.app import build_view
from dashboards.sources import ApiSource
from portal.accounting.prices import price_config
from portal.accounting.service import Accounting, Step
from portal.accounting.telemetry import TelemetryUtilization
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.api.cost import use_accounting
from portal.store.writer import Store

PRICES = price_config({"prices": {"H100-80GB": "4.00"}, "budgets": {"team-00": "50000"}})


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def cell(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:,.0f} / {max(xs) * 1000:,.0f}"


def main(argv: Sequence[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cost", description=__doc__)
    ap.add_argument("--nodes", type=int, default=1250)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--workloads", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rollups", action="store_true", help="hourly utilization roll-ups too")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'portal.db'}")
        clock = Clock()
        alloc = Allocator(store, clock=clock)
        rng = random.Random(args.seed)
        running = seed(alloc, clock, args.nodes, args.days, args.workloads, rng)
        rollups = seed_rollups(store, clock(), rng) if args.rollups else 0
        utilization = TelemetryUtilization(store.engine) if args.rollups else None
        month = datetime(clock().year, clock().month, 1, tzinfo=UTC)

        def accounting() -> Accounting:
            return Accounting(store, PRICES, utilization=utilization, clock=clock)

        cold, warm = [], []
        for _ in range(args.repeat):
            ask = functools.partial(accounting().report, month, clock(), Step.DAY)
            cold.append(timed(ask))
            warm.append(timed(ask))

        app = create_app(alloc, StaticAuthenticator(VIEWERS))
        use_accounting(app, accounting())
        same, moved = [], []
        with serving(app) as url:
            page = build_view("cost", ApiSource(url, "lead"), VIEWERS["lead"], {})
            pn.panel(page.view).get_root()  # type: ignore[attr-defined]
            for _ in range(args.repeat):
                same.append(timed(page.refresh))
                clock.now += timedelta(minutes=7)
                moved.append(timed(page.refresh))
        store.close()
    text = "\n".join(
        [
            f"{args.nodes:,} nodes, {args.days} days, {args.workloads:,} workloads "
            f"({running:,} running at the end), {rollups:,} hourly roll-ups. "
            f"Times in ms, median / max of {args.repeat}.",
            "",
            "| measured | ms |",
            "|---|---|",
            f"| report of the month by day, cold (new Accounting) | {cell(cold)} |",
            f"| report of the month by day, warm (same Accounting) | {cell(warm)} |",
            f"| Cost view live update, nothing changed | {cell(same)} |",
            f"| Cost view live update, clock moved 7 minutes | {cell(moved)} |",
        ]
    )
    print(text, flush=True)
    print(f"\n{platform.platform()}, Python {platform.python_version()}")
    return text


if __name__ == "__main__":
    main()
