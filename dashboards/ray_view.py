"""The Ray clusters section of My work, Tenant and Cost: one line per cluster with its state,
workers joined of wanted (min–max), devices held, each slice (number, workers, state, and why
it waits or was released), and its GPU-hours and cost since creation (``docs/dashboards.md``).
Read only."""

from __future__ import annotations

import panel as pn
from panel.viewable import Viewer

from dashboards import components as c
from dashboards.stores.ray import RayStore, devices_held, slice_line
from portal.api.ray import RayCostOut, RayOut

COLUMNS = [
    "cluster",
    "tenant",
    "owner",
    "state",
    "workers joined / wanted (min–max)",
    "devices held",
    "slices",
    "GPU-hours",
    "cost",
    "message",
]


def slices_text(r: RayOut) -> str:
    """Every slice, oldest first: ``#2 1 worker queued (#1 · quota: ...)``."""
    parts = []
    for s in r.slices:
        line = slice_line(s)
        what = f"#{line.number} {line.workers} worker{'s' if line.workers != 1 else ''} "
        what += line.state
        if line.devices:
            what += f", {line.devices} device{'s' if line.devices != 1 else ''}"
        if line.why:
            what += f" ({line.why})"
        parts.append(what)
    return "; ".join(parts) or "—"


def cluster_row(r: RayOut, cost: RayCostOut | None, priced: bool) -> tuple[str, ...]:
    if not priced:
        hours = money = "not shown"
    elif cost is None:
        hours, money = "0.00", "0.00"
    else:
        hours, money = f"{cost.gpu_hours:,.2f}", f"{cost.cost} {cost.currency}"
    return (
        r.name,
        r.tenant,
        r.owner,
        r.state.value,
        f"{r.joined} / {r.workers} ({r.min_workers}–{r.max_workers})",
        str(devices_held(r)),
        slices_text(r),
        hours,
        money,
        r.message or "—",
    )


class RayClustersView(Viewer):
    """The table of Ray clusters, one line each with its slices."""

    def __init__(self, store: RayStore, *, empty: str, **params: object) -> None:
        super().__init__(**params)
        self.store = store
        self.empty = empty

    def rows(self, *_: object) -> str:
        costs = self.store.costs
        rows = [
            cluster_row(r, (costs or {}).get(r.id), costs is not None) for r in self.store.clusters
        ]
        return c.table_html(rows, COLUMNS, empty=self.empty)

    def read_error(self, error: str) -> str:
        return f"**Could not read Ray clusters from the portal:** {error}" if error else ""

    def __panel__(self) -> pn.viewable.Viewable:
        st = self.store.param
        return pn.Column(
            "### Ray clusters",
            pn.pane.Markdown(pn.bind(self.read_error, st.error)),
            c.live(self.rows, st.clusters, st.costs),
            c.message(self.store, "note"),
            sizing_mode="stretch_width",
        )
