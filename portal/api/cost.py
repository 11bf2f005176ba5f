"""``/api/v1/cost``: cost by tenant, owner, flavor and period; chargeback CSV; budgets.

Every route needs ``cost:read``; a caller holding it filtered (``!group=team-a``) sees only
those tenants, unfiltered (leadership, platform admins) sees every tenant, including tenants
deleted since their allocations ran. Money is a decimal string in whole cents, rounded half to
even from exact sums (``docs/cost.md``).

The routes price with ``app.state.accounting`` (a ``portal.accounting.Accounting``; set it with
``use_accounting``); without one they use the allocator's store with no prices, so GPU-hours
still show and every model is listed as unpriced.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from policies.errors import InvalidRequest
from policies.pricing import CostTotal, GroupBy, to_cents
from portal.accounting.metrics import CostCollector
from portal.accounting.prices import load_price_config
from portal.accounting.service import Accounting, BudgetStatus, Step, month_of
from portal.accounting.telemetry import TelemetryUtilization
from portal.alerting.wiring import AlertingSettings
from portal.allocator import Allocator
from portal.api.auth import Caller, Scope
from portal.api.deps import Paging, allocator, paging, requires, visible_tenants
from portal.api.errors import ERROR_RESPONSES
from portal.api.inputs import Label
from portal.api.metrics import ServiceMetrics
from portal.api.schemas import Page
from portal.inference import warm
from portal.settings import Settings
from portal.store import services as stored

router = APIRouter(prefix="/cost", tags=["cost"], responses=ERROR_RESPONSES)

EARLIEST, LATEST = datetime(1970, 1, 1, tzinfo=UTC), datetime(2999, 1, 1, tzinfo=UTC)
MONEY = r"^-?\d+\.\d{2}$"
"""Money in answers: a decimal string in whole cents."""


def use_accounting(app: FastAPI, accounting: Accounting) -> None:
    """Price the app's cost routes with ``accounting`` (prices, budgets, utilization, clock)."""
    app.state.accounting = accounting


def configure(app: FastAPI, settings: Settings) -> Accounting:
    """The service's accounting: prices from ``settings.pricing_file`` (none: unpriced),
    utilization from the telemetry roll-ups in the allocator's database (settling after the
    telemetry settings' raw retention and roll-up interval), and its month-to-date
    gauges in the app's ``/metrics`` (``portal.accounting.metrics``).

    Raises:
        InvalidRequest: the pricing file is unreadable or invalid (the service does not start).
    """
    alloc: Allocator = app.state.allocator
    prices = None
    if settings.pricing_file is not None:
        prices = load_price_config(settings.pricing_file.expanduser())
    # Closed days are priced once: when late samples stop being accepted and rolled up
    # depends on the telemetry service's settings.
    telemetry = AlertingSettings()
    utilization = TelemetryUtilization(
        alloc.store.engine,
        raw_retention_s=telemetry.telemetry_raw_retention_s,
        roll_up_every_s=telemetry.telemetry_interval_s,
    )
    accounting = Accounting(alloc.store, prices, utilization=utilization)
    use_accounting(app, accounting)
    metrics: ServiceMetrics | None = getattr(app.state, "metrics", None)
    if metrics is not None:
        metrics.registry.register(CostCollector(accounting, alloc.quotas))
    return accounting


def accounting_of(request: Request, alloc: Annotated[Allocator, Depends(allocator)]) -> Accounting:
    """The app's accounting (a dependency of every route that prices)."""
    acc: Accounting | None = getattr(request.app.state, "accounting", None)
    return acc if acc is not None else Accounting(alloc.store)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CostGroupOut(_Model):
    tenant: str | None = Field(description="The tenant; null when not grouped by tenant.")
    owner: str | None = Field(description="The user; null when not grouped by owner.")
    flavor: str | None = Field(description="The flavor; null when not grouped by flavor.")
    period_start: datetime | None = Field(
        description="Start of the period (UTC); null when not grouped by period."
    )
    allocated_gpu_hours: float = Field(ge=0, description="GPU-equivalent-hours held.")
    used_gpu_hours: float | None = Field(
        description="Allocated GPU-hours x measured utilization; null without utilization data."
    )
    efficiency: float | None = Field(
        description="Used / allocated; null without utilization data or allocation."
    )
    cost: str = Field(pattern=MONEY, description="In `currency`, whole cents.")
    idle_cost: str | None = Field(
        pattern=MONEY,
        description="Cost of seconds below the idle threshold; null without utilization data.",
    )


class CostSummaryOut(_Model):
    start: datetime = Field(description="Start of the window (UTC), inclusive.")
    end: datetime = Field(description="End of the window (UTC), exclusive.")
    currency: str
    group_by: list[GroupBy]
    measured: bool = Field(description="Utilization data was available.")
    unpriced_models: list[str] = Field(
        description="GPU models allocated in the window without a configured price; counted at 0."
    )
    groups: list[CostGroupOut] = Field(description="Sorted by their keys.")
    total: CostGroupOut = Field(description="Every visible tenant together (keys null).")


class BudgetOut(_Model):
    tenant: str
    flavor: str | None = Field(
        description="The quota's flavor (gpu_hours budgets); null for money."
    )
    kind: str = Field(description="`money` (in `currency`) or `gpu_hours` (GPU-equivalent-hours).")
    period_start: datetime = Field(description="The budget month's start (UTC).")
    period_end: datetime = Field(description="The budget month's end (UTC), exclusive.")
    budget: float = Field(ge=0)
    spent: float = Field(ge=0, description="Spent this month so far.")
    burn_per_hour: float = Field(ge=0, description="Spent / hours elapsed this month.")
    projected: float = Field(ge=0, description="Spent at the month's end at the rate so far.")
    over: bool = Field(description="Projected above budget.")
    exhausted_at: datetime | None = Field(
        description="When the budget runs out at this rate; null when not within the month."
    )


def _window(
    start: datetime | None, end: datetime | None, now: datetime
) -> tuple[datetime, datetime]:
    """The window asked for; naive times are UTC; defaults: this month (UTC) until now."""
    month_start = datetime.fromtimestamp(month_of(now).start, UTC)
    lo = utc_param("start", start) if start is not None else month_start
    hi = utc_param("end", end) if end is not None else now
    if hi <= lo:
        raise InvalidRequest("end", hi.isoformat(), f"after start {lo.isoformat()}")
    return lo, hi


def utc_param(name: str, at: datetime) -> datetime:
    """A query's time in UTC (naive is UTC) within the dates the store holds; else a 422
    naming the parameter."""
    try:
        utc = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+00:01 is before year 1 in UTC
        utc = EARLIEST - timedelta(days=1)
    if not EARLIEST <= utc <= LATEST:
        raise InvalidRequest(name, at.isoformat(), f"between {EARLIEST.date()} and {LATEST.date()}")
    return utc


def money_text(x: Fraction) -> str:
    """An exact amount as the answers write money (``MONEY``)."""
    return str(to_cents(x))


def _group(keys: dict[GroupBy, str], t: CostTotal, measured: bool) -> CostGroupOut:
    period = keys.get(GroupBy.PERIOD)
    return CostGroupOut(
        tenant=keys.get(GroupBy.TENANT),
        owner=keys.get(GroupBy.OWNER),
        flavor=keys.get(GroupBy.FLAVOR),
        period_start=None if period is None else datetime.fromtimestamp(int(period), UTC),
        allocated_gpu_hours=float(t.allocated_gpu_hours),
        used_gpu_hours=float(t.used_gpu_hours) if measured else None,
        efficiency=t.efficiency if measured else None,
        cost=money_text(t.cost),
        idle_cost=money_text(t.idle_cost) if measured else None,
    )


Start = Annotated[
    datetime | None,
    Query(description="Window start (ISO 8601; naive is UTC). Default: this month's start."),
]
End = Annotated[datetime | None, Query(description="Window end, exclusive. Default: now.")]
TenantFilter = Annotated[Label | None, Query(description="Only this tenant.")]


@router.get(
    "", response_model=CostSummaryOut, summary="Cost grouped by tenant, owner, flavor, period"
)
def cost_summary(
    caller: Annotated[Caller, requires(Scope.COST_READ)],
    acc: Annotated[Accounting, Depends(accounting_of)],
    start: Start = None,
    end: End = None,
    step: Annotated[
        Step, Query(description="Periods: whole window, UTC days or months.")
    ] = Step.WHOLE,
    group_by: Annotated[
        list[GroupBy] | None,
        Query(max_length=4, description="Keys to group by (repeat). Default: tenant."),
    ] = None,
    tenant: TenantFilter = None,
) -> CostSummaryOut:
    shown = visible_tenants(caller, Scope.COST_READ, tenant)
    lo, hi = _window(start, end, acc.clock())
    by = list(dict.fromkeys(group_by or [GroupBy.TENANT]))
    report = acc.report(lo, hi, step, shown)
    groups = [
        _group(dict(zip(by, key, strict=True)), t, report.measured)
        for key, t in sorted(report.grouped(by).items())
    ]
    return CostSummaryOut(
        start=lo,
        end=hi,
        currency=report.currency,
        group_by=by,
        measured=report.measured,
        unpriced_models=list(report.unpriced_models),
        groups=groups,
        total=_group({}, report.total(), report.measured),
    )


@router.get(
    "/chargeback",
    response_class=Response,
    responses={
        200: {"content": {"text/csv": {"schema": {"type": "string"}}}, "description": "CSV"}
    },
    summary="Chargeback CSV: one row per period, tenant, owner and flavor",
)
def chargeback(
    caller: Annotated[Caller, requires(Scope.COST_READ)],
    acc: Annotated[Accounting, Depends(accounting_of)],
    start: Start = None,
    end: End = None,
    step: Annotated[
        Step, Query(description="Periods: whole window, UTC days or months.")
    ] = Step.DAY,
    tenant: TenantFilter = None,
) -> Response:
    shown = visible_tenants(caller, Scope.COST_READ, tenant)
    lo, hi = _window(start, end, acc.clock())
    text = acc.chargeback(lo, hi, step, shown)
    name = f"chargeback-{lo:%Y%m%dT%H%M%SZ}-{hi:%Y%m%dT%H%M%SZ}.csv"
    return Response(
        text,
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


@router.get("/budgets", response_model=Page[BudgetOut], summary="Budgets: burn rate and forecast")
def budgets(
    caller: Annotated[Caller, requires(Scope.COST_READ)],
    acc: Annotated[Accounting, Depends(accounting_of)],
    alloc: Annotated[Allocator, Depends(allocator)],
    page: Annotated[Paging, Depends(paging)],
    tenant: TenantFilter = None,
) -> Page[BudgetOut]:
    shown = visible_tenants(caller, Scope.COST_READ, tenant)
    return page.page([_budget(b) for b in acc.budgets(alloc.quotas(), shown)])


class ServiceHoursOut(_Model):
    tenant: str
    service_id: str
    name: str
    state: str = Field(description="active, failed, deleted.")
    warm_gpu_hours: float = Field(
        ge=0, description="GPU-equivalent-hours its warm pool held (loading or asleep)."
    )
    serving_gpu_hours: float = Field(
        ge=0, description="GPU-equivalent-hours serving replicas held."
    )


class ServiceCostOut(_Model):
    start: datetime = Field(description="Start of the window (UTC), inclusive.")
    end: datetime = Field(description="End of the window (UTC), exclusive.")
    services: list[ServiceHoursOut] = Field(description="Services of the visible tenants.")


@router.get(
    "/services",
    response_model=ServiceCostOut,
    summary="Inference services' GPU-hours in the window: warm pool and serving apart",
)
def service_hours(
    caller: Annotated[Caller, requires(Scope.COST_READ)],
    acc: Annotated[Accounting, Depends(accounting_of)],
    alloc: Annotated[Allocator, Depends(allocator)],
    start: Start = None,
    end: End = None,
    tenant: TenantFilter = None,
) -> ServiceCostOut:
    """Both are charged like any workload's hours (they are in the other cost routes' totals);
    this splits a service's share of them."""
    shown = visible_tenants(caller, Scope.COST_READ, tenant)
    now = acc.clock()
    lo, hi = _window(start, end, now)
    services = stored.services(alloc.store, tenants=shown)
    rows = [
        ServiceHoursOut(
            tenant=h.service.tenant,
            service_id=h.service.id,
            name=h.service.name,
            state=h.service.state.value,
            warm_gpu_hours=round(h.warm_gpu_hours, 6),
            serving_gpu_hours=round(h.serving_gpu_hours, 6),
        )
        for h in warm.gpu_hours(alloc.store, services, lo, hi, now)
    ]
    return ServiceCostOut(start=lo, end=hi, services=rows)


def _budget(b: BudgetStatus) -> BudgetOut:
    return BudgetOut(
        tenant=b.tenant,
        flavor=b.flavor,
        kind=b.kind.value,
        period_start=datetime.fromtimestamp(b.period.start, UTC),
        period_end=datetime.fromtimestamp(b.period.end, UTC),
        budget=float(b.budget),
        spent=float(b.spent),
        burn_per_hour=float(b.burn_per_hour),
        projected=float(b.projected),
        over=b.over,
        exhausted_at=None
        if b.exhausted_at is None
        else datetime.fromtimestamp(b.exhausted_at, UTC),
    )
