"""Cost view (leadership, read only): money and GPU-hours by tenant and day (stacked), cost per
flavor, allocated vs used, idle spend, budget burn with the forecast to the month's end, and
the chargeback CSV. Every number is the portal's (``/api/v1/cost``); nothing is priced here."""

from __future__ import annotations

import io

import holoviews as hv
import panel as pn
from panel.viewable import Viewer

from dashboards import components as c
from dashboards.stores import CostStore


def _pct(x: float | None) -> str:
    return "not measured" if x is None else f"{x:.0%}"


class CostView(Viewer):
    def __init__(self, store: CostStore, **params: object) -> None:
        super().__init__(**params)
        self.store = store

    def headline(self, *_: object) -> str:
        r = self.store.report
        if r is None:
            return ""
        t = r.total
        idle = "not measured" if t.idle_cost is None else f"{t.idle_cost} {r.currency}"
        return c.summary(
            f"{r.start:%Y-%m-%d} – {r.end:%Y-%m-%d %H:%M} UTC",
            c.number("cost", f"{t.cost:,} {r.currency}"),
            c.number("GPU-hours", f"{t.allocated_gpu_hours:,.1f}"),
            c.number("efficiency", _pct(t.efficiency)),
            c.number("idle spend", idle),
        )

    def bars(self, *_: object) -> hv.Layout | hv.Text:
        rows = self.store.stacked()
        if not rows:
            return hv.Text(0, 0, "no cost in this window")
        common = {"stacked": True, "tools": ["hover"], "width": 520, "height": 300}
        # Columns map to dimensions by position: one value column per chart.
        money = hv.Bars(
            [(d, t, cost) for d, t, cost, _ in rows], kdims=["day", "tenant"], vdims=["cost"]
        ).opts(title="Cost by tenant per day", **common)
        hours = hv.Bars(
            [(d, t, h) for d, t, _, h in rows], kdims=["day", "tenant"], vdims=["GPU-hours"]
        ).opts(title="GPU-hours by tenant per day", **common)
        return (money + hours).opts(shared_axes=False)

    def tenants(self, *_: object) -> pn.viewable.Viewable:
        rows = [(t, f"{v:,}") for t, v in sorted(self.store.tenant_totals().items())]
        return c.table(rows, ["tenant", "cost"], empty="no cost")

    def flavors(self, *_: object) -> pn.viewable.Viewable:
        rows = [
            (g.flavor, f"{g.cost:,}", g.allocated_gpu_hours, _pct(g.efficiency))
            for g in self.store.flavors
        ]
        return c.table(rows, ["flavor", "cost", "GPU-hours", "efficiency"], empty="no cost")

    def budgets(self, *_: object) -> pn.viewable.Viewable:
        rows = [
            (
                b.tenant,
                b.flavor or "money",
                f"{b.budget:,.2f}",
                f"{b.spent:,.2f}",
                f"{b.projected:,.2f}",
                "over" if b.over else "within",
                f"{b.exhausted_at:%Y-%m-%d %H:%M}" if b.exhausted_at else "—",
            )
            for b in self.store.budgets
        ]
        return c.table(
            rows,
            ["tenant", "budget of", "budget", "spent", "projected", "forecast", "runs out"],
            empty="no budgets",
        )

    def idle(self, *_: object) -> pn.viewable.Viewable:
        rows = [(g.tenant, g.owner, f"{g.idle_cost:,}") for g in self.store.top_idle()]
        return c.table(rows, ["tenant", "owner", "idle spend"], empty="no idle spend measured")

    def _csv(self) -> io.StringIO:
        return io.StringIO(self.store.chargeback())

    def __panel__(self) -> pn.viewable.Viewable:
        st = self.store.param
        download = pn.widgets.FileDownload(
            callback=self._csv, filename="chargeback.csv", label="Chargeback CSV", embed=False
        )
        return pn.Column(
            "## Cost",
            pn.pane.Markdown(pn.bind(self.headline, st.report)),
            c.status_line(self.store),
            pn.pane.HoloViews(pn.bind(self.bars, st.daily)),
            pn.Row(
                pn.Column("### By tenant", pn.bind(self.tenants, st.daily)),
                pn.Column("### By flavor", pn.bind(self.flavors, st.flavors)),
                pn.Column("### Top idle spend", pn.bind(self.idle, st.owners)),
            ),
            "### Budgets",
            pn.bind(self.budgets, st.budgets),
            download,
            sizing_mode="stretch_width",
        )
