"""``/api/v1/forecast``: demand forecasts from the workload history (``docs/forecast.md``).

The capacity outlook covers every tenant's demand at once, so it is for callers who may read
cost everywhere (leadership, platform admins): ``cost:read`` without a group filter, or admin.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from policies.errors import Forbidden
from policies.forecast import Method
from portal.accounting.service import Accounting
from portal.allocator import Allocator
from portal.api.auth import Caller, Scope
from portal.api.cost import accounting_of
from portal.api.deps import allocator, requires
from portal.api.errors import ERROR_RESPONSES
from portal.forecast.capacity import MAX_HISTORY_DAYS, MAX_WEEKS, FlavorOutlook, capacity_outlook

router = APIRouter(prefix="/forecast", tags=["forecast"], responses=ERROR_RESPONSES)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WeekForecastOut(_Model):
    start: datetime = Field(description="Start of the forecast week (UTC).")
    gpu_hours: float = Field(ge=0, description="Forecast GPU-equivalent-hours held in the week.")
    peak_gpus: float = Field(
        ge=0, description="The week's highest hourly forecast: GPU-equivalents held at once."
    )
    arrivals: float = Field(ge=0, description="Forecast workloads arriving in the week.")


class FlavorForecastOut(_Model):
    flavor: str
    capacity_gpus: float = Field(ge=0, description="The flavor's capacity in GPU-equivalents.")
    guaranteed_gpus: float = Field(
        ge=0, description="Every tenant's guaranteed quota of the flavor, in GPU-equivalents."
    )
    method: Method = Field(description="How the demand was forecast.")
    season_hours: int | None = Field(
        description="The forecast's season (168: weekly, 24: daily); null without one."
    )
    weeks: list[WeekForecastOut]


class CapacityForecastOut(_Model):
    history_start: datetime = Field(description="Start of the history learnt from (UTC).")
    forecast_start: datetime = Field(
        description="The current hour (UTC): history ends and the forecast starts here."
    )
    flavors: list[FlavorForecastOut]


def _flavor(f: FlavorOutlook) -> FlavorForecastOut:
    return FlavorForecastOut(
        flavor=f.flavor,
        capacity_gpus=f.capacity_gpus,
        guaranteed_gpus=f.guaranteed_gpus,
        method=f.method,
        season_hours=f.season_hours,
        weeks=[
            WeekForecastOut(
                start=w.start, gpu_hours=w.gpu_hours, peak_gpus=w.peak_gpus, arrivals=w.arrivals
            )
            for w in f.weeks
        ],
    )


@router.get(
    "/capacity",
    response_model=CapacityForecastOut,
    summary="Forecast demand per flavor for the next weeks against capacity and guarantees",
)
def capacity_forecast(
    caller: Annotated[Caller, requires(Scope.COST_READ)],
    acc: Annotated[Accounting, Depends(accounting_of)],
    alloc: Annotated[Allocator, Depends(allocator)],
    weeks: Annotated[int, Query(ge=1, le=MAX_WEEKS, description="Weeks to forecast.")] = 4,
    history_days: Annotated[
        int, Query(ge=1, le=MAX_HISTORY_DAYS, description="Days of history to learn from.")
    ] = 28,
) -> CapacityForecastOut:
    if not caller.can_everywhere(Scope.COST_READ):
        raise Forbidden(
            f"{caller.kind} {caller.name} may not read the capacity forecast: it covers every "
            f"tenant, so it needs {Scope.COST_READ} without a group filter (leadership, "
            "platform admins)"
        )
    outlook = capacity_outlook(
        alloc.store,
        alloc.capacity,
        alloc.quotas(),
        acc.clock(),
        weeks=weeks,
        history_days=history_days,
    )
    return CapacityForecastOut(
        history_start=outlook.history_start,
        forecast_start=outlook.forecast_start,
        flavors=[_flavor(f) for f in outlook.flavors],
    )
