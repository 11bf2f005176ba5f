"""``Portal``: the blocking client, for notebooks, scripts and the CLI."""

from __future__ import annotations

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
from portal.client.jobs import Jobs
from portal.client.ray import Ray
from portal.client.services import Services
from portal.store.records import WorkloadState

if TYPE_CHECKING:
    from portal.api.alerts import AlertOut
    from portal.api.cost import BudgetOut, CostSummaryOut, ServiceCostOut
    from portal.api.forecast import CapacityForecastOut
    from portal.api.offers import OfferOut
    from portal.api.prestart import PrestartOut
    from portal.api.telemetry import DeviceMinutesOut, SeriesPage

T = TypeVar("T")


class Portal:
    """The portal's REST API as Python calls with typed answers.

    ``Portal()`` inside a JupyterHub notebook finds the portal and the token itself (see
    ``portal.client.config``); elsewhere pass ``url`` and ``token`` or set ``GPUPORTAL_URL`` and
    ``JUPYTERHUB_API_TOKEN``. Errors raise the ``policies.errors`` class the server named
    (``Forbidden``, ``NotFound``, ``InvalidRequest``, ``Conflict``, ...) mixed with
    ``ApiError``; no answer at all raises ``PortalUnreachable``. Lists return every page.
    Calls that are safe to repeat are retried ``retries`` times after a transport failure, and
    for up to ``unavailable_wait_s`` in all while the portal answers 503 with ``Retry-After``
    (a standby during a failover, a database restart).
    """

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
        self._http = httpx.Client(
            base_url=self.url, **core.http_options(resolve_token(token), timeout)
        )
        self.jobs = Jobs(self)
        """Training jobs: ``submit``, ``get``, ``list``, ``cancel`` (``portal.client.jobs``)."""
        self.services = Services(self)
        """Inference services: ``deploy``, ``get``, ``list``, ``scale``, ``delete``
        (``portal.client.services``)."""
        self.ray = Ray(self)
        """Ray clusters: ``up``, ``list``, ``scale``, ``down`` (``portal.client.ray``)."""

    def __repr__(self) -> str:
        return f"Portal({self.url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Portal:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ sending

    def _send(self, call: Call) -> httpx.Response:
        attempt = 0
        waited = 0.0
        while True:
            try:
                response = self._http.request(
                    call.method,
                    call.path,
                    params=dict(call.params),
                    json=call.body,
                    headers=dict(call.headers),
                )
            except httpx.TransportError as exc:
                time.sleep(core.retry_delay(self.url, call, exc, attempt, self._retries))
                attempt += 1
                continue
            delay = core.unavailable_delay(response, call, waited, self._unavailable_wait_s)
            if delay is None:
                return response
            time.sleep(delay)
            waited += delay

    def _run(self, op: Op[T]) -> T:
        try:
            call = next(op)
            while True:
                call = op.send(self._send(call))
        except StopIteration as done:
            return cast(T, done.value)

    # ------------------------------------------------------------------ tenants and quotas

    def tenants(self) -> list[TenantOut]:
        """Tenants the token may see, by name."""
        return self._run(core.tenants(self._page_size))

    def tenant(self, name: str) -> WithETag[TenantOut]:
        """One tenant and its ETag."""
        return self._run(core.tenant(name))

    def set_tenant(
        self,
        name: str,
        *,
        cohort: str | None = None,
        weight: float = 1.0,
        pools: Sequence[str] = (),
        if_match: str | None = None,
        create: bool = False,
    ) -> WithETag[TenantOut]:
        """Create (``create=True``) or change a tenant (``if_match``: its ETag): cohort,
        fair-share weight, node pools. Platform admins only (unfiltered ``admin`` scope)."""
        return self._run(
            core.set_tenant(
                name, cohort=cohort, weight=weight, pools=pools, if_match=if_match, create=create
            )
        )

    def quotas(self, tenant: str | None = None) -> list[QuotaOut]:
        """Quotas per tenant and flavor; all the token may see, or one tenant's."""
        return self._run(core.quotas(self._page_size, tenant))

    def quota(self, tenant: str, flavor: str) -> WithETag[QuotaOut]:
        """One quota and its ETag (pass it to ``set_quota(if_match=...)``)."""
        return self._run(core.quota(tenant, flavor))

    def elastic(self, tenant: str) -> WithETag[ElasticOut]:
        """A tenant's elastic-job policy and limits, and its ETag (version 0: the defaults)."""
        return self._run(core.elastic(tenant))

    def set_elastic(
        self, tenant: str, body: ElasticIn, *, if_match: str | None = None, create: bool = False
    ) -> WithETag[ElasticOut]:
        """Replace a tenant's elastic-job policy (``body.limits``: platform admins only);
        ``if_match``/``create`` as for ``set_quota``."""
        return self._run(core.set_elastic(tenant, body, if_match=if_match, create=create))

    def set_quota(
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
        """Set a quota. ``if_match``: the ETag read with ``quota()``; raises
        ``PreconditionFailed`` (a ``Conflict``) when it changed meanwhile. ``create=True``
        creates one that must not exist yet. Without either the server answers 428."""
        return self._run(
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

    # ------------------------------------------------------------------ workloads

    def request(
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
        """Ask for devices charged to ``tenant``: ``count`` GPUs of a whole-GPU ``flavor``
        (``H100-80GB``), one MIG instance (``H100-80GB/3g.40gb``), ``milli`` of a shared GPU
        (``T4/share``), or any ``devices``. The answer is ``running`` with ``allocations``, or
        ``queued`` with ``reason``, ``message``, ``position`` and ``eta_s``. A retry with the
        same ``idempotency_key`` (made up when not given) allocates once. ``owner``: services
        only (the hub's spawner), the user the workload is for."""
        want = core.devices_for(
            flavor, count=count, milli=milli, gpu_memory_mib=gpu_memory_mib, devices=devices
        )
        return self._run(
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

    def status(self, workload_id: str) -> WorkloadOut:
        """One workload, ended ones included."""
        return self._run(core.status(workload_id))

    def release(self, workload_id: str) -> WorkloadOut:
        """Give back a workload's devices (a queued one leaves the queue). Idempotent."""
        return self._run(core.release(workload_id))

    def cancel(self, workload_id: str) -> WorkloadOut:
        """Take a queued workload out of the queue; the same call as ``release``, named for
        what it does to a queued workload (the server decides: ``cancelled`` or
        ``released``)."""
        return self._run(core.release(workload_id))

    def wait(
        self, workload_id: str, *, timeout_s: float = 3600.0, poll_s: float = 2.0
    ) -> WorkloadOut:
        """Poll ``status`` every ``poll_s`` until the workload leaves the queue (running,
        or ended) or ``timeout_s`` passes; returns its last status, so check ``state``."""
        deadline = time.monotonic() + timeout_s
        while True:
            w = self.status(workload_id)
            delay = core.next_poll(w, deadline - time.monotonic(), poll_s)
            if delay is None:
                return w
            time.sleep(delay)

    def workloads(
        self, tenant: str | None = None, state: WorkloadState | str | None = None
    ) -> list[WorkloadOut]:
        """Live workloads (queued, running, preempting) in arrival order."""
        return self._run(core.workloads(self._page_size, tenant, state))

    def queue(self, tenant: str | None = None) -> list[QueueEntryOut]:
        """Pending workloads in scheduling order, each with its reason and ETA."""
        return self._run(core.queue(self._page_size, tenant))

    def usage(self, tenant: str | None = None) -> list[UsageOut]:
        """Guaranteed, limit, used, borrowed and lent per tenant and flavor."""
        return self._run(core.usage(self._page_size, tenant))

    # ------------------------------------------------------------------ inventory

    def nodes(self, *, topology: bool = True) -> list[NodeOut]:
        """Nodes with their GPUs, MIG layouts, free shares and topology, by name.
        ``topology=False`` leaves each node's ``links`` and ``numa`` out (None): a lighter
        read of many nodes; ``node(name)`` has one node's topology."""
        return self._run(core.nodes(self._page_size, topology))

    def versioned_nodes(self, *, topology: bool = True) -> Versioned[list[NodeOut]]:
        """``nodes`` and the inventory's version they were read at: follow it with
        ``node_changes``."""
        return self._run(core.versioned_nodes(self._page_size, topology))

    def node_changes(self, since: str, *, topology: bool = True) -> NodeChangesOut:
        """Nodes added, changed or removed since the version ``since`` (from
        ``versioned_nodes`` or an earlier answer); ``Expired`` when the portal no longer holds
        that version (it restarted, or too much changed): list again."""
        return self._run(core.node_changes(since, topology))

    def node(self, name: str) -> NodeOut:
        return self._run(core.node(name))

    def capacity(self) -> list[CapacityOut]:
        """Units per flavor in the inventory."""
        return self._run(core.capacity())

    # ------------------------------------------------------------------ offers, cost, telemetry

    def offers(self, tenant: str) -> list[OfferOut]:
        """Every option the tenant could ask for now, each available, queued (reason,
        position, ETA) or not allowed; changes nothing."""
        return self._run(core.offers(tenant))

    def cost(
        self,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
        step: str | None = None,
        group_by: Sequence[str] = (),
        tenant: str | None = None,
    ) -> CostSummaryOut:
        """GPU-hours, cost, efficiency and idle cost in a window (default: this month until
        now), grouped by any of tenant, owner, flavor, period (``step``: whole, day, month)."""
        return self._run(reports.cost(start, end, step, group_by, tenant))

    def chargeback(
        self,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
        step: str | None = None,
        tenant: str | None = None,
    ) -> str:
        """The chargeback CSV: one row per period, tenant, owner and flavor."""
        return self._run(reports.chargeback(start, end, step, tenant))

    def budgets(self, tenant: str | None = None) -> list[BudgetOut]:
        """Budgets with spend, burn rate and forecast for this month."""
        return self._run(reports.budgets(self._page_size, tenant))

    def service_hours(
        self,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
        tenant: str | None = None,
    ) -> ServiceCostOut:
        """Inference services' GPU-hours in the window, warm pool and serving apart."""
        return self._run(reports.service_hours(start, end, tenant))

    def prestart(self) -> PrestartOut:
        """The pre-started environments' plan per option and placeholders (platform admins)."""
        return self._run(reports.prestart())

    def capacity_forecast(
        self, *, weeks: int | None = None, history_days: int | None = None
    ) -> CapacityForecastOut:
        """Forecast demand per flavor for the next weeks against capacity and guarantees
        (leadership and platform admins)."""
        return self._run(reports.capacity_forecast(weeks, history_days))

    def series(
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
        """Utilization series of a device (GPU UUID, or ``<UUID>/gi<id>`` for MIG), a
        workload, or (neither) every live workload the token may see, at most 200, narrowed
        to ``tenant`` and ``owner``; times in epoch seconds; ``resolution``: raw, 1m or 1h."""
        return self._run(
            reports.series(device, workload_id, resolution, start, end, limit, tenant, owner)
        )

    def device_usage(
        self, *, start: float | None = None, end: float | None = None
    ) -> DeviceMinutesOut:
        """Every device's latest rolled-up minute in ``[start, end)`` (default: the last five
        minutes) that the token may see: utilization and memory per GPU or MIG instance."""
        return self._run(reports.device_usage(start, end))

    def alerts(
        self, tenant: str | None = None, *, states: Sequence[str] = (), rule: str | None = None
    ) -> list[AlertOut]:
        """Alerts newest first (default states pending, firing, resolved): all for operators,
        a tenant's for its admins and services, their own workloads' for members."""
        return self._run(reports.alerts(self._page_size, tenant, states, rule))
