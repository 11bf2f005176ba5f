"""Reading telemetry back: series for the API and dashboards, windows for the alert service.

A series is per device or per workload at one resolution (``raw``, ``1m``, ``1h``). Raw points
of a workload aggregate its devices at each sample time; roll-up points are the stored
roll-ups. A device's utilization is of the device; a workload's is of its allocation (a
500-milli share using 30 % of its GPU is at 60 %). Every point has ``samples`` (how many raw
samples it summarizes), so an average can always be traced back and re-weighted.
Utilization is ``None`` where no sample of the point or window measured it (a MIG instance on a
GPU without GPU Performance Monitoring): "not measured", never 0 %.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, Engine, func, literal, select

from policies.errors import InvalidRequest
from portal.telemetry.store import (
    HOUR_S,
    MINUTE_S,
    between,
    of_allocation,
    workload_aggregates,
)
from portal.telemetry.tables import ROLLUPS, SAMPLES, WORKLOAD_ROLLUPS, WORKLOAD_SAMPLES

MAX_POINTS = 10_000


class Resolution(StrEnum):
    RAW = "raw"
    MINUTE = "1m"
    HOUR = "1h"


STEP_S = {Resolution.MINUTE: MINUTE_S, Resolution.HOUR: HOUR_S}


@dataclass(frozen=True, slots=True)
class Point:
    """One point of a series; ``at`` is the sample time, or the start of the bucket."""

    at: float
    samples: int
    utilization_avg: float | None
    utilization_min: float | None
    utilization_max: float | None
    memory_used_avg: float
    memory_used_max: float
    activity_avg: float | None = None
    power_avg: float | None = None
    power_max: float | None = None
    temperature_max: float | None = None


@dataclass(frozen=True, slots=True)
class DeviceWindow:
    """One device over an evaluation window: averages, peaks, the last counters, and the
    thermal/power throttle bits seen (OR of the bits in ``throttle_mask``)."""

    device: str
    gpu_uuid: str
    node: str
    samples: int
    last_at: float
    utilization_avg: float | None
    activity_avg: float | None
    memory_used_max: float
    memory_total_mib: float
    power_max: float | None
    temperature_max: float | None
    throttle_reasons: int
    xid_count: int
    ecc_uncorrectable: int
    last_xid: int | None = None  # the code of the window's latest XID error, if any reported


@dataclass(frozen=True, slots=True)
class WorkloadWindow:
    """One workload on one device over an evaluation window."""

    workload_id: str
    device: str
    samples: int
    utilization_avg: float | None
    memory_used_max: float


def _check_range(start: float, end: float) -> None:
    if not end > start:
        raise InvalidRequest("time range", f"[{start}, {end})", "end > start")


def series(
    engine: Engine,
    *,
    resolution: Resolution,
    start: float,
    end: float,
    device: str | None = None,
    workload_id: str | None = None,
    limit: int = MAX_POINTS,
) -> list[Point]:
    """Points of one device or one workload with ``start <= at < end``, oldest first."""
    _check_range(start, end)
    if (device is None) == (workload_id is None):
        raise InvalidRequest("series", "device and workload", "exactly one of them")
    lo, hi = round(start * 1000), round(end * 1000)
    stmt: Any
    if resolution is Resolution.RAW and device is not None:
        s = SAMPLES
        stmt = (
            select(
                s.c.at_ms,
                literal(1),  # (device, at_ms) is the key: one sample per point
                s.c.utilization_pct,
                s.c.utilization_pct,
                s.c.utilization_pct,
                s.c.memory_used_mib,
                s.c.memory_used_mib,
                s.c.activity_pct,
                s.c.power_w,
                s.c.power_w,
                s.c.temperature_c,
            )
            .where(s.c.device == device, between(s.c.at_ms, lo, hi))
            .order_by(s.c.at_ms)
        )
    elif resolution is Resolution.RAW:
        w = WORKLOAD_SAMPLES
        stmt = (
            select(
                w.c.at_ms,
                *workload_aggregates(),
            )
            .where(w.c.workload_id == workload_id, between(w.c.at_ms, lo, hi))
            .group_by(w.c.at_ms)
            .order_by(w.c.at_ms)
        )
    elif device is not None:
        r = ROLLUPS
        stmt = (
            select(
                r.c.bucket_ms,
                r.c.samples,
                r.c.utilization_avg,
                r.c.utilization_min,
                r.c.utilization_max,
                r.c.memory_used_avg,
                r.c.memory_used_max,
                r.c.activity_avg,
                r.c.power_avg,
                r.c.power_max,
                r.c.temperature_max,
            )
            .where(
                r.c.step_s == STEP_S[resolution],
                r.c.device == device,
                between(r.c.bucket_ms, lo, hi),
            )
            .order_by(r.c.bucket_ms)
        )
    else:
        q = WORKLOAD_ROLLUPS
        stmt = (
            select(
                q.c.bucket_ms,
                q.c.samples,
                q.c.utilization_avg,
                q.c.utilization_min,
                q.c.utilization_max,
                q.c.memory_used_avg,
                q.c.memory_used_max,
            )
            .where(
                q.c.step_s == STEP_S[resolution],
                q.c.workload_id == workload_id,
                between(q.c.bucket_ms, lo, hi),
            )
            .order_by(q.c.bucket_ms)
        )
    with engine.connect() as conn:
        rows = conn.execute(stmt.limit(limit)).all()
    return [Point(r[0] / 1000, *r[1:]) for r in rows]


def device_windows(
    engine: Engine, start: float, end: float, throttle_mask: int
) -> list[DeviceWindow]:
    """Every device sampled in ``[start, end)``, aggregated over that window."""
    _check_range(start, end)
    s = SAMPLES
    lo, hi = round(start * 1000), round(end * 1000)
    # OR of the mask's bits over the window: the max of each bit is the bit if any sample had it.
    bits = [1 << i for i in range(throttle_mask.bit_length()) if throttle_mask >> i & 1]
    throttle: ColumnElement[Any] = literal(0)
    for b in bits:
        throttle = throttle + func.max(s.c.throttle_reasons.op("&")(b))
    stmt = (
        select(
            s.c.device,
            func.max(s.c.gpu_uuid),
            func.max(s.c.node),
            func.count(),
            func.max(s.c.at_ms),
            func.avg(s.c.utilization_pct),
            func.avg(s.c.activity_pct),
            func.max(s.c.memory_used_mib),
            func.max(s.c.memory_total_mib),
            func.max(s.c.power_w),
            func.max(s.c.temperature_c),
            throttle,
            func.max(s.c.xid_count),
            func.max(s.c.ecc_uncorrectable),
        )
        .where(between(s.c.at_ms, lo, hi))
        .group_by(s.c.device)
        .order_by(s.c.device)
    )
    # The latest XID code per device: only samples that carry one (rare) are read.
    xids = (
        select(s.c.device, s.c.last_xid)
        .where(between(s.c.at_ms, lo, hi), s.c.last_xid.is_not(None))
        .order_by(s.c.device, s.c.at_ms)
    )
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
        last_xid = {r[0]: int(r[1]) for r in conn.execute(xids)}
    return [
        DeviceWindow(
            device=r[0],
            gpu_uuid=r[1],
            node=r[2],
            samples=r[3],
            last_at=r[4] / 1000,
            utilization_avg=None if r[5] is None else float(r[5]),
            activity_avg=None if r[6] is None else float(r[6]),
            memory_used_max=float(r[7]),
            memory_total_mib=float(r[8]),
            power_max=r[9],
            temperature_max=r[10],
            throttle_reasons=int(r[11] or 0),
            xid_count=int(r[12]),
            ecc_uncorrectable=int(r[13]),
            last_xid=last_xid.get(r[0]),
        )
        for r in rows
    ]


def workload_windows(engine: Engine, start: float, end: float) -> list[WorkloadWindow]:
    """Every (workload, device) sampled in ``[start, end)``, aggregated over that window."""
    _check_range(start, end)
    w = WORKLOAD_SAMPLES
    lo, hi = round(start * 1000), round(end * 1000)
    stmt = (
        select(
            w.c.workload_id,
            w.c.device,
            func.count(),
            func.avg(w.c.utilization_pct),
            func.max(w.c.memory_used_mib),
        )
        .where(between(w.c.at_ms, lo, hi))
        .group_by(w.c.workload_id, w.c.device)
        .order_by(w.c.workload_id, w.c.device)
    )
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    return [
        WorkloadWindow(r[0], r[1], r[2], None if r[3] is None else float(r[3]), float(r[4]))
        for r in rows
    ]


@dataclass(frozen=True, slots=True)
class DeviceMinute:
    """A device's latest rolled-up minute."""

    device: str
    at: float
    samples: int
    utilization_avg: float | None
    memory_used_avg: float


def latest_minutes(engine: Engine, start: float, end: float) -> list[DeviceMinute]:
    """Every device's latest 1-minute roll-up that starts in ``[start, end)``, by device: one
    query for the whole platform (a heatmap of 10,000 GPUs reads no series)."""
    _check_range(start, end)
    r = ROLLUPS
    lo, hi = round(start * 1000), round(end * 1000)
    last = (
        select(r.c.device, func.max(r.c.bucket_ms).label("bucket_ms"))
        .where(r.c.step_s == MINUTE_S, between(r.c.bucket_ms, lo, hi))
        .group_by(r.c.device)
        .subquery()
    )
    stmt = (
        select(r.c.device, r.c.bucket_ms, r.c.samples, r.c.utilization_avg, r.c.memory_used_avg)
        .join(
            last,
            (r.c.device == last.c.device) & (r.c.bucket_ms == last.c.bucket_ms),
        )
        .where(r.c.step_s == MINUTE_S)
        .order_by(r.c.device)
    )
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    return [
        DeviceMinute(r[0], r[1] / 1000, r[2], None if r[3] is None else float(r[3]), float(r[4]))
        for r in rows
    ]


def workload_utilization(
    engine: Engine, workload_ids: Sequence[str], start: float
) -> list[tuple[float, float]]:
    """``(at, fraction)``: each listed workload's utilization of its allocation at each raw
    sample time since ``start`` (averaged over its devices), oldest first. Samples that did
    not measure utilization are left out: no evidence, not idle."""
    if not workload_ids:
        return []
    w = WORKLOAD_SAMPLES
    share = func.avg(of_allocation())
    stmt = (
        select(w.c.at_ms, share)
        .where(w.c.workload_id.in_(list(workload_ids)), w.c.at_ms >= round(start * 1000))
        .group_by(w.c.workload_id, w.c.at_ms)
        .having(share.is_not(None))
        .order_by(w.c.at_ms)
    )
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    return [(r[0] / 1000, float(r[1]) / 100.0) for r in rows]
