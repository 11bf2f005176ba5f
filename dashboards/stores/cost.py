"""Cost, GPU-hours, budgets and chargeback for the Cost view."""

from __future__ import annotations

from decimal import Decimal

import param

from dashboards.stores.base import Store
from portal.api.cost import BudgetOut, CostGroupOut, CostSummaryOut, ServiceHoursOut


def cost(g: CostGroupOut) -> Decimal:
    """``g``'s cost as a number (the portal sends whole cents as text, so nothing is lost)."""
    return Decimal(g.cost)


def idle_cost(g: CostGroupOut) -> Decimal | None:
    """``g``'s idle spend as a number; None without utilization data."""
    return None if g.idle_cost is None else Decimal(g.idle_cost)


def measured(g: CostGroupOut) -> bool:
    """Whether any of ``g``'s time was measured. The portal counts unmeasured time as unused
    and not idle, so no use and no idle spend means no utilization data (unknown, not 0 %).
    (A group measured at exactly 0 % on GPUs priced at 0 reads as unknown too: the portal's
    figures cannot tell the two apart.)"""
    if g.used_gpu_hours is None or g.efficiency is None:
        return False
    return g.used_gpu_hours > 0 or bool(idle_cost(g))


def efficiency(g: CostGroupOut) -> float | None:
    """``g``'s efficiency (used / allocated), None when nothing of it was measured."""
    return g.efficiency if measured(g) else None


class CostStore(Store):
    """Cost this month (the portal's default window) by tenant and day, by flavor, by owner,
    and budgets (``cost:read``; a filtered scope shows only its tenants)."""

    daily = param.List(default=[], item_type=CostGroupOut, doc="Per tenant and UTC day.")
    flavors = param.List(default=[], item_type=CostGroupOut, doc="Per flavor.")
    owners = param.List(default=[], item_type=CostGroupOut, doc="Per tenant and owner.")
    budgets = param.List(default=[], item_type=BudgetOut, doc="Budgets with burn and forecast.")
    services = param.List(
        default=[], item_type=ServiceHoursOut, doc="Services' warm and serving GPU-hours."
    )
    report = param.ClassSelector(class_=CostSummaryOut, default=None, allow_None=True)

    def _read(self) -> None:
        daily = self.source.cost(["tenant", "period"], step="day")
        # One window for all three, so the tables add up to the same total.
        flavors = self.source.cost(["flavor"], start=daily.start, end=daily.end)
        # Idle spend per owner exists only with utilization data: skip the read without it.
        owners = (
            self.source.cost(["tenant", "owner"], start=daily.start, end=daily.end).groups
            if daily.measured
            else []
        )
        budgets = self.source.budgets()
        services = self.source.service_hours(start=daily.start, end=daily.end).services
        read = {
            "daily": list(daily.groups),
            "flavors": list(flavors.groups),
            "owners": list(owners),
            "budgets": budgets,
            "services": list(services),
            "report": daily,
        }
        self._set_changed(read)

    def stacked(self) -> list[tuple[str, str, float, float]]:
        """(UTC day, tenant, cost, GPU-hours) per tenant and day: the stacked bars."""
        return [
            (
                g.period_start.strftime("%m-%d") if g.period_start else "",
                g.tenant or "",
                float(cost(g)),
                g.allocated_gpu_hours,
            )
            for g in self.daily
        ]

    def tenant_totals(self) -> dict[str, Decimal]:
        """Cost per tenant over the window, from the daily groups' exact cents."""
        out: dict[str, Decimal] = {}
        for g in self.daily:
            out[g.tenant or ""] = out.get(g.tenant or "", Decimal(0)) + cost(g)
        return out

    def top_idle(self, n: int = 5) -> list[CostGroupOut]:
        """Owners with the most idle spend; empty without utilization data."""
        idle = [g for g in self.owners if idle_cost(g)]
        return sorted(idle, key=lambda g: idle_cost(g) or 0, reverse=True)[:n]

    def chargeback(self) -> str:
        """The chargeback CSV of the shown window, per day."""
        r = self.report
        return self.source.chargeback_csv(
            start=r.start if r else None, end=r.end if r else None, step="day"
        )
