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

    def _bars(self, measure: str, title: str) -> hv.Bars:
        index = 2 if measure == "cost" else 3
        rows = [(r[0], r[1], r[index]) for r in self.store.stacked()]
        return hv.Bars(rows, kdims=["day", "tenant"], vdims=[measure]).opts(
            title=title, stacked=True, tools=["hover"], width=520, height=300, framewise=True
        )

    def money_bars(self, *_: object) -> hv.Bars:
        return self._bars("cost", "Cost by tenant per day")

    def hour_bars(self, *_: object) -> hv.Bars:
        return self._bars("GPU-hours", "GPU-hours by tenant per day")

    def bars(self) -> hv.Layout:
        """Both stacked charts. Dynamic, so a live update sends the bars' new data to the
        browser and the charts stay in place instead of being rebuilt there."""
        daily = self.store.param.daily
        return (
            hv.DynamicMap(pn.bind(self.money_bars, daily))
            + hv.DynamicMap(pn.bind(self.hour_bars, daily))
        ).opts(shared_axes=False)

    def tenants(self, *_: object) -> str:
        rows = [(t, f"{v:,}") for t, v in sorted(self.store.tenant_totals().items())]
        return c.table_html(rows, ["tenant", "cost"], empty="no cost")

    def flavors(self, *_: object) -> str:
        rows = [
            (g.flavor, f"{g.cost:,}", g.allocated_gpu_hours, _pct(g.efficiency))
            for g in self.store.flavors
        ]
        return c.table_html(rows, ["flavor", "cost", "GPU-hours", "efficiency"], empty="no cost")

    def budgets(self, *_: object) -> str:
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
        return c.table_html(
            rows,
            ["tenant", "budget of", "budget", "spent", "projected", "forecast", "runs out"],
            empty="no budgets",
        )

    def idle(self, *_: object) -> str:
        rows = [(g.tenant, g.owner, f"{g.idle_cost:,}") for g in self.store.top_idle()]
        return c.table_html(rows, ["tenant", "owner", "idle spend"], empty="no idle spend measured")

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
            pn.pane.HoloViews(self.bars()),
            pn.Row(
                pn.Column("### By tenant", c.live(self.tenants, st.daily)),
                pn.Column("### By flavor", c.live(self.flavors, st.flavors)),
                pn.Column("### Top idle spend", c.live(self.idle, st.owners)),
            ),
            "### Budgets",
            c.live(self.budgets, st.budgets),
            download,
            sizing_mode="stretch_width",
        )
