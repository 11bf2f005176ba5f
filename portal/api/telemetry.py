"""``/api/v1/telemetry``: node agents send GPU samples; dashboards read series.

``POST /telemetry/samples`` needs ``telemetry:write`` unfiltered (an agent reports every
workload on its node). ``GET /telemetry/series`` needs ``usage:read``: unfiltered it shows any
device or workload; filtered to tenants it shows their workloads, and a device's figures only
for the intervals one of their workloads held that device (a MIG instance: the instance itself;
a shared GPU: the GPU's totals while they held a share), never before or after
(``portal.telemetry.access``). ``GET /telemetry/devices`` (every device's latest minute) is
scoped like device series.

The routes use ``app.state.telemetry`` (a ``portal.telemetry.service.Telemetry``; set it with
``use_telemetry``); without one they build one over the allocator's database on first use.
"""

from __future__ import annotations

import threading
import time
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from policies.errors import Forbidden, InvalidRequest
from portal.allocator import Allocator
from portal.api.auth import Caller, Scope
from portal.api.deps import allocator, listed_tenants, requires
from portal.api.errors import ERROR_RESPONSES
from portal.api.inputs import KEY, TEXT, Label, bounded
from portal.api.schemas import ErrorBody
from portal.telemetry.access import DeviceAccess, device_access
from portal.telemetry.reads import (
    MAX_POINTS,
    STEP_S,
    Point,
    Resolution,
    latest_minutes,
    series,
)
from portal.telemetry.service import Telemetry
from portal.telemetry.store import MINUTE_S
from portal.telemetry.wire import MAX_EPOCH_S, IngestResult, SampleBatch

router = APIRouter(prefix="/telemetry", tags=["telemetry"], responses=ERROR_RESPONSES)

MAX_RANGE_S = 400 * 86_400
MAX_WORKLOADS = 200
LATEST_WINDOW_S = 300  # /devices: "now" is the latest minute rolled up in the last five
MAX_LATEST_WINDOW_S = 3600
_lock = threading.Lock()


def use_telemetry(app: FastAPI, telemetry: Telemetry) -> None:
    """Serve the telemetry routes from ``telemetry`` (its clock, retention, attribution)."""
    app.state.telemetry = telemetry


def telemetry_of(request: Request, alloc: Annotated[Allocator, Depends(allocator)]) -> Telemetry:
    with _lock:
        t: Telemetry | None = getattr(request.app.state, "telemetry", None)
        if t is None:
            t = Telemetry(alloc)
            request.app.state.telemetry = t
        return t


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PointOut(_Model):
    at: float = Field(description="Sample time, or the start of the bucket (epoch s).")
    samples: int = Field(ge=0, description="Raw samples this point summarizes.")
    utilization_avg: float | None = Field(
        description="GPU utilization %: of the device for a device series; of the allocation "
        "for a workload (a share: its processes' part of the GPU over milli / 1000, at most "
        "100); null: not measured."
    )
    utilization_min: float | None
    utilization_max: float | None
    memory_used_avg: float = Field(description="MiB, per device.")
    memory_used_max: float
    activity_avg: float | None = Field(
        default=None, description="SM/engine activity %; null: not measured or a workload."
    )
    power_avg: float | None = None
    power_max: float | None = None
    temperature_max: float | None = None


class SeriesOut(_Model):
    device: str | None = Field(description="The device, for a device series; else null.")
    workload_id: str | None = Field(description="The workload, for a workload series.")
    points: list[PointOut] = Field(description="Oldest first.")


class SeriesPage(_Model):
    resolution: Resolution
    start: float = Field(description="Epoch s, inclusive.")
    end: float = Field(description="Epoch s, exclusive.")
    series: list[SeriesOut]


class DeviceMinuteOut(_Model):
    device: str = Field(description="A GPU UUID, or <GPU UUID>/gi<id> for a MIG instance.")
    gpu_uuid: str = Field(description="The physical GPU (the device itself for a whole GPU).")
    node: str = Field(description="The GPU's node; '' when the inventory no longer has it.")
    at: float = Field(description="Start of the minute (epoch s).")
    samples: int = Field(ge=0, description="Raw samples the minute summarizes.")
    utilization_avg: float | None = Field(
        description="GPU utilization % of the device (a MIG "
        "instance: of the instance), averaged over the minute's measured samples; null: not "
        "measured (a MIG instance on a GPU without GPU Performance Monitoring, A100 and A30)."
    )
    memory_used_avg: float = Field(description="MiB in use on the device, averaged.")


class DeviceMinutesOut(_Model):
    start: float = Field(description="Epoch s, inclusive.")
    end: float = Field(description="Epoch s, exclusive.")
    devices: list[DeviceMinuteOut] = Field(
        description="Devices with a rolled-up minute in the window, by device."
    )


@router.post(
    "/samples",
    response_model=IngestResult,
    summary="Send GPU samples of one node (agents, the Prometheus source)",
)
def post_samples(
    body: SampleBatch,
    caller: Annotated[Caller, requires(Scope.TELEMETRY_WRITE)],
    telemetry: Annotated[Telemetry, Depends(telemetry_of)],
) -> IngestResult:
    """A malformed batch is refused whole (422); unusable samples are rejected one by one
    (unknown GPU, wrong node, clock skew, past retention), listed with their reasons."""
    if not caller.can_everywhere(Scope.TELEMETRY_WRITE):
        raise Forbidden(
            f"{caller.kind} {caller.name} holds {Scope.TELEMETRY_WRITE} only for some tenants; "
            "an agent reports every workload on its node and needs it unfiltered"
        )
    return telemetry.ingest(body)


def _point(p: Point) -> PointOut:
    return PointOut(
        at=p.at,
        samples=p.samples,
        utilization_avg=p.utilization_avg,
        utilization_min=p.utilization_min,
        utilization_max=p.utilization_max,
        memory_used_avg=p.memory_used_avg,
        memory_used_max=p.memory_used_max,
        activity_avg=p.activity_avg,
        power_avg=p.power_avg,
        power_max=p.power_max,
        temperature_max=p.temperature_max,
    )


def _window(
    start: float | None, end: float | None, default_s: float, max_s: float
) -> tuple[float, float]:
    """``[start, end)`` in epoch s: ``end`` defaults to now, ``start`` to ``default_s``
    before it; a window that is empty or longer than ``max_s`` is a 422."""
    hi = end if end is not None else time.time()
    lo = start if start is not None else hi - default_s
    if not 0 < hi - lo <= max_s:
        raise InvalidRequest("time range", f"[{lo}, {hi})", f"end > start, at most {max_s} s")
    return lo, hi


def _device_points(
    telemetry: Telemetry,
    access: DeviceAccess | None,
    device: str,
    resolution: Resolution,
    lo: float,
    hi: float,
    limit: int,
) -> list[Point]:
    """A device's points in ``[lo, hi)``; with ``access`` (a filtered caller), only those of
    the intervals its tenants held the device."""
    engine = telemetry.store.engine
    if access is None:
        return series(engine, resolution=resolution, start=lo, end=hi, device=device, limit=limit)
    span = access.span(device, lo, hi)
    if span is None:
        return []
    step = STEP_S.get(resolution)
    # From the bucket the first holding starts in: a roll-up point is its bucket's start.
    first = span[0] if step is None else max(lo, span[0] - span[0] % step)
    points = series(
        engine, resolution=resolution, start=first, end=span[1], device=device, limit=limit
    )
    if step is None:
        return [p for p in points if access.point(device, p.at)]
    return [p for p in points if access.bucket(device, p.at, p.at + step)]


@router.get(
    "/series",
    response_model=SeriesPage,
    responses={404: {"model": ErrorBody, "description": "no such workload or tenant"}},
    summary="Utilization series",
)
def get_series(
    caller: Annotated[Caller, requires(Scope.USAGE_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    telemetry: Annotated[Telemetry, Depends(telemetry_of)],
    device: Annotated[
        Annotated[str, bounded(KEY, 128)] | None,
        Query(description="A GPU UUID, or <GPU UUID>/gi<id> for MIG."),
    ] = None,
    workload_id: Annotated[
        Annotated[str, bounded(KEY, 64)] | None, Query(description="A workload.")
    ] = None,
    resolution: Annotated[Resolution, Query(description="raw, 1m or 1h.")] = Resolution.MINUTE,
    start: Annotated[
        float | None,
        Query(ge=0, lt=MAX_EPOCH_S, description="Epoch s; default: an hour before end."),
    ] = None,
    end: Annotated[
        float | None,
        Query(gt=0, lt=MAX_EPOCH_S, description="Epoch s (before the year 2286); default: now."),
    ] = None,
    limit: Annotated[
        int, Query(ge=1, le=MAX_POINTS, description="Most points per series.")
    ] = MAX_POINTS,
    tenant: Annotated[
        Label | None,
        Query(description="Without device and workload_id: only this tenant's."),
    ] = None,
    owner: Annotated[
        Annotated[str, bounded(TEXT, 255)] | None,
        Query(description="Without device and workload_id: only this user's."),
    ] = None,
) -> SeriesPage:
    """One device, one workload, or (neither given) every live workload the caller may see,
    at most 200: ``tenant`` and ``owner`` narrow that list to the workloads a view shows."""
    lo, hi = _window(start, end, 3600, MAX_RANGE_S)
    everywhere = caller.can_everywhere(Scope.USAGE_READ)
    tenants = caller.tenants_for(Scope.USAGE_READ)
    engine = telemetry.store.engine
    access: DeviceAccess | None = None
    targets: list[str]
    if device is not None and workload_id is not None:
        raise InvalidRequest("series", "device and workload_id", "one of them, or neither")
    narrowed = tenant is not None or owner is not None
    if narrowed and (device is not None or workload_id is not None):
        raise InvalidRequest(
            "series",
            "tenant or owner with device or workload_id",
            "tenant and owner only with neither (they narrow the list of live workloads)",
        )
    if device is not None:
        if not everywhere:
            access = device_access(alloc.store, telemetry.index().gpus, tenants, lo, hi)
            if access.span(device, lo, hi) is None:
                raise Forbidden(
                    f"device {device} is not held by a workload of your tenants "
                    f"({', '.join(sorted(tenants))}) in [{lo}, {hi})"
                )
        return SeriesPage(
            resolution=resolution,
            start=lo,
            end=hi,
            series=[
                SeriesOut(
                    device=device,
                    workload_id=None,
                    points=[
                        _point(p)
                        for p in _device_points(
                            telemetry, access, device, resolution, lo, hi, limit
                        )
                    ],
                )
            ],
        )
    if workload_id is not None:
        caller.require(Scope.USAGE_READ, alloc.status(workload_id).tenant)
        targets = [workload_id]
    else:
        visible = listed_tenants(caller, Scope.USAGE_READ, tenant, alloc)
        shown = [
            w.id
            for w in alloc.workloads()
            if w.allocations
            and (visible is None or w.tenant in visible)
            and (owner is None or w.owner == owner)
        ]
        targets = shown[:MAX_WORKLOADS]
    out = [
        SeriesOut(
            device=None,
            workload_id=w,
            points=[
                _point(p)
                for p in series(
                    engine, resolution=resolution, start=lo, end=hi, workload_id=w, limit=limit
                )
            ],
        )
        for w in targets
    ]
    return SeriesPage(resolution=resolution, start=lo, end=hi, series=out)


@router.get(
    "/devices",
    response_model=DeviceMinutesOut,
    summary="Every device's latest minute",
    description=(
        "For each device (whole GPU or MIG instance) with a rolled-up minute starting in "
        "[start, end): its node and that latest minute's utilization and memory, in one "
        "answer for the whole platform (a heatmap of every GPU). Unfiltered `usage:read` "
        "shows every device; filtered to tenants, a device's minute only when their "
        "workloads held the device in it (a MIG instance: the instance itself)."
    ),
)
def get_devices(
    caller: Annotated[Caller, requires(Scope.USAGE_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    telemetry: Annotated[Telemetry, Depends(telemetry_of)],
    start: Annotated[
        float | None,
        Query(ge=0, lt=MAX_EPOCH_S, description="Epoch s; default: five minutes before end."),
    ] = None,
    end: Annotated[
        float | None,
        Query(gt=0, lt=MAX_EPOCH_S, description="Epoch s (before the year 2286); default: now."),
    ] = None,
) -> DeviceMinutesOut:
    lo, hi = _window(start, end, LATEST_WINDOW_S, MAX_LATEST_WINDOW_S)
    index = telemetry.index()
    everywhere = caller.can_everywhere(Scope.USAGE_READ)
    tenants = caller.tenants_for(Scope.USAGE_READ)

    # A minute starting in [lo, hi) covers [at, at + 60): holdings up to hi + 60 count.
    access = (
        None if everywhere else device_access(alloc.store, index.gpus, tenants, lo, hi + MINUTE_S)
    )
    out = []
    for m in latest_minutes(telemetry.store.engine, lo, hi):
        if access is not None and not access.bucket(m.device, m.at, m.at + MINUTE_S):
            continue
        gpu = m.device.split("/", 1)[0]
        info = index.gpus.get(gpu)
        out.append(
            DeviceMinuteOut(
                device=m.device,
                gpu_uuid=gpu,
                node=info.node if info else "",
                at=m.at,
                samples=m.samples,
                utilization_avg=m.utilization_avg,
                memory_used_avg=m.memory_used_avg,
            )
        )
    return DeviceMinutesOut(start=lo, end=hi, devices=out)
