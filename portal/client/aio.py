"""``AsyncPortal``: the same client for asyncio code (the spawners, the dashboards).

Every method builds its requests and reads its answers through ``portal.client.core``, like
``Portal``; see ``Portal`` for what each returns and raises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar, cast

import httpx

from policies.requests import WorkloadKind
from portal.api.schemas import (
    MAX_PAGE,
    CapacityOut,
    DevicesIn,
    ElasticIn,
    ElasticOut,
    NodeChangesOut,
    NodeOut,
    QueueEntryOut,
    QuotaOut,
    TenantOut,
    UsageOut,
    WorkloadOut,
)
from portal.client import core, reports
from portal.client.config import resolve_token, resolve_url
from portal.client.core import Call, Op, Versioned, WithETag
from portal.client.jobs import AsyncJobs
from portal.client.services import AsyncServices
from portal.store.records import WorkloadState

if TYPE_CHECKING:
    from portal.api.alerts import AlertOut
    from portal.api.cost import BudgetOut, CostSummaryOut, ServiceCostOut
    from portal.api.forecast import CapacityForecastOut
    from portal.api.offers import OfferOut
    from portal.api.prestart import PrestartOut
    from portal.api.telemetry import DeviceMinutesOut, SeriesPage

T = TypeVar("T")


class AsyncPortal:
    """``Portal`` with ``async`` methods over ``httpx.AsyncClient``."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 2,
        unavailable_wait_s: float = core.UNAVAILABLE_WAIT_S,
        page_size: int = MAX_PAGE,
    ) -> None:
        self.url = resolve_url(url)
        self._retries = retries
        self._unavailable_wait_s = unavailable_wait_s
        self._page_size = core.check_page_size(page_size)
        self._http = httpx.AsyncClient(
            base_url=self.url, **core.http_options(resolve_token(token), timeout)
        )
        self.jobs = AsyncJobs(self)
        """Training jobs (``portal.client.jobs.AsyncJobs``)."""
        self.services = AsyncServices(self)
        """Inference services (``portal.client.services.AsyncServices``)."""

    def __repr__(self) -> str:
        return f"AsyncPortal({self.url!r})"

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncPortal:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _send(self, call: Call) -> httpx.Response:
        attempt = 0
        waited = 0.0
        while True:
            try:
                response = await self._http.request(
                    call.method,
                    call.path,
                    params=dict(call.params),
                    json=call.body,
                    headers=dict(call.headers),
                )
            except httpx.TransportError as exc:
                await asyncio.sleep(core.retry_delay(self.url, call, exc, attempt, self._retries))
                attempt += 1
                continue
            delay = core.unavailable_delay(response, call, waited, self._unavailable_wait_s)
            if delay is None:
                return response
            await asyncio.sleep(delay)
            waited += delay

    async def _run(self, op: Op[T]) -> T:
        try:
            call = next(op)
            while True:
                call = op.send(await self._send(call))
        except StopIteration as done:
            return cast(T, done.value)

    async def tenants(self) -> list[TenantOut]:
        return await self._run(core.tenants(self._page_size))

    async def tenant(self, name: str) -> WithETag[TenantOut]:
        return await self._run(core.tenant(name))

    async def set_tenant(
        self,
        name: str,
        *,
        cohort: str | None = None,
        weight: float = 1.0,
        pools: Sequence[str] = (),
        if_match: str | None = None,
        create: bool = False,
    ) -> WithETag[TenantOut]:
        return await self._run(
            core.set_tenant(
                name, cohort=cohort, weight=weight, pools=pools, if_match=if_match, create=create
            )
        )

    async def quotas(self, tenant: str | None = None) -> list[QuotaOut]:
        return await self._run(core.quotas(self._page_size, tenant))

    async def quota(self, tenant: str, flavor: str) -> WithETag[QuotaOut]:
        return await self._run(core.quota(tenant, flavor))

    async def elastic(self, tenant: str) -> WithETag[ElasticOut]:
        """A tenant's elastic-job policy and limits, and its ETag (version 0: the defaults)."""
        return await self._run(core.elastic(tenant))

    async def set_elastic(
        self, tenant: str, body: ElasticIn, *, if_match: str | None = None, create: bool = False
    ) -> WithETag[ElasticOut]:
        """Replace a tenant's elastic-job policy (``body.limits``: platform admins only);
        ``if_match``/``create`` as for ``set_quota``."""
        return await self._run(core.set_elastic(tenant, body, if_match=if_match, create=create))

    async def set_quota(
        self,
        tenant: str,
        flavor: str,
        *,
        guaranteed: int,
        limit: int,
        budget_gpu_hours: float | None = None,
        if_match: str | None = None,
        create: bool = False,
        ceiling_guaranteed: int | None = None,
        ceiling_limit: int | None = None,
        overcommit: bool = False,
    ) -> WithETag[QuotaOut]:
        return await self._run(
            core.set_quota(
                tenant,
                flavor,
                guaranteed=guaranteed,
                limit=limit,
                budget_gpu_hours=budget_gpu_hours,
                if_match=if_match,
                create=create,
                ceiling_guaranteed=ceiling_guaranteed,
                ceiling_limit=ceiling_limit,
                overcommit=overcommit,
            )
        )

    async def request(
        self,
        tenant: str,
        flavor: str | None = None,
        *,
        count: int = 1,
        milli: int = 0,
        gpu_memory_mib: int = 0,
        devices: DevicesIn | None = None,
        name: str | None = None,
        kind: WorkloadKind = WorkloadKind.NOTEBOOK,
        priority: int = 0,
        gang_size: int = 1,
        expected_duration_s: float | None = None,
        idempotency_key: str | None = None,
        owner: str | None = None,
    ) -> WorkloadOut:
        want = core.devices_for(
            flavor, count=count, milli=milli, gpu_memory_mib=gpu_memory_mib, devices=devices
        )
        return await self._run(
            core.request(
                tenant,
                want,
                name=name or str(kind),
                kind=kind,
                priority=priority,
                gang_size=gang_size,
                expected_duration_s=expected_duration_s,
                idempotency_key=idempotency_key,
                owner=owner,
            )
        )

    async def status(self, workload_id: str) -> WorkloadOut:
        return await self._run(core.status(workload_id))

    async def release(self, workload_id: str) -> WorkloadOut:
        return await self._run(core.release(workload_id))

    async def cancel(self, workload_id: str) -> WorkloadOut:
        return await self._run(core.release(workload_id))

    async def wait(
        self, workload_id: str, *, timeout_s: float = 3600.0, poll_s: float = 2.0
    ) -> WorkloadOut:
        deadline = time.monotonic() + timeout_s
        while True:
            w = await self.status(workload_id)
            delay = core.next_poll(w, deadline - time.monotonic(), poll_s)
            if delay is None:
                return w
            await asyncio.sleep(delay)

    async def workloads(
        self, tenant: str | None = None, state: WorkloadState | str | None = None
    ) -> list[WorkloadOut]:
        return await self._run(core.workloads(self._page_size, tenant, state))

    async def queue(self, tenant: str | None = None) -> list[QueueEntryOut]:
        return await self._run(core.queue(self._page_size, tenant))

    async def usage(self, tenant: str | None = None) -> list[UsageOut]:
        return await self._run(core.usage(self._page_size, tenant))

    async def nodes(self, *, topology: bool = True) -> list[NodeOut]:
        return await self._run(core.nodes(self._page_size, topology))

    async def versioned_nodes(self, *, topology: bool = True) -> Versioned[list[NodeOut]]:
        return await self._run(core.versioned_nodes(self._page_size, topology))

    async def node_changes(self, since: str, *, topology: bool = True) -> NodeChangesOut:
        return await self._run(core.node_changes(since, topology))

    async def node(self, name: str) -> NodeOut:
        return await self._run(core.node(name))

    async def capacity(self) -> list[CapacityOut]:
        return await self._run(core.capacity())

    # ------------------------------------------------------------------ offers, cost, telemetry

    async def offers(self, tenant: str) -> list[OfferOut]:
        return await self._run(core.offers(tenant))

    async def cost(
        self,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
        step: str | None = None,
        group_by: Sequence[str] = (),
        tenant: str | None = None,
    ) -> CostSummaryOut:
        return await self._run(reports.cost(start, end, step, group_by, tenant))

    async def chargeback(
        self,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
        step: str | None = None,
        tenant: str | None = None,
    ) -> str:
        return await self._run(reports.chargeback(start, end, step, tenant))

    async def budgets(self, tenant: str | None = None) -> list[BudgetOut]:
        return await self._run(reports.budgets(self._page_size, tenant))

    async def service_hours(
        self,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
        tenant: str | None = None,
    ) -> ServiceCostOut:
        return await self._run(reports.service_hours(start, end, tenant))

    async def prestart(self) -> PrestartOut:
        """The pre-started environments' plan per option and placeholders (platform admins)."""
        return await self._run(reports.prestart())

    async def capacity_forecast(
        self, *, weeks: int | None = None, history_days: int | None = None
    ) -> CapacityForecastOut:
        return await self._run(reports.capacity_forecast(weeks, history_days))

    async def series(
        self,
        *,
        device: str | None = None,
        workload_id: str | None = None,
        resolution: str | None = None,
        start: float | None = None,
        end: float | None = None,
        limit: int | None = None,
        tenant: str | None = None,
        owner: str | None = None,
    ) -> SeriesPage:
        return await self._run(
            reports.series(device, workload_id, resolution, start, end, limit, tenant, owner)
        )

    async def device_usage(
        self, *, start: float | None = None, end: float | None = None
    ) -> DeviceMinutesOut:
        return await self._run(reports.device_usage(start, end))

    async def alerts(
        self, tenant: str | None = None, *, states: Sequence[str] = (), rule: str | None = None
    ) -> list[AlertOut]:
        return await self._run(reports.alerts(self._page_size, tenant, states, rule))
