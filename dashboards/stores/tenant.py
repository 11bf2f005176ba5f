"""One tenant's quotas, usage, queue, members, alerts and quota edits for the Tenant view."""

from __future__ import annotations

import time
from dataclasses import dataclass

import param

from dashboards.stores.base import MAX_UNITS, UTILIZATION_WINDOW_S, Store, in_words, not_shown
from dashboards.stores.cost import measured
from policies.errors import PortalError
from policies.flavors import Flavor, FlavorKind
from portal.api.alerts import AlertOut
from portal.api.cost import CostGroupOut
from portal.api.schemas import QueueEntryOut, QuotaOut, UsageOut, WorkloadOut


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
    usage = param.List(default=[], item_type=UsageOut, doc="Per flavor: guaranteed .. lent.")
    quotas = param.List(default=[], item_type=QuotaOut, doc="Per flavor, with versions (ETags).")
    queue = param.List(default=[], item_type=QueueEntryOut, doc="The tenant's pending workloads.")
    message = param.String(default="", doc="Result of the last save: what changed or why not.")
    workloads = param.List(default=[], item_type=WorkloadOut, doc="Running and queued workloads.")
    spend = param.List(default=None, allow_None=True, item_type=CostGroupOut, doc="Per owner.")
    latest = param.Dict(default={}, doc="Running workload id -> latest utilization % or None.")
    alerts = param.List(default=[], item_type=AlertOut, doc="The tenant's alerts.")
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
        spend: list[CostGroupOut] | None = None
        try:
            spend = list(self.source.cost(["owner"], tenant=self.tenant).groups)
        except PortalError as exc:
            notes.append(not_shown("GPU-hours and efficiency", exc))
        latest = self._latest(workloads, notes)
        alerts: list[AlertOut] = []
        try:
            alerts = self.source.alerts(self.tenant)
        except PortalError as exc:
            notes.append(not_shown("alerts", exc))
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
        self._set_changed(read)

    def _latest(self, workloads: list[WorkloadOut], notes: list[str]) -> dict[str, float | None]:
        """The last measured minute of each running workload within the last five; one
        series read for every workload the viewer may see (no read when none runs)."""
        running = [w.id for w in workloads if w.state == "running"]
        if not running:
            return {}
        now = float(self.clock())
        try:
            series = self.source.series(
                start=now - UTILIZATION_WINDOW_S, end=now, tenant=self.tenant
            )
        except PortalError as exc:
            notes.append(not_shown("GPU utilization", exc))
            return {}
        out: dict[str, float | None] = {}
        for wid in running:
            if wid in series:
                measured = [p.utilization_avg for p in series[wid] if p.utilization_avg is not None]
                out[wid] = measured[-1] if measured else None
        if len(out) < len(running):
            notes.append(
                f"not shown: GPU utilization of {len(running) - len(out)} running workloads "
                "(the portal sent no series for them)"
            )
        return out

    def members(self) -> list[Member]:
        """Everyone with live workloads or GPU-hours this month, most GPU-hours first."""
        live: dict[str, list[WorkloadOut]] = {}
        for w in self.workloads:
            live.setdefault(w.owner, []).append(w)
        spent = {g.owner: g for g in self.spend or () if g.owner is not None}
        out = []
        for owner in live.keys() | spent.keys():
            mine, g = live.get(owner, []), spent.get(owner)
            hours = g.allocated_gpu_hours if g else None if self.spend is None else 0.0
            known = g if g is not None and measured(g) else None
            out.append(
                Member(
                    owner=owner,
                    running=sum(1 for w in mine if w.state == "running"),
                    queued=sum(1 for w in mine if w.state == "queued"),
                    whole_gpus=sum(
                        d.amount
                        for w in mine
                        for d in w.allocations
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

    def quota(self, flavor: str) -> QuotaOut | None:
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
            self.message = f"not saved: {in_words(exc)}"
            return False
        self.message = (
            f"saved {saved.flavor}: guaranteed {saved.guaranteed}, limit {saved.limit} "
            f"(version {saved.version})"
        )
        self.refresh()
        return True
