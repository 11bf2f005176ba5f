"""Utilization for cost accounting from the telemetry roll-ups.

Telemetry keeps, per workload, the average utilization of every closed minute and hour
(``portal.telemetry``; ``telemetry_workload_rollups``). Each bucket becomes a segment of each of
the workload's allocations, clipped to when that allocation was held: a workload that ran
two gang members shows the same measured utilization on both.

Minutes are used for windows up to ``MAX_MINUTE_WINDOW_S`` (a series answers at most
``portal.telemetry.reads.MAX_POINTS`` points), hours beyond. Buckets not rolled up yet, and
buckets whose samples carried no utilization (a share without per-process figures), are
unmeasured: they count as allocated, unused and not idle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from sqlalchemy import Engine

from policies.pricing import UsageInterval, UtilizationSegment
from portal.telemetry.reads import MAX_POINTS, STEP_S, Resolution, series

MAX_MINUTE_WINDOW_S = 6 * 86_400
"""Longest window read at minute resolution (8640 points per workload, under MAX_POINTS)."""


class TelemetryUtilization:
    """A ``UtilizationSource`` over the telemetry tables of ``engine`` (the portal's database)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __call__(
        self, intervals: Sequence[UsageInterval], start: int, end: int
    ) -> Iterable[UtilizationSegment]:
        by_workload: dict[str, list[UsageInterval]] = defaultdict(list)
        for iv in intervals:
            if iv.end > iv.start:
                by_workload[iv.workload_id].append(iv)
        out: list[UtilizationSegment] = []
        for wid, ivs in sorted(by_workload.items()):
            lo = max(start, min(iv.start for iv in ivs))
            hi = min(end, max(iv.end for iv in ivs))
            if hi <= lo:
                continue
            resolution = Resolution.MINUTE if hi - lo <= MAX_MINUTE_WINDOW_S else Resolution.HOUR
            step = STEP_S[resolution]
            # A bucket starting before ``lo`` still covers part of the window.
            first = lo - lo % step
            points = series(
                self._engine,
                resolution=resolution,
                start=first,
                end=hi,
                workload_id=wid,
                limit=MAX_POINTS,
            )
            for p in points:
                if p.utilization_avg is None:
                    continue
                b_lo, b_hi = round(p.at), round(p.at) + step
                for iv in ivs:
                    s, e = max(b_lo, iv.start, start), min(b_hi, iv.end, end)
                    if e > s:
                        util = min(100.0, max(0.0, p.utilization_avg))
                        out.append(UtilizationSegment(iv.allocation_id, s, e, util))
        return out
