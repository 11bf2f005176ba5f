"""Utilization for cost accounting from the telemetry roll-ups.

Telemetry keeps, per workload, the average utilization of every closed minute and hour
(``portal.telemetry``; ``telemetry_workload_rollups``). Each bucket becomes a segment of each of
the workload's allocations, clipped to when that allocation was held: a workload that ran
two gang members shows the same measured utilization on both.

Minutes are used for report windows up to ``MAX_MINUTE_WINDOW_S`` (a series answers at most
``portal.telemetry.reads.MAX_POINTS`` points), hours beyond: one resolution for every workload
of a window, so that closed days priced once at the window's resolution add up to the window
(``portal.accounting.closed_days``). Buckets not rolled up yet, and buckets whose samples
carried no utilization (a share without per-process figures), are unmeasured: they count as
allocated, unused and not idle.

Measurements of a time settle once samples of it are no longer accepted (the raw retention:
``portal.telemetry.store.Retention.raw_s``) and the last accepted ones are rolled up (one
maintenance round later).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from sqlalchemy import Engine

from policies.errors import InvalidRequest
from policies.pricing import UsageInterval, UtilizationSegment
from portal.telemetry.reads import MAX_POINTS, STEP_S, Resolution, series
from portal.telemetry.store import Retention

MAX_MINUTE_WINDOW_S = 6 * 86_400
"""Longest window read at minute resolution (8640 points per workload, under MAX_POINTS)."""
ROLL_UP_EVERY_S = 30.0
"""The telemetry maintenance loop's default period (``AlertingSettings.telemetry_interval_s``)."""
_BY_STEP = {step: resolution for resolution, step in STEP_S.items()}


class TelemetryUtilization:
    """A ``UtilizationSource`` over the telemetry tables of ``engine`` (the portal's database).

    Args:
        engine: the portal's database.
        raw_retention_s: how old a sample ingest still accepts (the telemetry service's).
        roll_up_every_s: how often the telemetry service rolls up.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        raw_retention_s: float = Retention().raw_s,
        roll_up_every_s: float = ROLL_UP_EVERY_S,
    ) -> None:
        self._engine = engine
        self.settle_s = raw_retention_s + roll_up_every_s

    def resolution_s(self, start: int, end: int) -> int:
        """Minutes for windows up to ``MAX_MINUTE_WINDOW_S``, hours beyond."""
        return STEP_S[Resolution.MINUTE if end - start <= MAX_MINUTE_WINDOW_S else Resolution.HOUR]

    def __call__(
        self, intervals: Sequence[UsageInterval], start: int, end: int, resolution_s: int
    ) -> Iterable[UtilizationSegment]:
        resolution = _BY_STEP.get(resolution_s)
        if resolution is None:
            raise InvalidRequest(
                "utilization resolution", resolution_s, f"one of {sorted(_BY_STEP)} seconds"
            )
        step = resolution_s
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
