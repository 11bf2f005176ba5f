"""Where the dashboards get their data: a small typed ``Source`` over the portal API.

Stores depend on the ``Source`` protocol only, so they are tested against the real API and
a view works as soon as the routes it reads exist. ``ApiSource`` speaks ``/api/v1`` with the
*viewer's* JupyterHub token: the portal decides what that person may see, the dashboards never
widen it. Records are frozen and typed; JSON stops at this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

from portal.api.schemas import (
    CapacityOut,
    GpuOut,
    NodeOut,
    QueueEntryOut,
    QuotaOut,
    UsageOut,
    WorkloadOut,
)
from portal.client import Expired, Portal

if TYPE_CHECKING:
    from portal.api.cost import BudgetOut  # a route module: only for the annotation

# ------------------------------------------------------------------ records

# The client's own records where the dashboards need the same fields: one definition each
# (``portal.api.schemas``), read as the client returns them, never copied field by field.
Capacity = CapacityOut
Quota = QuotaOut
Usage = UsageOut
QueueEntry = QueueEntryOut


@dataclass(frozen=True, slots=True)
class MigSlot:
    profile: str
    start: int
    free: bool


@dataclass(frozen=True, slots=True)
class Gpu:
    node: str
    index: int
    model: str
    memory_mib: int
    mig_enabled: bool
    shareable: bool
    free_milli: int
    mig_layout: tuple[MigSlot, ...]
    uuid: str = ""  # '' when the inventory does not know it

    @property
    def allocated_milli(self) -> int:
        """Share held by workloads: a MIG GPU counts its used slots' memory slices."""
        if self.mig_enabled and self.mig_layout:
            used = sum(1 for s in self.mig_layout if not s.free)
            return round(1000 * used / len(self.mig_layout))
        return 1000 - self.free_milli


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    schedulable: bool
    rack: str
    pool: str
    gpus: tuple[Gpu, ...]
    links: tuple[tuple[str, ...], ...] | None
    numa: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class NodeChanges:
    """Nodes read at ``version``: every node (``complete``), or those added or changed since
    the version asked about and the names of those removed."""

    version: str
    nodes: list[NodeInfo]
    removed: list[str]
    complete: bool


@dataclass(frozen=True, slots=True)
class Device:
    """What one allocation of a workload holds."""

    node: str
    gpus: tuple[int, ...]
    flavor: str
    amount: int
    borrowed: bool


@dataclass(frozen=True, slots=True)
class Workload:
    id: str
    tenant: str
    owner: str
    name: str
    kind: str
    state: str
    reason: str
    message: str
    position: int | None
    eta_s: float | None
    devices: tuple[Device, ...]


@dataclass(frozen=True, slots=True)
class CostGroup:
    """One group of a cost summary; keys not grouped by are None. Money is in whole cents
    (the portal rounds); ``used_gpu_hours``, ``efficiency`` and ``idle_cost`` are None when
    no utilization was measured."""

    tenant: str | None
    owner: str | None
    flavor: str | None
    period_start: datetime | None
    allocated_gpu_hours: float
    used_gpu_hours: float | None
    efficiency: float | None
    cost: Decimal
    idle_cost: Decimal | None


@dataclass(frozen=True, slots=True)
class CostReport:
    start: datetime
    end: datetime
    currency: str
    measured: bool
    unpriced_models: tuple[str, ...]
    groups: tuple[CostGroup, ...]
    total: CostGroup


@dataclass(frozen=True, slots=True)
class Budget:
    tenant: str
    flavor: str | None
    kind: str
    period_end: datetime
    budget: float
    spent: float
    projected: float
    over: bool
    exhausted_at: datetime | None


@dataclass(frozen=True, slots=True)
class UsagePoint:
    """One minute of a workload's GPUs: utilization in % of its allocation (None: not
    measured) and memory used in MiB, from ``/telemetry/series``."""

    at: float
    utilization: float | None
    memory_mib: float


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """A device's latest measured minute, from ``/telemetry/devices``: a whole GPU
    (``device == gpu_uuid``) or a MIG instance of it (``<GPU UUID>/gi<id>``); ``utilization``
    None: not measured (a MIG instance of an A100 or A30), its memory still is."""

    device: str
    gpu_uuid: str
    node: str
    at: float
    utilization: float | None
    memory_mib: float


@dataclass(frozen=True, slots=True)
class AlertInfo:
    rule: str
    state: str
    scope: str  # where: a device (GPU UUID, or <UUID>/gi<id>), node:<n>, a tenant
    summary: str
    owner: str | None
    workloads: tuple[str, ...]
    value: float


class Source(Protocol):
    """What the stores read and change. Every call acts as the viewer; errors are
    the client's ``PortalError`` subclasses (the portal's error body, or no answer)."""

    origin: str
    """The portal read: records of one origin that are the same for every viewer (the
    inventory) may be shared between the stores of different viewers."""

    def tenants(self) -> list[str]: ...
    def node_changes(self, since: str | None, *, topology: bool = True) -> NodeChanges: ...
    def node(self, name: str) -> NodeInfo: ...
    def capacity(self) -> list[Capacity]: ...
    def quotas(self, tenant: str | None = None) -> list[Quota]: ...
    def usage(self, tenant: str | None = None) -> list[Usage]: ...
    def queue(self, tenant: str | None = None) -> list[QueueEntry]: ...
    def workloads(self, tenant: str | None = None) -> list[Workload]: ...
    def set_quota(
        self,
        tenant: str,
        flavor: str,
        *,
        guaranteed: int,
        limit: int,
        budget_gpu_hours: float | None,
        version: int,
    ) -> Quota: ...
    def release(self, workload_id: str) -> Workload: ...
    def series(
        self, *, start: float, end: float, tenant: str | None = None, owner: str | None = None
    ) -> dict[str, list[UsagePoint]]: ...
    def device_usage(self, *, start: float, end: float) -> list[DeviceUsage]: ...
    def alerts(self, tenant: str | None = None) -> list[AlertInfo]: ...
    def cost(
        self,
        group_by: Sequence[str],
        *,
        step: str = "whole",
        start: datetime | None = None,
        end: datetime | None = None,
        tenant: str | None = None,
    ) -> CostReport: ...
    def budgets(self, tenant: str | None = None) -> list[Budget]: ...
    def chargeback_csv(
        self, *, start: datetime | None = None, end: datetime | None = None, step: str = "day"
    ) -> str: ...


# ------------------------------------------------------------------ over /api/v1


def _gpu(node: str, g: GpuOut) -> Gpu:
    return Gpu(
        node=node,
        index=g.index,
        model=g.model,
        memory_mib=g.memory_mib,
        mig_enabled=g.mig_enabled,
        shareable=g.shareable,
        free_milli=g.free_milli,
        mig_layout=tuple(MigSlot(m.profile, m.start, m.free) for m in g.mig_layout),
        uuid=g.uuid,
    )


def _node(n: NodeOut) -> NodeInfo:
    # Straight from the client's typed answer: nodes are the largest read of the dashboards
    # (10,000 GPUs), and a JSON round trip per node doubled its cost.
    return NodeInfo(
        name=n.name,
        schedulable=n.schedulable,
        rack=n.rack,
        pool=n.pool,
        gpus=tuple(_gpu(n.name, g) for g in n.gpus),
        links=tuple(tuple(row) for row in n.links) if n.links is not None else None,
        numa=tuple(n.numa) if n.numa is not None else None,
    )


def _workload(w: WorkloadOut) -> Workload:
    return Workload(
        id=w.id,
        tenant=w.tenant,
        owner=w.owner,
        name=w.name,
        kind=w.kind,
        state=w.state.value,
        reason=w.reason,
        message=w.message,
        position=w.position,
        eta_s=w.eta_s,
        devices=tuple(
            Device(a.node, tuple(a.gpus), a.flavor, a.amount, a.borrowed) for a in w.allocations
        ),
    )


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

    # Capacity, quotas, usage and the queue are the client's records as it returns them; the
    # others become the dashboards' own shapes (the cost report through its JSON form: its
    # money is text there).

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
                return NodeChanges(ch.version, [_node(n) for n in ch.nodes], ch.removed, False)
        listed = self._portal.versioned_nodes(topology=topology)
        return NodeChanges(listed.version, [_node(n) for n in listed.value], [], True)

    def node(self, name: str) -> NodeInfo:
        """One node with its topology."""
        return _node(self._portal.node(name))

    def capacity(self) -> list[Capacity]:
        return self._portal.capacity()

    def quotas(self, tenant: str | None = None) -> list[Quota]:
        return self._portal.quotas(tenant)

    def usage(self, tenant: str | None = None) -> list[Usage]:
        return self._portal.usage(tenant)

    def queue(self, tenant: str | None = None) -> list[QueueEntry]:
        return self._portal.queue(tenant)

    def workloads(self, tenant: str | None = None) -> list[Workload]:
        return [_workload(w) for w in self._portal.workloads(tenant)]

    def set_quota(
        self,
        tenant: str,
        flavor: str,
        *,
        guaranteed: int,
        limit: int,
        budget_gpu_hours: float | None,
        version: int,
    ) -> Quota:
        saved = self._portal.set_quota(
            tenant,
            flavor,
            guaranteed=guaranteed,
            limit=limit,
            budget_gpu_hours=budget_gpu_hours,
            if_match=f'"{version}"',
        )
        return saved.value

    def release(self, workload_id: str) -> Workload:
        return _workload(self._portal.release(workload_id))

    def series(
        self, *, start: float, end: float, tenant: str | None = None, owner: str | None = None
    ) -> dict[str, list[UsagePoint]]:
        """1-minute points of every live workload the viewer may see (of ``tenant``, of
        ``owner``), by workload id."""
        page = self._portal.series(
            resolution="1m", start=start, end=end, tenant=tenant, owner=owner
        )
        return {
            s.workload_id: [
                UsagePoint(p.at, p.utilization_avg, p.memory_used_avg) for p in s.points
            ]
            for s in page.series
            if s.workload_id is not None
        }

    def device_usage(self, *, start: float, end: float) -> list[DeviceUsage]:
        """Each device's latest minute rolled up in ``[start, end)`` that the viewer may see."""
        return [
            DeviceUsage(d.device, d.gpu_uuid, d.node, d.at, d.utilization_avg, d.memory_used_avg)
            for d in self._portal.device_usage(start=start, end=end).devices
        ]

    def alerts(self, tenant: str | None = None) -> list[AlertInfo]:
        """Pending and firing alerts the viewer may see, newest first; with ``tenant``, only
        that tenant's (the portal filters, so nothing of other tenants is sent)."""
        return [
            AlertInfo(
                a.rule, str(a.state), a.scope, a.summary, a.owner, tuple(a.workloads), a.value
            )
            for a in self._portal.alerts(tenant, states=("pending", "firing"))
        ]

    def cost(
        self,
        group_by: Sequence[str],
        *,
        step: str = "whole",
        start: datetime | None = None,
        end: datetime | None = None,
        tenant: str | None = None,
    ) -> CostReport:
        body = self._portal.cost(
            start=start, end=end, step=step, group_by=group_by, tenant=tenant
        ).model_dump(mode="json")
        return CostReport(
            start=datetime.fromisoformat(body["start"]),
            end=datetime.fromisoformat(body["end"]),
            currency=str(body["currency"]),
            measured=bool(body["measured"]),
            unpriced_models=tuple(str(m) for m in body["unpriced_models"]),
            groups=tuple(_cost_group(g) for g in body["groups"]),
            total=_cost_group(body["total"]),
        )

    def budgets(self, tenant: str | None = None) -> list[Budget]:
        return [_budget(b) for b in self._portal.budgets(tenant)]

    def chargeback_csv(
        self, *, start: datetime | None = None, end: datetime | None = None, step: str = "day"
    ) -> str:
        return self._portal.chargeback(start=start, end=end, step=step)


def _when(raw: object) -> datetime | None:
    return None if raw is None else datetime.fromisoformat(str(raw))


def _cost_group(g: Mapping[str, Any]) -> CostGroup:
    used, eff, idle = g.get("used_gpu_hours"), g.get("efficiency"), g.get("idle_cost")
    return CostGroup(
        tenant=g.get("tenant"),
        owner=g.get("owner"),
        flavor=g.get("flavor"),
        period_start=_when(g.get("period_start")),
        allocated_gpu_hours=float(g["allocated_gpu_hours"]),
        used_gpu_hours=float(used) if used is not None else None,
        efficiency=float(eff) if eff is not None else None,
        cost=Decimal(str(g["cost"])),
        idle_cost=Decimal(str(idle)) if idle is not None else None,
    )


def _budget(b: BudgetOut) -> Budget:
    return Budget(
        tenant=b.tenant,
        flavor=b.flavor,
        kind=b.kind,
        period_end=b.period_end,
        budget=b.budget,
        spent=b.spent,
        projected=b.projected,
        over=b.over,
        exhausted_at=b.exhausted_at,
    )
