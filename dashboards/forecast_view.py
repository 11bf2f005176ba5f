"""The capacity forecast section of the Cost view (leadership, platform admins): each
flavor's forecast peak as a share of its capacity, week by week, and a table with the
GPU-hours, capacity and guarantees. The numbers are the portal's (``/api/v1/forecast``)."""

from __future__ import annotations

import holoviews as hv
import panel as pn
from panel.viewable import Viewer

from dashboards import components as c
from dashboards.stores import CapacityForecastStore


class CapacityForecastView(Viewer):
    def __init__(self, store: CapacityForecastStore, **params: object) -> None:
        super().__init__(**params)
        self.store = store

    def peak_bars(self, *_: object) -> hv.Overlay:
        """Forecast peak per flavor and week as % of the flavor's capacity, with the 100 %
        line: a bar above it is a week the flavor is forecast to run out."""
        rows = self.store.peak_share()
        title = "Forecast peak, % of capacity"
        bars = hv.Bars(rows, kdims=["week", "flavor"], vdims=["% of capacity"]).opts(
            title=title if rows else f"{title}: no forecast",
            tools=["hover"],
            xrotation=30,
            responsive=True,
            height=300,
            framewise=True,
        )
        return bars * hv.HLine(100.0).opts(color="red", line_dash="dashed")

    def chart(self) -> pn.viewable.Viewable:
        dynamic = hv.DynamicMap(pn.bind(self.peak_bars, self.store.param.forecast))
        return c.after_load(
            lambda: pn.pane.HoloViews(dynamic, sizing_mode="stretch_width"), min_height=320
        )

    def table(self, *_: object) -> str:
        rows = [
            (flavor, week, f"{hours:,.1f}", f"{peak:,.2f}", f"{cap:,.2f}", f"{guaranteed:,.2f}")
            for flavor, week, hours, peak, cap, guaranteed in self.store.rows()
        ]
        header = ["flavor", "week of", "GPU-hours", "peak GPUs", "capacity", "guaranteed"]
        return c.table_html(rows, header, empty="no forecast")

    def method(self, *_: object) -> str:
        """How each flavor was forecast, and from when: the forecast is only as good as its
        history (``docs/forecast.md``)."""
        f = self.store.forecast
        if f is None:
            return ""
        used = sorted(
            {
                fl.method.value + (f" ({fl.season_hours} h season)" if fl.season_hours else "")
                for fl in f.flavors
            }
        )
        return (
            f"*Learnt from {f.history_start:%Y-%m-%d %H:%M} to {f.forecast_start:%Y-%m-%d %H:%M}"
            f" UTC; {', '.join(used) or 'no flavors'}.*"
        )

    def __panel__(self) -> pn.viewable.Viewable:
        st = self.store.param
        return pn.Column(
            "### Capacity forecast",
            c.status_line(self.store),
            self.chart(),
            c.live(self.table, st.forecast),
            pn.pane.Markdown(pn.bind(self.method, st.forecast)),
            sizing_mode="stretch_width",
        )
