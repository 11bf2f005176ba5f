"""Utilization for cost accounting from the telemetry roll-ups.

Telemetry keeps, per workload, the average utilization of every closed minute and hour
(``portal.telemetry``; ``telemetry_workload_rollups``). Each bucket becomes a segment of each of
the workload's allocations, clipped to when that allocation was held: a workload that ran
two gang members shows the same measured utilization on both.

Minutes are used for report windows up to ``MAX_MINUTE_WINDOW_S``, hours beyond (a month of
minutes would be 43,200 segments per workload to price): one resolution for every workload of
a window, so that closed days priced once at the window's resolution add up to the window
(``portal.accounting.closed_days``). The roll-ups are read for many workloads per query.
Buckets not rolled up yet, and buckets whose samples carried no utilization (a share without
per-process figures), are unmeasured: they count as allocated, unused and not idle.

Measurements of a time settle once samples of it are no longer accepted (the raw retention:
``portal.telemetry.store.Retention.raw_s``) and the last accepted ones are rolled up (one
maintenance round later).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence

from sqlalchemy import Engine, func, select

from policies.errors import InvalidRequest
from policies.pricing import UsageInterval, UtilizationSegment
from portal.telemetry.reads import STEP_S, Resolution
from portal.telemetry.store import HOUR_S, Retention
from portal.telemetry.tables import REVISIONS, WORKLOAD_ROLLUPS

MAX_MINUTE_WINDOW_S = 6 * 86_400
"""Longest report window read at minute resolution (8640 buckets per workload)."""
ROLL_UP_EVERY_S = 30.0
"""The telemetry maintenance loop's default period (``AlertingSettings.telemetry_interval_s``)."""
IDS_PER_READ = 500
"""Workloads per roll-up query (bound parameters stay well under the databases' limits)."""


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

    def version(self, start: int, end: int, resolution_s: int) -> object:
        """The sum of the telemetry revisions (``telemetry_revisions``) of the hours overlapping
        ``[start, end)`` at ``resolution_s``.

        The telemetry store bumps an hour's revision in the same transaction as every write or
        delete of its roll-ups and never deletes revision rows, so the sum grows whenever the
        roll-ups of the range may have changed; reading it touches a row per hour, not the
        roll-ups."""
        v = REVISIONS.c
        lo = start - start % HOUR_S
        stmt = select(func.coalesce(func.sum(v.revision), 0)).where(
            v.step_s == resolution_s, v.hour_ms >= lo * 1000, v.hour_ms < end * 1000
        )
        with self._engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())

    def __call__(
        self, intervals: Sequence[UsageInterval], start: int, end: int, resolution_s: int
    ) -> Iterable[UtilizationSegment]:
        if resolution_s not in STEP_S.values():
            raise InvalidRequest(
                "utilization resolution", resolution_s, f"one of {sorted(STEP_S.values())} seconds"
            )
        by_workload: dict[str, list[UsageInterval]] = defaultdict(list)
        for iv in intervals:
            if iv.end > iv.start and iv.start < end and iv.end > start:
                by_workload[iv.workload_id].append(iv)
        if not by_workload:
            return []
        # A bucket starting before the first interval still covers part of it.
        lo = max(start, min(iv.start for ivs in by_workload.values() for iv in ivs))
        first = lo - lo % resolution_s
        out: list[UtilizationSegment] = []
        buckets = self._buckets(resolution_s, sorted(by_workload), first, end)
        for wid, b_lo, utilization in buckets:
            b_hi = b_lo + resolution_s
            util = min(100.0, max(0.0, utilization))
            for iv in by_workload[wid]:
                s, e = max(b_lo, iv.start, start), min(b_hi, iv.end, end)
                if e > s:
                    out.append(UtilizationSegment(iv.allocation_id, s, e, util))
        return out

    def _buckets(
        self, step_s: int, workload_ids: Sequence[str], start: int, end: int
    ) -> Iterator[tuple[str, int, float]]:
        """(workload, bucket start, utilization) of the measured roll-up buckets of
        ``workload_ids`` starting in ``[start, end)``: one query per ``IDS_PER_READ``
        workloads, not one per workload."""
        r = WORKLOAD_ROLLUPS.c
        with self._engine.connect() as conn:
            for i in range(0, len(workload_ids), IDS_PER_READ):
                stmt = select(r.workload_id, r.bucket_ms, r.utilization_avg).where(
                    r.step_s == step_s,
                    r.workload_id.in_(workload_ids[i : i + IDS_PER_READ]),
                    r.bucket_ms >= start * 1000,
                    r.bucket_ms < end * 1000,
                    r.utilization_avg.is_not(None),
                )
                for wid, bucket_ms, utilization in conn.execute(stmt):
                    yield wid, bucket_ms // 1000, float(utilization)
