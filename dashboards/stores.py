"""Data stores of the dashboards: ``param.Parameterized`` objects that own data, no widgets.

Each store reads one ``Source`` (the portal API as the viewer) in ``refresh()`` and exposes
the numbers its view draws as plain methods, so tests check the numbers without a browser and
views only lay them out. ``refresh()`` replaces the data parameters; views that depend on them
re-render in place (live updates without page reloads).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

import httpx
import param

from dashboards.sources import (
    AlertInfo,
    Budget,
    Capacity,
    CostGroup,
    CostReport,
    NodeInfo,
    QueueEntry,
    Quota,
    Source,
    Usage,
    UsagePoint,
    Workload,
)
from policies.errors import PortalError
from policies.flavors import Flavor, FlavorKind
from portal.api.auth import Caller, Scope

MAX_UNITS = 10_000_000  # the API's bound on guaranteed and limit
HEALTH_RULES = ("xid", "throttle", "ecc")  # the alerts about a GPU's health, not its use
USAGE_WINDOW_S = 3600.0  # My work plots the last hour, by the minute
UTILIZATION_WINDOW_S = 300.0  # the heatmap's "now": the last minute measured in 5


class Store(param.Parameterized):
    """Base: the source, when data was last read, and the last read error (a sentence)."""

    updated = param.Date(default=None, allow_None=True, doc="When refresh() last succeeded.")
    error = param.String(default="", doc="Why the last refresh failed; '' when it did not.")

    def __init__(self, source: Source, **params: object) -> None:
        super().__init__(**params)
        self.source = source

    def refresh(self) -> None:
        """Read the data again; a portal error lands in ``error`` instead of raising."""
        try:
            self._read()
        except PortalError as exc:
            self.error = exc.message
            return
        except httpx.HTTPError as exc:
            self.error = f"the portal did not answer ({type(exc).__name__}: {exc}); retrying"
            return
        self.error = ""
        self.updated = datetime.now(UTC)

    def _read(self) -> None:
        raise NotImplementedError


# ------------------------------------------------------------------ cluster


@dataclass(frozen=True, slots=True)
class FreeCapacity:
    flavor: str
    capacity: int
    free: int


class ClusterStore(Store):
    """Nodes, GPUs, MIG layouts and topology (``inventory:read``)."""

    nodes = param.List(default=[], item_type=NodeInfo, doc="Every node, by name, no topology.")
    capacity = param.List(default=[], item_type=Capacity, doc="Units per flavor.")
    selected = param.String(default="", doc="The node whose topology and MIG layout are shown.")
    detail = param.ClassSelector(
        class_=NodeInfo, default=None, allow_None=True, doc="The selected node with topology."
    )

    health = param.List(default=[], item_type=AlertInfo, doc="XID, throttling, ECC alerts.")
    health_note = param.String(default="", doc="Why node health is not shown.")
    metric: param.Selector[str] = param.Selector(
        default="allocation", objects=["allocation", "utilization"], doc="What the heatmap shows."
    )
    utilization = param.Dict(
        default={}, doc="(node, GPU index) -> latest 1-minute utilization % (MIG: busiest)."
    )
    utilization_note = param.String(default="", doc="Why utilization is not shown.")
    clock = param.Callable(default=time.time, doc="Epoch seconds: the end of usage windows.")

    def _read(self) -> None:
        # Topology (an 8 x 8 link matrix per node) only for the node shown: without it the
        # read of every node is what a live update of a large cluster can afford.
        nodes = self.source.nodes(topology=False)
        names = {n.name for n in nodes}
        selected = self.selected if self.selected in names else (nodes[0].name if nodes else "")
        detail = self.source.node(selected) if selected else None
        capacity = self.source.capacity()
        health, note = self._health()
        # Read only while shown: one more request per refresh.
        utilization, unmeasured = (
            self._utilization(nodes) if self.metric == "utilization" else ({}, "")
        )
        read = {
            "nodes": nodes,
            "capacity": capacity,
            "health": health,
            "health_note": note,
            "utilization": utilization,
            "utilization_note": unmeasured,
            "detail": detail,
            "selected": selected,
        }
        # Only what changed (param finds a new list of records always changed): an unchanged
        # cluster redraws nothing, and 10,000 GPUs compare in milliseconds.
        self.param.update({k: v for k, v in read.items() if v != getattr(self, k)})

    @param.depends("selected", watch=True)
    def _node_chosen(self) -> None:
        # Another node picked: its topology now, not at the next live update.
        if not self.selected or (self.detail is not None and self.detail.name == self.selected):
            return
        try:
            self.detail = self.source.node(self.selected)
        except PortalError as exc:
            self.error = exc.message

    @param.depends("metric", watch=True)
    def _metric_chosen(self) -> None:
        # The heatmap switched: read what it now shows at once, not at the next live update.
        self.refresh()

    def _utilization(self, nodes: list[NodeInfo]) -> tuple[dict[tuple[str, int], float], str]:
        """Each GPU's latest 1-minute utilization from the portal's per-device read, and why
        none is shown ('' when read). A MIG GPU shows its busiest instance (the max: one
        saturated instance makes the GPU a busy one, and an idle GPU is idle in all of them);
        a shared GPU shows the whole GPU's figure."""
        now = float(self.clock())
        try:
            usage = self.source.device_usage(start=now - UTILIZATION_WINDOW_S, end=now)
        except PortalError as exc:
            return {}, f"not shown: utilization: {exc.message}"
        where = {g.uuid: (g.node, g.index) for n in nodes for g in n.gpus if g.uuid}
        cells: dict[tuple[str, int], float] = {}
        for d in usage:
            cell = where.get(d.gpu_uuid)
            if cell is not None:
                cells[cell] = max(d.utilization, cells.get(cell, d.utilization))
        return cells, ""

    def _health(self) -> tuple[list[AlertInfo], str]:
        # Device alerts are the platform's: only unfiltered workloads:read holders see them.
        try:
            alerts = self.source.alerts()
        except PortalError as exc:
            return [], f"not shown: node health: {exc.message}"
        return [a for a in alerts if a.rule in HEALTH_RULES], ""

    def where(self, scope: str) -> tuple[str, str]:
        """(node, GPU) an alert's scope names: a device's GPU by its UUID, or ``node:<n>``;
        the scope itself when the inventory does not know it."""
        if scope.startswith("node:"):
            return scope.removeprefix("node:"), "—"
        uuid, _, instance = scope.partition("/")
        for n in self.nodes:
            for g in n.gpus:
                if g.uuid and g.uuid == uuid:
                    return n.name, f"{g.index}" + (f" ({instance})" if instance else "")
        return scope, "—"

    def allocation(self) -> list[tuple[str, int, float]]:
        """(node, GPU index, allocated fraction 0..1) for every GPU: the heatmap's cells."""
        return [(g.node, g.index, g.allocated_milli / 1000) for n in self.nodes for g in n.gpus]

    def totals(self) -> tuple[int, float]:
        """(GPUs, GPUs' worth allocated)."""
        cells = self.allocation()
        return len(cells), sum(c[2] for c in cells)

    def free_by_flavor(self) -> list[FreeCapacity]:
        """Free units per flavor, counted as ``/capacity`` counts capacity: whole free non-MIG
        GPUs, free milli of shareable GPUs, free MIG instances per profile."""
        free: Counter[str] = Counter()
        for n in self.nodes:
            if not n.schedulable:
                continue
            for g in n.gpus:
                if g.mig_enabled:
                    for s in g.mig_layout:
                        free[str(Flavor(FlavorKind.MIG, g.model, s.profile))] += int(s.free)
                    continue
                free[g.model] += int(g.free_milli == 1000)
                if g.shareable:
                    free[str(Flavor(FlavorKind.SHARE, g.model))] += g.free_milli
        return [FreeCapacity(c.flavor, c.capacity, free[c.flavor]) for c in self.capacity]

    def fragmentation(self) -> float:
        """Share of free whole GPUs stranded on partly used nodes (0: every free GPU is on an
        empty node, so whole-node requests fit; 1: none is). 0 when nothing is free."""
        free_total = 0
        stranded = 0
        for n in self.nodes:
            whole = [g for g in n.gpus if not g.mig_enabled]
            free = sum(1 for g in whole if g.free_milli == 1000)
            free_total += free
            if free < len(whole):
                stranded += free
        return stranded / free_total if free_total else 0.0

    def node(self) -> NodeInfo | None:
        """The selected node, with its topology once read."""
        if self.detail is not None and self.detail.name == self.selected:
            return self.detail
        return next((n for n in self.nodes if n.name == self.selected), None)

    def link_classes(self) -> list[tuple[int, int, str]]:
        """(GPU i, GPU j, link class) of the selected node; empty when its topology is unknown."""
        node = self.node()
        if node is None or node.links is None:
            return []
        return [(i, j, c) for i, row in enumerate(node.links) for j, c in enumerate(row) if i != j]

    def mig_layouts(self) -> list[tuple[int, str, int, bool]]:
        """(GPU index, profile, start slice, free) of the selected node's MIG instances."""
        node = self.node()
        if node is None:
            return []
        return [(g.index, s.profile, s.start, s.free) for g in node.gpus for s in g.mig_layout]

    def mig_layout_counts(self) -> list[tuple[str, str, int]]:
        """(model, layout as profiles by start, GPUs): which MIG layouts the cluster has."""
        counts: Counter[tuple[str, str]] = Counter()
        for n in self.nodes:
            for g in n.gpus:
                if g.mig_enabled:
                    layout = " + ".join(s.profile for s in sorted(g.mig_layout, key=_start))
                    counts[(g.model, layout or "(empty)")] += 1
        return [(m, lay, k) for (m, lay), k in sorted(counts.items())]


def _start(s: object) -> int:
    start: int = getattr(s, "start", 0)
    return start


# ------------------------------------------------------------------ tenant


@dataclass(frozen=True, slots=True)
class QuotaDraft:
    """A quota edit being prepared; numbers as typed, checked by ``TenantStore.check``."""

    flavor: str
    guaranteed: int
    limit: int
    budget_gpu_hours: float | None


@dataclass(frozen=True, slots=True)
class Member:
    """A member's part of the tenant: live workloads and, this month (None: the viewer may
    not read cost), GPU-hours held, used GPU-hours and efficiency (None: not measured)."""

    owner: str
    running: int
    queued: int
    whole_gpus: int
    gpu_hours: float | None
    used_gpu_hours: float | None
    efficiency: float | None


class TenantStore(Store):
    """One tenant's quota use, quotas, queue, members' workloads and efficiency, and alerts;
    the quota editor's validation and save."""

    tenant = param.String(default="", doc="The tenant shown.")
    usage = param.List(default=[], item_type=Usage, doc="Per flavor: guaranteed .. lent.")
    quotas = param.List(default=[], item_type=Quota, doc="Per flavor, with versions (ETags).")
    queue = param.List(default=[], item_type=QueueEntry, doc="The tenant's pending workloads.")
    message = param.String(default="", doc="Result of the last save: what changed or why not.")
    workloads = param.List(default=[], item_type=Workload, doc="Running and queued workloads.")
    spend = param.List(default=None, allow_None=True, item_type=CostGroup, doc="Per owner.")
    latest = param.Dict(default={}, doc="Running workload id -> latest utilization % or None.")
    alerts = param.List(default=[], item_type=AlertInfo, doc="The tenant's alerts.")
    note = param.String(default="", doc="What is not shown, and why.")
    clock = param.Callable(default=time.time, doc="Epoch seconds: the end of usage windows.")

    def _read(self) -> None:
        if not self.tenant:
            return
        usage = self.source.usage(self.tenant)
        quotas = self.source.quotas(self.tenant)
        queue = self.source.queue(self.tenant)
        workloads = self.source.workloads(self.tenant)
        # Members' figures and alerts need scopes a member may lack: the rest still shows.
        notes: list[str] = []
        spend: list[CostGroup] | None = None
        try:
            spend = list(self.source.cost(["owner"], tenant=self.tenant).groups)
        except PortalError as exc:
            notes.append(f"not shown: GPU-hours and efficiency: {exc.message}")
        latest = self._latest(workloads, notes)
        alerts: list[AlertInfo] = []
        try:
            alerts = self.source.alerts(self.tenant)
        except PortalError as exc:
            notes.append(f"not shown: alerts: {exc.message}")
        read = {
            "usage": usage,
            "quotas": quotas,
            "queue": queue,
            "workloads": workloads,
            "spend": spend,
            "latest": latest,
            "alerts": alerts,
            "note": "; ".join(notes),
        }
        # Only what changed: param finds lists of records always changed, and re-rendering
        # the quota bars on every live update costs more than all of the reads.
        self.param.update({k: v for k, v in read.items() if v != getattr(self, k)})

    def _latest(self, workloads: list[Workload], notes: list[str]) -> dict[str, float | None]:
        """The last measured minute of each running workload within the last five; one
        series read for every workload the viewer may see (no read when none runs)."""
        running = [w.id for w in workloads if w.state == "running"]
        if not running:
            return {}
        now = float(self.clock())
        try:
            series = self.source.series(start=now - UTILIZATION_WINDOW_S, end=now)
        except PortalError as exc:
            notes.append(f"not shown: GPU utilization: {exc.message}")
            return {}
        out: dict[str, float | None] = {}
        for wid in running:
            if wid in series:
                measured = [p.utilization for p in series[wid] if p.utilization is not None]
                out[wid] = measured[-1] if measured else None
        if len(out) < len(running):
            notes.append(
                f"not shown: GPU utilization of {len(running) - len(out)} running workloads "
                "(the portal sent no series for them)"
            )
        return out

    def members(self) -> list[Member]:
        """Everyone with live workloads or GPU-hours this month, most GPU-hours first."""
        live: dict[str, list[Workload]] = {}
        for w in self.workloads:
            live.setdefault(w.owner, []).append(w)
        spent = {g.owner: g for g in self.spend or () if g.owner is not None}
        out = []
        for owner in live.keys() | spent.keys():
            mine, g = live.get(owner, []), spent.get(owner)
            hours = g.allocated_gpu_hours if g else None if self.spend is None else 0.0
            known = g if g is not None and _measured(g) else None
            out.append(
                Member(
                    owner=owner,
                    running=sum(1 for w in mine if w.state == "running"),
                    queued=sum(1 for w in mine if w.state == "queued"),
                    whole_gpus=sum(
                        d.amount
                        for w in mine
                        for d in w.devices
                        if Flavor.parse(d.flavor).kind is FlavorKind.GPU
                    ),
                    gpu_hours=hours,
                    used_gpu_hours=known.used_gpu_hours if known else None,
                    efficiency=known.efficiency if known else None,
                )
            )
        return sorted(out, key=lambda m: (-(m.gpu_hours or 0.0), m.owner))

    def bars(self) -> list[tuple[str, str, int]]:
        """(flavor, measure, units) for guaranteed, limit, in use, borrowed and lent."""
        out: list[tuple[str, str, int]] = []
        for u in self.usage:
            for measure, value in (
                ("guaranteed", u.guaranteed),
                ("limit", u.limit),
                ("in use", u.used),
                ("borrowed", u.borrowed),
                ("lent", u.lent),
            ):
                out.append((u.flavor, measure, value))
        return out

    def quota(self, flavor: str) -> Quota | None:
        return next((q for q in self.quotas if q.flavor == flavor), None)

    def check(self, draft: QuotaDraft) -> str:
        """'' when ``draft`` may be saved; otherwise what is wrong, with the value and what
        would be valid. The portal checks again; this only saves a round trip."""
        if self.quota(draft.flavor) is None:
            known = ", ".join(q.flavor for q in self.quotas) or "none"
            return f"unknown flavor {draft.flavor!r} for tenant {self.tenant}; quotas: {known}"
        for name, value in (("guaranteed", draft.guaranteed), ("limit", draft.limit)):
            if not 0 <= value <= MAX_UNITS:
                return f"invalid {name} {value}: expected a whole number 0..{MAX_UNITS:,}"
        if draft.limit < draft.guaranteed:
            return f"invalid limit {draft.limit}: expected at least guaranteed ({draft.guaranteed})"
        budget = draft.budget_gpu_hours
        if budget is not None and not 0 <= budget <= 1e9:
            return f"invalid budget_gpu_hours {budget}: expected 0..1e9 GPU-hours, or empty"
        return ""

    def preview(self, draft: QuotaDraft) -> list[str]:
        """What the edit would do to what runs and waits now, from the current usage."""
        use = next((u for u in self.usage if u.flavor == draft.flavor), None)
        used = use.used if use else 0
        own = used - (use.borrowed if use else 0)
        lines: list[str] = []
        if draft.limit < used:
            lines.append(
                f"{used - draft.limit} of {used} units in use are over the new limit "
                f"{draft.limit}: borrowed ones are reclaimed first, then the lowest priority"
            )
        else:
            lines.append(f"{draft.limit - used} units left under the new limit ({used} in use)")
        if draft.guaranteed < own:
            lines.append(
                f"{own - draft.guaranteed} units now within guaranteed become borrowed "
                "(preemptible)"
            )
        waiting = [e for e in self.queue if e.reason == "quota"]
        if waiting:
            lines.append(f"{len(waiting)} workloads wait for quota in this tenant")
        return lines

    def save(self, draft: QuotaDraft) -> bool:
        """Check ``draft`` and save it with the quota's ETag; ``message`` says what happened.
        A refused edit (here or by the portal) changes nothing."""
        problem = self.check(draft)
        if problem:
            self.message = problem
            return False
        current = self.quota(draft.flavor)
        assert current is not None  # check() found it
        try:
            saved = self.source.set_quota(
                self.tenant,
                draft.flavor,
                guaranteed=draft.guaranteed,
                limit=draft.limit,
                budget_gpu_hours=draft.budget_gpu_hours,
                version=current.version,
            )
        except PortalError as exc:
            self.message = f"not saved: {exc.message}"
            return False
        self.message = (
            f"saved {saved.flavor}: guaranteed {saved.guaranteed}, limit {saved.limit} "
            f"(version {saved.version})"
        )
        self.refresh()
        return True


def _measured(g: CostGroup) -> bool:
    """Whether any of ``g``'s time was measured. The portal counts unmeasured time as unused
    and not idle, so no use and no idle spend means no utilization data (unknown, not 0 %)."""
    if g.used_gpu_hours is None or g.efficiency is None:
        return False
    return g.used_gpu_hours > 0 or bool(g.idle_cost)


# ------------------------------------------------------------------ my work


class MyWorkStore(Store):
    """The viewer's own workloads with their devices, queue positions and reasons."""

    owner = param.String(default="", doc="The viewer: workloads they own are shown.")
    workloads = param.List(default=[], item_type=Workload, doc="Live workloads of the owner.")
    message = param.String(default="", doc="Result of the last stop or cancel.")
    usage = param.Dict(default={}, doc="Workload id -> 1-minute points of the last hour.")
    alerts = param.List(default=[], item_type=AlertInfo, doc="Alerts about the owner's work.")
    telemetry_note = param.String(default="", doc="Why usage or alerts are not shown.")
    clock = param.Callable(default=time.time, doc="Epoch seconds: the end of the usage window.")

    def _read(self) -> None:
        mine = [w for w in self.source.workloads() if w.owner == self.owner]
        ids = {w.id for w in mine}
        usage: dict[str, list[UsagePoint]] = {}
        alerts: list[AlertInfo] = []
        notes = []
        if any(w.state == "running" for w in mine):
            now = float(self.clock())
            try:
                series = self.source.series(start=now - USAGE_WINDOW_S, end=now)
            except PortalError as exc:  # e.g. no usage:read: the rest of the page still shows
                notes.append(f"not shown: GPU usage: {exc.message}")
            else:
                usage = {wid: points for wid, points in series.items() if wid in ids}
        try:
            alerts = [
                a
                for a in self.source.alerts()
                if a.owner == self.owner or ids.intersection(a.workloads)
            ]
        except PortalError as exc:
            notes.append(f"not shown: alerts: {exc.message}")
        self.workloads = mine
        self.usage = usage
        self.alerts = alerts
        self.telemetry_note = "; ".join(notes)

    def stop(self, workload_id: str) -> bool:
        """Release a running workload's devices or take a queued one out of the queue."""
        try:
            w = self.source.release(workload_id)
        except PortalError as exc:
            self.message = f"not stopped: {exc.message}"
            return False
        self.message = f"{w.name} ({w.id}): {w.state}"
        self.refresh()
        return True


# ------------------------------------------------------------------ cost


class CostStore(Store):
    """Cost this month (the portal's default window) by tenant and day, by flavor, by owner,
    and budgets (``cost:read``; a filtered scope shows only its tenants)."""

    daily = param.List(default=[], item_type=CostGroup, doc="Per tenant and UTC day.")
    flavors = param.List(default=[], item_type=CostGroup, doc="Per flavor.")
    owners = param.List(default=[], item_type=CostGroup, doc="Per tenant and owner.")
    budgets = param.List(default=[], item_type=Budget, doc="Budgets with burn and forecast.")
    report = param.ClassSelector(class_=CostReport, default=None, allow_None=True)

    def _read(self) -> None:
        daily = self.source.cost(["tenant", "period"], step="day")
        # One window for all three, so the tables add up to the same total.
        flavors = self.source.cost(["flavor"], start=daily.start, end=daily.end)
        # Idle spend per owner exists only with utilization data: skip the read without it.
        owners = (
            self.source.cost(["tenant", "owner"], start=daily.start, end=daily.end).groups
            if daily.measured
            else ()
        )
        budgets = self.source.budgets()
        read = {
            "daily": list(daily.groups),
            "flavors": list(flavors.groups),
            "owners": list(owners),
            "budgets": budgets,
            "report": daily,
        }
        # Only what changed, like the other stores: param counts lists of records as always
        # changed, and each change redraws a chart or a table.
        self.param.update({k: v for k, v in read.items() if v != getattr(self, k)})

    def stacked(self) -> list[tuple[str, str, float, float]]:
        """(UTC day, tenant, cost, GPU-hours) per tenant and day: the stacked bars."""
        return [
            (
                g.period_start.strftime("%m-%d") if g.period_start else "",
                g.tenant or "",
                float(g.cost),
                g.allocated_gpu_hours,
            )
            for g in self.daily
        ]

    def tenant_totals(self) -> dict[str, Decimal]:
        """Cost per tenant over the window, from the daily groups' exact cents."""
        out: dict[str, Decimal] = {}
        for g in self.daily:
            out[g.tenant or ""] = out.get(g.tenant or "", Decimal(0)) + g.cost
        return out

    def top_idle(self, n: int = 5) -> list[CostGroup]:
        """Owners with the most idle spend; empty without utilization data."""
        idle = [g for g in self.owners if g.idle_cost]
        return sorted(idle, key=lambda g: g.idle_cost or 0, reverse=True)[:n]

    def chargeback(self) -> str:
        """The chargeback CSV of the shown window, per day."""
        r = self.report
        return self.source.chargeback_csv(
            start=r.start if r else None, end=r.end if r else None, step="day"
        )


# ------------------------------------------------------------------ who sees what


@dataclass(frozen=True, slots=True)
class Link:
    view: str
    title: str
    why: str


def views_for(viewer: Caller) -> list[Link]:
    """The views ``viewer``'s scopes open, in the landing page's order. Only a hint: every
    request is still checked by the portal with the viewer's token."""
    out: list[Link] = []
    if viewer.holds_any(Scope.WORKLOADS_READ) or viewer.holds_any(Scope.WORKLOADS_WRITE):
        out.append(Link("my_work", "My work", "your servers, jobs and services"))
    tenants = tenants_for(viewer, Scope.QUOTAS_READ)
    if tenants or viewer.can_everywhere(Scope.QUOTAS_READ):
        out.append(Link("tenant", "Tenant", "quota, queue and quota editor per tenant"))
    if viewer.holds_any(Scope.INVENTORY_READ):
        out.append(Link("cluster", "Cluster", "nodes, GPUs, MIG layouts, topology"))
    if viewer.holds_any(Scope.COST_READ):
        out.append(Link("cost", "Cost", "GPU-hours and money by tenant"))
    return out


def tenants_for(viewer: Caller, scope: Scope) -> list[str]:
    """Tenants ``viewer`` holds ``scope`` for by a group filter or as a member, sorted.
    Unfiltered holders see every tenant: read those from the portal instead."""
    named = set(viewer.tenants_for(scope))
    if viewer.can_everywhere(scope):
        named |= set(viewer.groups)
    return sorted(named)
