"""Smoke test of ``python -m benchmarks.inference``: a tiny configuration (both traces, every
strategy, one short load time) against a real ``gpuportal serve`` with real test-engine
replicas. It checks the report's invariants — every request accounted for, no quota
violation on any sample, the strategies' own signatures — never a timing (those are in
``benchmarks/results/inference.md``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from benchmarks.inference import breakdown, run
from benchmarks.inference.strategies import Bounds, Forecast
from benchmarks.inference.traces import TraceKind, bursty, diurnal

pytestmark = pytest.mark.slow


def test_traces_are_seeded_and_quiet_long_enough_to_scale_to_zero() -> None:
    a, b = bursty(7, 300, 4, 15, 60), bursty(7, 300, 4, 15, 60)
    assert a == b and a.arrivals and a.arrivals != bursty(8, 300, 4, 15, 60).arrivals
    gaps = [y - x for x, y in zip(a.arrivals, a.arrivals[1:], strict=False)]
    assert max(gaps) > 30  # the off periods: longer than the default idle time
    day = diurnal(7, 360, 180, 4)
    assert day.kind is TraceKind.DIURNAL and all(0 <= t < 360 for t in day.arrivals)
    # Nothing between 18:00 and 06:00 of each compressed day.
    assert not [t for t in day.arrivals if (t % 180) < 45 or (t % 180) > 135]
    assert day.seen_by(100) == tuple(t for t in day.arrivals if t <= 100)


def test_a_tiny_run_accounts_for_every_request_and_never_exceeds_a_quota(tmp_path: Path) -> None:
    out = tmp_path / "inference.json"
    argv = ["--quick", "--load-seconds", "0.2", "--duration", "8", "--overhead-seconds", "0.5",
            "--overhead-rate", "40", "--json", str(out)]  # fmt: skip
    assert run.main(argv) == 0
    result = json.loads(out.read_text())
    cells = result["cells"]
    names = ("reactive", "warm-pool", "fixed-min", "forecast")
    assert {(c["trace"], c["strategy"]) for c in cells} == {
        (t, s) for t in ("bursty", "diurnal") for s in names
    }
    assert result["quota_samples"] > 0 and result["quota_violations"] == 0
    for c in cells:
        assert c["quota_violations"] == 0 and c["most_gpus_used"] <= c["quota_limit"], c
        assert c["requests"] > 0
        # Every request answered or counted as an error; the gateway saw each held one once.
        assert c["answered"] + sum(c["errors"].values()) == c["requests"], c
        # Nothing is refused for the hold's bounds (100 held, 600 s); a reply cut by a
        # scale-down would be an error, counted, not lost.
        assert c["gateway_refused"] == 0 and c["answered"] > 0, c
        assert 0 <= c["cold"] <= c["requests"] and c["gateway_served"] <= c["requests"], c
        assert c["ttft_p50_s"] <= c["ttft_p99_s"], c
    by = {(c["trace"], c["strategy"]): c for c in cells}
    for t in ("bursty", "diurnal"):
        # A service kept at one replica never holds a request; one at zero holds the first.
        assert by[(t, "fixed-min")]["cold"] == 0
        assert by[(t, "reactive")]["cold"] >= 1
        # Only the warm pool is charged warm GPU time.
        assert by[(t, "warm-pool")]["gpu_s_warm"] > 0
        assert by[(t, "reactive")]["gpu_s_warm"] == by[(t, "fixed-min")]["gpu_s_warm"] == 0
        # The forecast planner ran every step, and is compared with reactive.
        assert sum(by[(t, "forecast")]["plan_reasons"].values()) > 0
    assert {(v["trace"], v["load_s"]) for v in result["forecast_vs_reactive"]} == {
        ("bursty", 0.2),
        ("diurnal", 0.2),
    }
    for g in result["gateway_overhead"]:
        assert g["direct_errors"] == g["gateway_errors"] == 0, g
        assert g["direct_requests"] == g["gateway_requests"] > 0, g


class Recorder:
    """STAND-IN for the portal's API as a strategy sees it: the bounds set, and a serving
    count given by the test."""

    def __init__(self, serving: int) -> None:
        self.set: list[Bounds] = []
        self._serving = serving

    async def set_bounds(self, bounds: Bounds) -> None:
        self.set.append(bounds)

    async def serving(self) -> int:
        return self._serving


def test_the_forecast_strategy_warms_ahead_of_the_morning_from_a_week_of_history() -> None:
    day_s, load_s = 240.0, 20.0
    cfg = run.Config(day_s=day_s, duration_s=2 * day_s, history_days=7)
    trace = run.make_trace(TraceKind.DIURNAL, cfg)
    planner = run.strategy("forecast", trace, load_s, cfg)
    assert isinstance(planner, Forecast)
    # A bin is a simulated hour (10 s); the plan covers now to the 20 s load (and a 1 s step)
    # ahead: at 03:00 the bins to 05:00, at 05:30 those to 07:00.
    assert (planner.bin_s, planner.lead_s) == (10.0, 21.0)
    assert planner.bounds(2) == Bounds(0, 2, 0)  # deployed as reactive, with its quota
    night, dawn = Recorder(serving=0), Recorder(serving=0)
    asyncio.run(planner.step(night, 30.0, trace.seen_by(30.0)))  # 03:00: nothing ahead
    asyncio.run(planner.step(dawn, 0.23 * day_s, trace.seen_by(0.23 * day_s)))  # 05:30
    assert night.set == [] and dawn.set == [Bounds(0, 2, 1)], planner.reasons
    assert planner.reasons == {"forecast": 2}
    # Once a replica serves the morning, the pool is given back and the serving one kept
    # (``min``: as the portal's autoscaler keeps it), not stopped for the pool to reload.
    served = Recorder(serving=1)
    asyncio.run(planner.step(served, 0.3 * day_s, trace.seen_by(0.3 * day_s)))
    assert served.set == [Bounds(1, 2, 0)]
    # At night nothing is expected: the serving floor goes too.
    late = Recorder(serving=1)
    asyncio.run(planner.step(late, 0.9 * day_s, trace.seen_by(0.9 * day_s)))
    assert late.set == [Bounds(0, 2, 0)]


def test_the_breakdown_tells_a_cold_start_from_a_wake_and_names_its_cause() -> None:
    # (arrival s, TTFT s); the service's (s, desired, ready, asleep); the plan's (s, warm, why).
    requests = [(5.0, 18.0), (6.0, 0.1), (30.0, 3.0), (50.0, 12.0), (70.0, 15.0), (90.0, 9.0)]
    states = [(0.0, 0, 0, 0), (29.0, 1, 1, 0), (49.0, 0, 0, 0), (69.0, 0, 0, 1), (85.0, 0, 0, 0)]
    plans = [(0.0, 0, "high-error"), (20.0, 1, "forecast"), (45.0, 1, "forecast")]
    cold, why = breakdown.classify(requests, states, plans, load_s=20.0)
    assert cold == [5.0, 50.0, 90.0]  # a fast answer is no cold start; a slow one beside an
    assert why == {  # up replica (30 s, 70 s: one ready or asleep) is the machine's
        "untrusted": 1,  # 5 s: the plan fell back to the floor
        "refill after scale-down": 1,  # 50 s: a replica was ready at 29 s, the pool planned
        "planned too late": 1,  # 90 s: planned, none loaded and none ready for a load time
        breakdown.SLOW: 2,
    }
    assert breakdown.by_hour(cold, day_s=240.0) == {0: 1, 5: 1, 9: 1}
