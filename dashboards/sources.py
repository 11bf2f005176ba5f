"""Where the dashboards get their data: a small typed ``Source`` over the portal API.

Stores depend on the ``Source`` protocol only, so they are tested against the real API and
a view works as soon as the routes it reads exist. ``ApiSource`` speaks ``/api/v1`` with the
*viewer's* JupyterHub token: the portal decides what that person may see, the dashboards never
widen it. The records are the client's frozen, typed answers; JSON stops in the client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from portal.api.alerts import AlertOut
from portal.api.cost import BudgetOut, CostSummaryOut, ServiceCostOut
from portal.api.forecast import CapacityForecastOut
from portal.api.jobs import AttemptOut, JobCostOut, JobOut, LogOut
from portal.api.ray import RayCostOut, RayOut
from portal.api.schemas import CapacityOut, NodeOut, QueueEntryOut, QuotaOut, UsageOut, WorkloadOut
from portal.api.services import ServiceOut
from portal.api.telemetry import DeviceMinuteOut, PointOut
from portal.client import Expired, Portal

# ------------------------------------------------------------------ records

# The records are the client's own (``portal.api.schemas`` and the route modules' answer
# models), read as it returns them: one definition of every field, never copied field by field
# into a parallel type. What a view derives from them (a GPU's allocated share, a group's cost
# as a number) is a function next to the view's store.


@dataclass(frozen=True, slots=True)
class NodeChanges:
    """Nodes read at ``version``: every node (``complete``), or those added or changed since
    the version asked about and the names of those removed. Not a record of the portal's: it
    says which of two answers (a listing, or the changes since a version) the nodes came from."""

    version: str
    nodes: list[NodeOut]
    removed: list[str]
    complete: bool


@dataclass(frozen=True, slots=True)
class JobDraft:
    """A job as the Launch form describes it, in ``Portal().jobs.submit``'s terms (the portal
    checks every value and names the one wrong)."""

    tenant: str
    flavor: str
    members: int
    count: int
    command: tuple[str, ...]
    cwd: str | None
    checkpoint_dir: str | None
    topology: str
    topology_mode: str
    max_restarts: int


class Source(Protocol):
    """What the stores read and change. Every call acts as the viewer; errors are
    the client's ``PortalError`` subclasses (the portal's error body, or no answer)."""

    origin: str
    """The portal read: records of one origin that are the same for every viewer (the
    inventory) may be shared between the stores of different viewers."""

    def tenants(self) -> list[str]: ...
    def node_changes(self, since: str | None, *, topology: bool = True) -> NodeChanges: ...
    def node(self, name: str) -> NodeOut: ...
    def capacity(self) -> list[CapacityOut]: ...
    def quotas(self, tenant: str | None = None) -> list[QuotaOut]: ...
    def usage(self, tenant: str | None = None) -> list[UsageOut]: ...
    def queue(self, tenant: str | None = None) -> list[QueueEntryOut]: ...
    def workloads(self, tenant: str | None = None) -> list[WorkloadOut]: ...
    def set_quota(
        self,
        tenant: str,
        flavor: str,
        *,
        guaranteed: int,
        limit: int,
        budget_gpu_hours: float | None,
        version: int,
    ) -> QuotaOut: ...
    def release(self, workload_id: str) -> WorkloadOut: ...
    def series(
        self, *, start: float, end: float, tenant: str | None = None, owner: str | None = None
    ) -> dict[str, list[PointOut]]: ...
    def device_usage(self, *, start: float, end: float) -> list[DeviceMinuteOut]: ...
    def alerts(self, tenant: str | None = None) -> list[AlertOut]: ...
    def cost(
        self,
        group_by: Sequence[str],
        *,
        step: str = "whole",
        start: datetime | None = None,
        end: datetime | None = None,
        tenant: str | None = None,
    ) -> CostSummaryOut: ...
    def budgets(self, tenant: str | None = None) -> list[BudgetOut]: ...
    def service_hours(
        self, *, start: datetime, end: datetime, tenant: str | None = None
    ) -> ServiceCostOut: ...
    def capacity_forecast(self, *, weeks: int | None = None) -> CapacityForecastOut: ...
    def services(self, tenant: str | None = None) -> list[ServiceOut]: ...
    def jobs(self) -> list[JobOut]: ...
    def ray_clusters(self, tenant: str | None = None) -> list[RayOut]: ...
    def ray_costs(
        self, tenant: str | None = None, *, ended_since: datetime | None = None
    ) -> list[RayCostOut]: ...
    def job_attempts(self, job_id: str) -> list[AttemptOut]: ...
    def job_cost(self, job_id: str) -> JobCostOut: ...
    def job_log(self, job_id: str, *, attempt: int | None, offset: int) -> LogOut: ...
    def submit_job(self, body: JobDraft) -> JobOut: ...
    def cancel_job(self, job_id: str) -> JobOut: ...
    def chargeback_csv(
        self, *, start: datetime | None = None, end: datetime | None = None, step: str = "day"
    ) -> str: ...


# ------------------------------------------------------------------ over /api/v1


class ApiSource:
    """``Source`` over the portal through its Python client (``portal.client.Portal``),
    authenticated with the viewer's hub token.

    Args:
        base_url: the portal's root, e.g. ``http://127.0.0.1:8090`` (``/api/v1`` is appended).
        token: the viewer's JupyterHub API token (from HubOAuth in the served app).
    """

    def __init__(self, base_url: str, token: str) -> None:
        self._portal = Portal(base_url, token)
        self.origin = base_url.rstrip("/")

    def tenants(self) -> list[str]:
        return sorted(t.name for t in self._portal.tenants())

    def node_changes(self, since: str | None, *, topology: bool = True) -> NodeChanges:
        """The nodes changed since the inventory version ``since``, or every node by name
        when ``since`` is None or the portal no longer holds it (it restarted, or too much
        changed). ``topology=False`` reads them without ``links`` and ``numa``."""
        if since:
            try:
                ch = self._portal.node_changes(since, topology=topology)
            except Expired:
                pass  # list again below
            else:
                return NodeChanges(ch.version, ch.nodes, ch.removed, False)
        listed = self._portal.versioned_nodes(topology=topology)
        return NodeChanges(listed.version, listed.value, [], True)

    def node(self, name: str) -> NodeOut:
        """One node with its topology."""
        return self._portal.node(name)

    def capacity(self) -> list[CapacityOut]:
        return self._portal.capacity()

    def quotas(self, tenant: str | None = None) -> list[QuotaOut]:
        return self._portal.quotas(tenant)

    def usage(self, tenant: str | None = None) -> list[UsageOut]:
        return self._portal.usage(tenant)

    def queue(self, tenant: str | None = None) -> list[QueueEntryOut]:
        return self._portal.queue(tenant)

    def workloads(self, tenant: str | None = None) -> list[WorkloadOut]:
        return self._portal.workloads(tenant)

    def set_quota(
        self,
        tenant: str,
        flavor: str,
        *,
        guaranteed: int,
        limit: int,
        budget_gpu_hours: float | None,
        version: int,
    ) -> QuotaOut:
        saved = self._portal.set_quota(
            tenant,
            flavor,
            guaranteed=guaranteed,
            limit=limit,
            budget_gpu_hours=budget_gpu_hours,
            if_match=f'"{version}"',
        )
        return saved.value

    def release(self, workload_id: str) -> WorkloadOut:
        return self._portal.release(workload_id)

    def series(
        self, *, start: float, end: float, tenant: str | None = None, owner: str | None = None
    ) -> dict[str, list[PointOut]]:
        """1-minute points of every live workload the viewer may see (of ``tenant``, of
        ``owner``), by workload id."""
        page = self._portal.series(
            resolution="1m", start=start, end=end, tenant=tenant, owner=owner
        )
        return {s.workload_id: s.points for s in page.series if s.workload_id is not None}

    def device_usage(self, *, start: float, end: float) -> list[DeviceMinuteOut]:
        """Each device's latest minute rolled up in ``[start, end)`` that the viewer may see."""
        return self._portal.device_usage(start=start, end=end).devices

    def alerts(self, tenant: str | None = None) -> list[AlertOut]:
        """Pending and firing alerts the viewer may see, newest first; with ``tenant``, only
        that tenant's (the portal filters, so nothing of other tenants is sent)."""
        return self._portal.alerts(tenant, states=("pending", "firing"))

    def cost(
        self,
        group_by: Sequence[str],
        *,
        step: str = "whole",
        start: datetime | None = None,
        end: datetime | None = None,
        tenant: str | None = None,
    ) -> CostSummaryOut:
        return self._portal.cost(start=start, end=end, step=step, group_by=group_by, tenant=tenant)

    def budgets(self, tenant: str | None = None) -> list[BudgetOut]:
        return self._portal.budgets(tenant)

    def service_hours(
        self, *, start: datetime, end: datetime, tenant: str | None = None
    ) -> ServiceCostOut:
        return self._portal.service_hours(start=start, end=end, tenant=tenant)

    def capacity_forecast(self, *, weeks: int | None = None) -> CapacityForecastOut:
        return self._portal.capacity_forecast(weeks=weeks)

    def services(self, tenant: str | None = None) -> list[ServiceOut]:
        """Every service the viewer may read (of ``tenant``), deleted ones included, with
        their live replicas and the gateway's counts."""
        return [s.info for s in self._portal.services.list(tenant)]

    def chargeback_csv(
        self, *, start: datetime | None = None, end: datetime | None = None, step: str = "day"
    ) -> str:
        return self._portal.chargeback(start=start, end=end, step=step)

    def ray_clusters(self, tenant: str | None = None) -> list[RayOut]:
        """Every Ray cluster the viewer may read (of ``tenant``), stopped ones included,
        with their slices."""
        return self._portal.ray.list(tenant)

    def ray_costs(
        self, tenant: str | None = None, *, ended_since: datetime | None = None
    ) -> list[RayCostOut]:
        """The cost of every Ray cluster the viewer may read (of ``tenant``), in one read."""
        return self._portal.ray.costs(tenant, ended_since=ended_since)

    def jobs(self) -> list[JobOut]:
        """Every job the viewer may read (ended ones included), in submission order."""
        return [j.info for j in self._portal.jobs.list()]

    def job_attempts(self, job_id: str) -> list[AttemptOut]:
        return self._portal.jobs.attempts(job_id)

    def job_cost(self, job_id: str) -> JobCostOut:
        return self._portal.jobs.cost(job_id)

    def job_log(self, job_id: str, *, attempt: int | None, offset: int) -> LogOut:
        """Rank 0's log of ``attempt`` (None: the current one) from byte ``offset``."""
        return self._portal.jobs.read_logs(job_id, attempt, 0, offset)

    def submit_job(self, body: JobDraft) -> JobOut:
        job = self._portal.jobs.submit(
            body.tenant,
            body.command,
            members=body.members,
            flavor=body.flavor,
            count=body.count,
            cwd=body.cwd,
            checkpoint_dir=body.checkpoint_dir,
            topology=body.topology,
            topology_mode=body.topology_mode,
            max_restarts=body.max_restarts,
        )
        return job.info

    def cancel_job(self, job_id: str) -> JobOut:
        return self._portal.jobs.cancel(job_id)
