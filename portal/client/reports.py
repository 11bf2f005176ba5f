"""The client's operations on money, forecasts, telemetry and alerts: cost and chargeback,
service hours, budgets, the capacity forecast, prestart, telemetry series and device minutes,
alerts. Built as the other client calls are (``portal.client.core``); ``Portal`` and
``AsyncPortal`` send them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from portal.client.core import API, Call, Op, _filters, every_page, one
from portal.client.errors import error_from_response

if TYPE_CHECKING:
    # Their modules load FastAPI and the services behind the routes: imported on use only.
    from portal.api.alerts import AlertOut
    from portal.api.cost import BudgetOut, CostSummaryOut, ServiceCostOut
    from portal.api.forecast import CapacityForecastOut
    from portal.api.prestart import PrestartOut
    from portal.api.telemetry import DeviceMinutesOut, SeriesPage


def cost(
    start: datetime | None,
    end: datetime | None,
    step: str | None,
    group_by: Sequence[str],
    tenant: str | None,
) -> Op[CostSummaryOut]:
    from portal.api.cost import CostSummaryOut

    params = _filters(start=start, end=end, step=step, tenant=tenant, group_by=list(group_by))
    if not group_by:
        del params["group_by"]
    return (yield from one(Call("GET", f"{API}/cost", params, idempotent=True), CostSummaryOut))


def chargeback(
    start: datetime | None, end: datetime | None, step: str | None, tenant: str | None
) -> Op[str]:
    params = _filters(start=start, end=end, step=step, tenant=tenant)
    response = yield Call("GET", f"{API}/cost/chargeback", params, idempotent=True)
    if response.status_code >= 400:
        raise error_from_response(response)
    return response.text


def service_hours(
    start: datetime | None, end: datetime | None, tenant: str | None
) -> Op[ServiceCostOut]:
    from portal.api.cost import ServiceCostOut

    params = _filters(start=start, end=end, tenant=tenant)
    call = Call("GET", f"{API}/cost/services", params, idempotent=True)
    return (yield from one(call, ServiceCostOut))


def capacity_forecast(weeks: int | None, history_days: int | None) -> Op[CapacityForecastOut]:
    from portal.api.forecast import CapacityForecastOut

    params = _filters(weeks=weeks, history_days=history_days)
    call = Call("GET", f"{API}/forecast/capacity", params, idempotent=True)
    return (yield from one(call, CapacityForecastOut))


def prestart() -> Op[PrestartOut]:
    from portal.api.prestart import PrestartOut

    call = Call("GET", f"{API}/prestart", idempotent=True)
    return (yield from one(call, PrestartOut))


def budgets(page_size: int, tenant: str | None) -> Op[list[BudgetOut]]:
    from portal.api.cost import BudgetOut

    params = _filters(tenant=tenant)
    return (yield from every_page(f"{API}/cost/budgets", BudgetOut, page_size, params))


def series(
    device: str | None,
    workload_id: str | None,
    resolution: str | None,
    start: float | None,
    end: float | None,
    limit: int | None,
    tenant: str | None = None,
    owner: str | None = None,
) -> Op[SeriesPage]:
    from portal.api.telemetry import SeriesPage

    params = _filters(
        device=device,
        workload_id=workload_id,
        resolution=resolution,
        start=start,
        end=end,
        limit=limit,
        tenant=tenant,
        owner=owner,
    )
    call = Call("GET", f"{API}/telemetry/series", params, idempotent=True)
    return (yield from one(call, SeriesPage))


def device_usage(start: float | None, end: float | None) -> Op[DeviceMinutesOut]:
    from portal.api.telemetry import DeviceMinutesOut

    call = Call("GET", f"{API}/telemetry/devices", _filters(start=start, end=end), idempotent=True)
    return (yield from one(call, DeviceMinutesOut))


def alerts(
    page_size: int, tenant: str | None, states: Sequence[str], rule: str | None
) -> Op[list[AlertOut]]:
    from portal.api.alerts import AlertOut

    params = _filters(tenant=tenant, rule=rule)
    if states:
        params["state"] = [str(s) for s in states]
    return (yield from every_page(f"{API}/alerts", AlertOut, page_size, params))
