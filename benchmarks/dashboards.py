"""Dashboard render and live-update times at scale.

``python -m benchmarks.dashboards [--nodes 1250] [--days 30] [--workloads 3000] [--repeat 5]
[--no-rollups] [--browser]`` starts a real allocator on SQLite with ``--nodes`` 8-GPU HGX H100
nodes (1,250 nodes = 10,000 GPUs), 20 tenants with quotas, and ``--workloads`` whole-GPU
workloads started and released over ``--days`` days of simulated time (hourly steps), so the
cost routes price a month of allocation history. Every workload also gets an hourly
utilization roll-up for each hour it ran (``seed_rollups``; ``--no-rollups`` leaves them out),
and accounting reads them as the service does (``TelemetryUtilization``): the Cost view then
shows measured efficiency, idle spend and cost per owner. The portal API is served by uvicorn
on loopback, as in production; the dashboards read it over HTTP with a viewer's token.

Server side, per view: **first render** = build the page (its stores read the portal) and
create its Bokeh models (``get_root``), what a new session costs before anything is sent;
**live update** = one periodic ``refresh()`` of a rendered page (read again, re-render the
parts whose data changed). With ``--browser``, the served app is also loaded in Debian's
Chromium and the time from navigation to the view's headline being visible is measured.
"""

from __future__ import annotations

import argparse
import functools
import gc
import platform
import random
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import panel as pn
import uvicorn

from dashboards.app import TITLES, Page, Settings, build_view, serve
from dashboards.auth import TokenArgIdentity
from dashboards.sources import ApiSource
from dashboards.stores import ClusterStore
from dashboards.stores import Store as DataStore
from dashboards.warmup import warm_up
from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadKind, WorkloadRequest
from portal.accounting.history import epoch_seconds, usage_intervals
from portal.accounting.prices import price_config
from portal.accounting.service import Accounting
from portal.accounting.telemetry import TelemetryUtilization
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.api.cost import use_accounting
from portal.inventory.simulated import generate
from portal.store.records import WorkloadState
from portal.store.writer import Store
from portal.telemetry.tables import REVISIONS, WORKLOAD_ROLLUPS

TENANTS = [f"team-{i:02d}" for i in range(20)]
HOUR_S = 3600
# Thirty days end on Nov 30 00:00: the Cost view's default window (this month) then holds
# 29 of them; ending at midnight on the 1st would leave it empty.
START = datetime(2026, 10, 31, tzinfo=UTC)
S = Scope


@dataclass
class Clock:
    now: datetime = START

    def __call__(self) -> datetime:
        return self.now


VIEWERS: dict[str, Caller] = {
    # Leadership and operators: every tenant, read only.
    "lead": Caller(
        "lead",
        CallerKind.USER,
        frozenset(
            {
                S.QUOTAS_READ,
                S.USAGE_READ,
                S.QUEUE_READ,
                S.WORKLOADS_READ,
                S.COST_READ,
                S.INVENTORY_READ,
            }
        ),
    ),
    # team-00's admin, who also runs workloads as "user-00".
    "admin": Caller(
        "user-00",
        CallerKind.USER,
        frozenset(
            {
                S.WORKLOADS_WRITE,
                f"{S.WORKLOADS_READ}!group=team-00",
                f"{S.QUEUE_READ}!group=team-00",
                f"{S.QUOTAS_READ}!group=team-00",
                f"{S.USAGE_READ}!group=team-00",
                f"{S.QUOTAS_WRITE}!group=team-00",
                f"{S.COST_READ}!group=team-00",
            }
        ),
        frozenset({"team-00"}),
    ),
}

CASES: list[tuple[str, str]] = [
    ("cluster", "lead"),
    ("tenant", "admin"),
    ("my_work", "admin"),
    ("cost", "lead"),
    ("landing", "lead"),
]


def seed(
    alloc: Allocator, clock: Clock, nodes: int, days: int, workloads: int, rng: random.Random
) -> int:
    """Start the cluster and replay ``workloads`` arrivals over ``days`` days; returns how many
    were running at the end."""
    alloc.start(generate({"hgx-h100-8": nodes}))
    gpus = nodes * 8
    for t in TENANTS:
        alloc.set_tenant(t, cohort="all")
        alloc.set_quota(t, "H100-80GB", guaranteed=gpus // 25, limit=gpus // 10)
    hours = days * 24
    per_hour = max(1, workloads // hours)
    live: list[str] = []
    for _hour in range(hours):
        for _ in range(per_hour):
            tenant = rng.choice(TENANTS)
            owner = f"user-{TENANTS.index(tenant):02d}"
            count = rng.choice((1, 1, 2, 4, 8))
            st = alloc.request(
                WorkloadRequest(
                    tenant,
                    owner,
                    f"w{len(live)}",
                    DeviceRequest(FlavorKind.GPU, count=count, models=frozenset({"H100-80GB"})),
                    kind=WorkloadKind.JOB,
                )
            )
            live.append(st.id)
        # Each hour some work ends: ten days' lifetime on average, so the cluster fills to
        # about a third (what a busy month leaves running) and the history is a month long.
        ending = [w for w in live if rng.random() < 1 / 240]
        for w in ending:
            alloc.release(w)
            live.remove(w)
        clock.now += timedelta(hours=1)
    return sum(1 for w in alloc.workloads() if w.state is WorkloadState.RUNNING)


def seed_rollups(store: Store, now: datetime, rng: random.Random) -> int:
    """One hourly roll-up per workload and closed hour it ran, and the revision of each hour
    as the telemetry store leaves it; returns how many roll-ups. Written straight into the
    tables: a month of agent samples would take far longer to ingest and roll up."""
    rows: list[dict[str, Any]] = []
    first: dict[str, tuple[int, int, str]] = {}
    for iv in usage_intervals(store, START, now, now):
        lo, hi, _ = first.get(iv.workload_id, (iv.start, iv.end, iv.tenant))
        first[iv.workload_id] = (min(lo, iv.start), max(hi, iv.end), iv.tenant)
    end = epoch_seconds(now)
    for wid, (lo, hi, tenant) in first.items():
        for hour in range(lo - lo % HOUR_S, min(hi, end - HOUR_S + 1), HOUR_S):
            u = rng.choice((0.5, 2.0, 35.0, 70.0, 99.0)) + rng.random()
            rows.append(
                {
                    "step_s": HOUR_S,
                    "workload_id": wid,
                    "bucket_ms": hour * 1000,
                    "tenant": tenant,
                    "samples": 60,
                    "utilization_avg": u,
                    "utilization_min": u,
                    "utilization_max": u,
                    "memory_used_avg": 1000.0,
                    "memory_used_max": 1000.0,
                }
            )
    hours = sorted({r["bucket_ms"] for r in rows})
    with store.engine.begin() as conn:
        conn.execute(WORKLOAD_ROLLUPS.insert(), rows)
        if hours:
            revisions = [{"step_s": HOUR_S, "hour_ms": h, "revision": 1} for h in hours]
            conn.execute(REVISIONS.insert(), revisions)
    return len(rows)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def serving(app: Any) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class Timing:
    first_render_s: list[float] = field(default_factory=list)
    live_update_s: list[float] = field(default_factory=list)
    browser_s: list[float] = field(default_factory=list)
    browser_warm_s: list[float] = field(default_factory=list)
    browser_chart_s: list[float] = field(default_factory=list)
    browser_live_s: list[float] = field(default_factory=list)
    reads_s: list[float] = field(default_factory=list)


def _read_fresh(stores: list[DataStore]) -> None:
    for s in stores:
        _copy(s).refresh()


def _copy(store: DataStore) -> DataStore:
    """A store like ``store`` (same source, tenant, owner, node) with no view attached."""
    keep = {k: v for k, v in store.param.values().items() if k in ("tenant", "owner", "selected")}
    return type(store)(store.source, **keep)


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def server_side(url: str, repeat: int) -> dict[str, Timing]:
    out: dict[str, Timing] = {}
    for view, who in CASES:
        tm = out.setdefault(f"{view} ({who})", Timing())
        for _ in range(repeat):
            holder: dict[str, Any] = {}

            def first(view: str = view, who: str = who, holder: dict[str, Any] = holder) -> None:
                page = build_view(view, ApiSource(url, who), VIEWERS[who], {})
                holder["root"] = pn.panel(page.view).get_root()  # type: ignore[attr-defined]
                holder["page"] = page

            tm.first_render_s.append(timed(first))
            stores = holder["page"].stores
            if stores:
                tm.live_update_s.append(timed(holder["page"].refresh))
                # The same reads into fresh stores no view watches: the portal's share.
                tm.reads_s.append(timed(functools.partial(_read_fresh, stores)))
    return out


HEADLINES = {
    "cluster": "fragmentation",
    "tenant": "Tenant team-00",
    "my_work": "My work",
    "cost": "GPU-hours",
    "landing": "Hello",
}


# Finds text anywhere in the page, inside Bokeh's shadow roots too; polled every 20 ms.
_FIND_TEXT = """(needle) => {
    const roots = [document];
    for (let i = 0; i < roots.length; i++) {
        if ((roots[i].textContent || "").includes(needle)) return Date.now();
        for (const el of roots[i].querySelectorAll("*")) {
            if (el.shadowRoot) roots.push(el.shadowRoot);
        }
    }
    return false;
}"""


@dataclass
class RefreshLog:
    """When each served page's periodic refresh ran: (page title, start, end), epoch s."""

    runs: list[tuple[str, float, float]] = field(default_factory=list)
    starts: list[tuple[str, float]] = field(default_factory=list)

    @contextmanager
    def watching(self) -> Iterator[None]:
        original = Page.refresh

        def logged(page: Page) -> None:
            t = time.time()
            self.starts.append((page.title, t))
            original(page)
            self.runs.append((page.title, t, time.time()))

        Page.refresh = logged  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            Page.refresh = original  # type: ignore[method-assign]

    def wait_next(self, title: str, timeout_s: float = 60) -> None:
        """Until a refresh of ``title`` that had not finished when called has finished."""
        seen = len(self.runs)
        deadline = time.time() + timeout_s
        while not any(r[0] == title for r in self.runs[seen:]):
            if time.time() > deadline:
                raise TimeoutError(f"no refresh of {title} within {timeout_s} s")
            time.sleep(0.01)

    def first_start_after(self, title: str, t: float) -> float:
        return min(at for name, at in self.starts if name == title and at >= t)


@dataclass
class LiveChange:
    """Changes what ``view`` shows; returns text that appears in the page only afterwards."""

    alloc: Allocator
    clock: Clock
    url: str
    made: int = 0

    def __call__(self, view: str) -> tuple[str, float]:
        """(the text, when the change was made: epoch s)."""
        self.made += 1
        if view == "cluster":
            store = ClusterStore(ApiSource(self.url, "lead"))
            store.refresh()
            before = store.totals()[1]
            t = time.time()
            self._request("team-01", "user-01", f"live-{self.made}", 8)
            return f"{before + 8:,.1f} GPUs", t
        if view in ("tenant", "my_work"):
            # team-00 is held at its current use, so the new workload waits in the queue:
            # it appears in the Tenant view's queue and in My work.
            used = sum(u.used for u in self.alloc.usage("team-00") if u.flavor == "H100-80GB")
            # Only the limit holds it; its guarantee stays (raising it past the others'
            # would over-commit the flavor, which the allocator refuses).
            held = next(q for q in self.alloc.quotas("team-00") if q.flavor == "H100-80GB")
            self.alloc.set_quota(
                "team-00", "H100-80GB", guaranteed=min(held.guaranteed, used), limit=used
            )
            name = f"live-{view}-{self.made}"
            t = time.time()
            self._request("team-00", "user-00", name, 1)
            return name, t
        if view == "cost":
            # Ten minutes of cost accrue (the first change also starts the month's last day).
            t = time.time()
            self.clock.now += timedelta(minutes=10)
            return f"{self.clock.now:%Y-%m-%d %H:%M} UTC", t
        raise ValueError(view)

    def _request(self, tenant: str, owner: str, name: str, count: int) -> None:
        self.alloc.request(
            WorkloadRequest(
                tenant,
                owner,
                name,
                DeviceRequest(FlavorKind.GPU, count=count, models=frozenset({"H100-80GB"})),
                kind=WorkloadKind.JOB,
            )
        )


def browser_side(url: str, repeat: int, timings: dict[str, Timing], change: LiveChange) -> None:
    """Cold load (a new browser profile: Bokeh's JavaScript not cached), warm load (the same
    profile again) and live update (a change in the portal until the page shows it, counted
    from the start of the periodic refresh that carried it: server reads, re-render, the
    websocket patch and the browser's paint).

    Loads are timed on a server with the service's refresh period (``Settings``' default),
    live updates on a second one that refreshes every second so that each change shows
    within a second: a page refreshing every second while it loads took 0.15-0.2 s longer
    to show."""
    from playwright.sync_api import expect, sync_playwright

    load_port, live_port = free_port(), free_port()
    log = RefreshLog()
    with log.watching():
        servers: list[Any] = [
            serve(Settings(url, TokenArgIdentity(VIEWERS)), port=load_port, threaded=True),
            serve(
                Settings(url, TokenArgIdentity(VIEWERS), refresh_s=1.0),
                port=live_port,
                threaded=True,
            ),
        ]
        time.sleep(1)
        try:
            with sync_playwright() as pw:
                b = pw.chromium.launch(
                    executable_path=shutil.which("chromium"),
                    args=[
                        "--no-sandbox",
                        "--disable-gpu",
                        "--disable-background-networking",
                        "--disable-component-update",
                        "--disable-sync",
                    ],
                )
                for view, who in CASES:
                    path = "" if view == "landing" else view
                    tm = timings[f"{view} ({who})"]
                    headline = HEADLINES[view]
                    for _ in range(repeat):
                        context = b.new_context(viewport={"width": 1400, "height": 1000})
                        for into in (tm.browser_s, tm.browser_warm_s):
                            page = context.new_page()
                            t = time.perf_counter()
                            page.goto(f"http://127.0.0.1:{load_port}/{path}?token={who}")
                            expect(page.get_by_text(headline).first).to_be_visible(timeout=120_000)
                            into.append(time.perf_counter() - t)
                            if view in CHARTED and into is tm.browser_s:
                                # Cost and Cluster draw their chart after their numbers: time both.
                                chart = page.locator("canvas").first
                                expect(chart).to_be_visible(timeout=120_000)
                                tm.browser_chart_s.append(time.perf_counter() - t)
                            page.close()
                        if view != "landing":
                            page = context.new_page()
                            page.goto(f"http://127.0.0.1:{live_port}/{path}?token={who}")
                            expect(page.get_by_text(headline).first).to_be_visible(timeout=120_000)
                            title = TITLES[view]
                            log.wait_next(title)
                            needle, t_change = change(view)
                            found = page.wait_for_function(
                                _FIND_TEXT, arg=needle, polling=20, timeout=60_000
                            ).json_value()
                            start = log.first_start_after(title, t_change)
                            tm.browser_live_s.append(float(found) / 1000 - start)
                            page.close()
                        context.close()
                b.close()
        finally:
            for server in servers:
                server.stop()


# The views with a Bokeh chart on the benchmark's data (My work has no telemetry here).
CHARTED = ("cluster", "cost")


def report(
    args: argparse.Namespace,
    running: int,
    rollups: int,
    seed_s: float,
    timings: dict[str, Timing],
) -> str:
    def cell(xs: list[float]) -> str:
        if not xs:
            return "—"
        return f"{statistics.median(xs) * 1000:,.0f} / {max(xs) * 1000:,.0f}"

    lines = [
        f"{args.nodes:,} nodes / {args.nodes * 8:,} GPUs, {args.days} days of hourly history, "
        f"{args.workloads:,} workloads ({running:,} running at the end), {rollups:,} hourly "
        f"utilization roll-ups; seeding took "
        f"{seed_s:.0f} s. Times in ms, median / max of {args.repeat}.",
        "",
        "| view (viewer) | first render, server | live update, server | of which portal reads "
        "| load in Chromium, cold / warm cache | chart drawn, cold | live update in Chromium |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, t in timings.items():
        lines.append(
            f"| {name} | {cell(t.first_render_s)} | {cell(t.live_update_s)} "
            f"| {cell(t.reads_s)} | {cell(t.browser_s)}; {cell(t.browser_warm_s)} "
            f"| {cell(t.browser_chart_s)} | {cell(t.browser_live_s)} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.dashboards", description=__doc__)
    ap.add_argument("--nodes", type=int, default=1250)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--workloads", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--rollups",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hourly utilization roll-ups for every workload, read by accounting (default: on)",
    )
    ap.add_argument("--browser", action="store_true", help="also time page loads in Chromium")
    ap.add_argument(
        "--views", default=",".join(v for v, _ in CASES), help="comma-separated views to time"
    )
    args = ap.parse_args(argv)
    wanted = args.views.split(",")
    unknown = sorted(set(wanted) - {v for v, _ in CASES})
    if unknown:
        ap.error(f"unknown view(s) {', '.join(unknown)}; known: {', '.join(v for v, _ in CASES)}")
    CASES[:] = [c for c in CASES if c[0] in wanted]
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'portal.db'}")
        clock = Clock()
        alloc = Allocator(store, clock=clock)
        t0 = time.perf_counter()
        rng = random.Random(args.seed)
        running = seed(alloc, clock, args.nodes, args.days, args.workloads, rng)
        rollups = seed_rollups(store, clock(), rng) if args.rollups else 0
        seed_s = time.perf_counter() - t0
        gc.collect()
        gc.freeze()  # as ``gpuportal serve`` does once the allocator has started
        app = create_app(alloc, StaticAuthenticator(VIEWERS))
        prices = price_config({"prices": {"H100-80GB": "4.00"}, "budgets": {"team-00": "50000"}})
        # As ``portal.api.cost.configure`` does: utilization from the telemetry roll-ups.
        utilization = TelemetryUtilization(store.engine) if args.rollups else None
        accounting = Accounting(store, prices, utilization=utilization, clock=clock)
        accounting.warm()  # as ``gpuportal serve`` does at start
        use_accounting(app, accounting)
        warm_up()  # as the dashboards service does at start (``dashboards.app.serve``)
        with serving(app) as url:
            timings = server_side(url, args.repeat)
            if args.browser:
                change = LiveChange(alloc, clock, url)
                browser_side(url, args.repeat, timings, change)
        store.close()
    text = report(args, running, rollups, seed_s, timings)
    print(text, flush=True)
    print(f"\n{platform.platform()}, Python {platform.python_version()}")
    return text


if __name__ == "__main__":
    main()
