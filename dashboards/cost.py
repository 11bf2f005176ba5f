"""Cost view (leadership, read only): money and GPU-hours by tenant and day (stacked), cost per
flavor, allocated vs used, idle spend, budget burn with the forecast to the month's end, and
the chargeback CSV. Every number is the portal's (``/api/v1/cost``); nothing is priced here."""

from __future__ import annotations

import io

import holoviews as hv
import panel as pn
import param
from panel.viewable import Viewer

from dashboards import components as c
from dashboards.forecast_view import CapacityForecastView
from dashboards.ray_view import RayClustersView
from dashboards.stores import CostStore
from dashboards.stores.cost import cost, efficiency, idle_cost, measured
from portal.api.cost import CostGroupOut


def _pct(g: CostGroupOut) -> str:
    """Efficiency for people; "not measured" (as My work and Tenant say) for a group none of
    whose time was measured, which the portal reports as 0 % used."""
    x = efficiency(g)
    return "not measured" if x is None else f"{x:.0%}"


class CostView(Viewer):
    measure: param.Selector[str] = param.Selector(
        default="cost", objects=["cost", "GPU-hours"], doc="What the stacked chart shows."
    )

    def __init__(
        self,
        store: CostStore,
        forecast: CapacityForecastView | None = None,
        ray: RayClustersView | None = None,
        **params: object,
    ) -> None:
        super().__init__(**params)
        self.store = store
        # The capacity forecast section, for viewers who may read every tenant's cost.
        self.forecast = forecast
        self.ray = ray

    def headline(self, *_: object) -> str:
        r = self.store.report
        if r is None:
            return ""
        t = r.total
        idle = "not measured" if not measured(t) else f"{idle_cost(t)} {r.currency}"
        return c.summary(
            f"{r.start:%Y-%m-%d} – {r.end:%Y-%m-%d %H:%M} UTC",
            c.number("cost", f"{cost(t):,} {r.currency}"),
            c.number("GPU-hours", f"{t.allocated_gpu_hours:,.1f}"),
            c.number("efficiency", _pct(t)),
            c.number("idle spend", idle),
        )

    def stacked_bars(self, measure: str, *_: object) -> hv.Bars:
        """Cost or GPU-hours (``measure``) by tenant per day, stacked."""
        index = 2 if measure == "cost" else 3
        rows = [(r[0], r[1], r[index]) for r in self.store.stacked()]
        title = f"{'Cost' if measure == 'cost' else 'GPU-hours'} by tenant per day"
        return hv.Bars(rows, kdims=["day", "tenant"], vdims=[measure]).opts(
            title=title if rows else f"{title}: none",
            # HoloViews cannot stack no bars (an IndexError that left the page's chart
            # loading for ever): empty, the chart is plain, and stacks once bars arrive.
            stacked=bool(rows),
            tools=["hover"],
            responsive=True,
            height=320,
            framewise=True,
        )

    def bars(self) -> hv.DynamicMap:
        """The stacked chart of the chosen measure. Dynamic, so a live update sends the bars'
        new data into the chart already in the page. One chart with a switch, not two side by
        side: in the browser each stacked chart costs a live update ~0.3 s to redraw."""
        return hv.DynamicMap(pn.bind(self.stacked_bars, self.param.measure, self.store.param.daily))

    def chart(self) -> pn.viewable.Viewable:
        """The stacked chart, drawn once the page shows (it is about a sixth of this page's
        load; the figures and tables around it appear first)."""
        return c.after_load(
            lambda: pn.pane.HoloViews(self.bars(), sizing_mode="stretch_width"), min_height=340
        )

    def tenants(self, *_: object) -> str:
        rows = [(t, f"{v:,}") for t, v in sorted(self.store.tenant_totals().items())]
        return c.table_html(rows, ["tenant", "cost"], empty="no cost")

    def flavors(self, *_: object) -> str:
        rows = [
            (g.flavor, f"{cost(g):,}", g.allocated_gpu_hours, _pct(g)) for g in self.store.flavors
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

    def services(self, *_: object) -> str:
        """Services' GPU-hours: their warm pools (charged like serving time) apart."""
        rows = [
            (s.tenant, s.name, f"{s.warm_gpu_hours:,.2f}", f"{s.serving_gpu_hours:,.2f}")
            for s in self.store.services
            if s.warm_gpu_hours or s.serving_gpu_hours
        ]
        header = ["tenant", "service", "warm GPU-hours", "serving GPU-hours"]
        return c.table_html(rows, header, empty="no service held GPUs")

    def idle(self, *_: object) -> str:
        rows = [(g.tenant, g.owner, f"{idle_cost(g):,}") for g in self.store.top_idle()]
        return c.table_html(rows, ["tenant", "owner", "idle spend"], empty="no idle spend measured")

    def no_report(self, *_: object) -> bool:
        """True while there is no cost report to export (not read yet, or refused)."""
        return self.store.report is None or bool(self.store.error)

    def _csv(self) -> io.StringIO:
        return io.StringIO(self.store.chargeback())

    def __panel__(self) -> pn.viewable.Viewable:
        st = self.store.param
        download = pn.widgets.FileDownload(
            callback=self._csv,
            filename="chargeback.csv",
            label="Chargeback CSV",
            embed=False,
            # Only for a window the portal answered: otherwise a click only fails.
            disabled=pn.bind(self.no_report, st.report, st.error),
        )
        return pn.Column(
            "## Cost",
            pn.pane.Markdown(pn.bind(self.headline, st.report)),
            c.status_line(self.store),
            pn.widgets.RadioButtonGroup.from_param(self.param.measure, name="chart"),
            self.chart(),
            pn.Row(
                pn.Column(
                    "### By tenant", c.live(self.tenants, st.daily), sizing_mode="stretch_width"
                ),
                pn.Column(
                    "### By flavor", c.live(self.flavors, st.flavors), sizing_mode="stretch_width"
                ),
                pn.Column(
                    "### Top idle spend", c.live(self.idle, st.owners), sizing_mode="stretch_width"
                ),
            ),
            "### Budgets",
            c.live(self.budgets, st.budgets),
            "### Inference services: warm pool and serving",
            c.live(self.services, st.services),
            *([self.ray] if self.ray is not None else []),
            download,
            *([self.forecast] if self.forecast is not None else []),
            sizing_mode="stretch_width",
        )
