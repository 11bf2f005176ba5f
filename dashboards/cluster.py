"""Cluster view (operators): node × GPU allocation heatmap, free capacity per flavor,
fragmentation, MIG layouts, node health (XID, throttling and ECC alerts), and the selected
node's GPU link classes."""

from __future__ import annotations

import html

import holoviews as hv
import numpy as np
import panel as pn
import param
from panel.viewable import Viewer

from dashboards import components as c
from dashboards.stores import ClusterStore
from dashboards.stores.cluster import ALL_READ, UNKNOWN
from policies.topology import LinkClass

# Link classes from worst (cross-socket) to best (NVSwitch): light to dark green.
_LINK_SHADES = ("#edf8e9", "#c7e9c0", "#a1d99b", "#74c476", "#31a354", "#006d2c")

# The codes ``nvidia-smi topo -m`` prints, and what they mean.
_LINK_CODES = {
    LinkClass.CROSS_SOCKET: "SYS",
    LinkClass.SAME_NUMA: "NODE",
    LinkClass.SAME_HOST_BRIDGE: "PHB",
    LinkClass.SAME_PCIE_SWITCH: "PIX",
    LinkClass.NVLINK: "NV",
    LinkClass.NVSWITCH: "NVS",
}
_LINK_LEGEND = " · ".join(f"{_LINK_CODES[k]}: {html.escape(k.label)}" for k in reversed(LinkClass))

# Beyond this many nodes the heatmap drops per-node tick labels (they would overlap).
LABELLED_NODES = 64


class ClusterView(Viewer):
    """Lays out a ``ClusterStore``; each part re-renders when the store's data changes."""

    shape = param.Integer(
        default=0, doc="Nodes drawn as labelled rows (up to LABELLED_NODES); 0: a raster."
    )
    cells_version = param.Integer(default=0, doc="Bumped when the heatmap's data changes.")

    def __init__(self, store: ClusterStore, **params: object) -> None:
        super().__init__(**params)
        self.store = store
        store.param.watch(self._cells_changed, ["nodes", "utilization"])
        self._cells_changed()

    def _cells_changed(self, *_: object) -> None:
        # ``shape`` is set only when the heatmap's kind or rows change (param skips an equal
        # value), which is when it must be rebuilt; otherwise the version redraws its values.
        n = len(self.store.nodes)
        self.shape = n if n <= LABELLED_NODES else 0
        self.cells_version += 1

    def headline(self, *_: object) -> str:
        gpus, allocated = self.store.totals()
        share = allocated / gpus if gpus else 0.0
        return c.summary(
            c.number("nodes", f"{len(self.store.nodes):,}"),
            c.number("GPUs", f"{gpus:,}"),
            c.number("allocated", f"{allocated:,.1f} GPUs ({share:.0%})"),
            c.number("fragmentation", f"{self.store.fragmentation():.0%}"),
        )

    def cells(self) -> list[tuple[str, int, float]]:
        """(node, GPU index, 0..1) of the chosen metric; NaN: a GPU not measured."""
        if self.store.metric == "utilization":
            used = self.store.utilization
            return [
                (
                    n.name,
                    g.index,
                    used[(n.name, g.index)] / 100 if (n.name, g.index) in used else float("nan"),
                )
                for n in self.store.nodes
                for g in n.gpus
            ]
        return self.store.allocation()

    def heatmap(self, *_: object) -> hv.HeatMap | hv.Image:
        nodes = self.store.nodes
        utilization = self.store.metric == "utilization"
        vdim = "utilization" if utilization else "allocated"
        style = {
            "cmap": "Oranges" if utilization else "Blues",
            "clim": (0, 1),
            "colorbar": True,
            "tools": ["hover"],
            "responsive": True,
            "min_height": 260,
            "height": min(900, 40 + 14 * len(nodes)),
            "title": (
                "GPU utilization (latest minute; MIG: busiest instance; blank: not measured)"
                if utilization
                else "Allocated share per GPU"
            ),
            "framewise": True,
        }
        if len(nodes) <= LABELLED_NODES:
            cells = [(i, n, a) for n, i, a in self.cells()]
            return hv.HeatMap(cells, kdims=["GPU", "node"], vdims=[vdim]).opts(
                invert_yaxis=True, **style
            )
        # Many nodes: a raster (one row per node, by name) renders in constant time, where
        # categorical axes with thousands of factors do not.
        width = max((len(n.gpus) for n in nodes), default=0)
        grid = np.full((len(nodes), max(width, 1)), np.nan)
        rows = {n.name: row for row, n in enumerate(nodes)}
        for node, index, value in self.cells():
            grid[rows[node], index] = value
        bounds = (-0.5, -0.5, width - 0.5, len(nodes) - 0.5)
        return hv.Image(grid[::-1], bounds=bounds, kdims=["GPU", "node #"], vdims=[vdim]).opts(
            invert_yaxis=True, **style
        )

    def live_heatmap(self, *_: object) -> hv.DynamicMap:
        """The heatmap as a DynamicMap: a live update sends the cells' new values to the
        browser into the plot already there. Rebuilt only when the metric or ``shape``
        changes (another kind of element, or other rows). It follows a version number, not
        the nodes: HoloViews hashes a DynamicMap's inputs, and hashing 10,000 GPUs' records
        cost more than drawing them."""
        return hv.DynamicMap(pn.bind(self._heatmap_of, self.param.cells_version))

    def _heatmap_of(self, _version: int) -> hv.HeatMap | hv.Image:
        return self.heatmap()

    def chart(self) -> pn.viewable.Viewable:
        """The heatmap, drawn once the page shows (its plot is most of this page's server
        time; the headline and tables appear first). 260: the heatmap's own least height."""
        return c.after_load(
            lambda: pn.pane.HoloViews(
                pn.bind(self.live_heatmap, self.store.param.metric, self.param.shape),
                sizing_mode="stretch_width",
                linked_axes=False,
            ),
            min_height=260,
        )

    def free(self, *_: object) -> str:
        rows = [
            (
                f.flavor,
                f.capacity,
                f.free,
                f.guaranteed,
                f"over-committed: guarantees {f.guaranteed} of {f.capacity}"
                if f.overcommitted
                else "",
            )
            for f in self.store.free_by_flavor()
        ]
        return c.table_html(
            rows, ["flavor", "capacity", "free", "guaranteed", "note"], empty="no GPUs"
        )

    def layouts(self, *_: object) -> str:
        return c.table_html(self.store.mig_layout_counts(), ["model", "MIG layout", "GPUs"])

    def topology(self, *_: object) -> str:
        """The selected node's GPU × GPU link classes as a matrix, as ``nvidia-smi topo -m``
        prints it, better links darker. An HTML table, not a plot: 64 labelled cells read
        better as text, and a second Bokeh figure cost the page ~0.1 s to build and draw."""
        links = self.store.link_classes()
        if not links:
            return "<p><em>topology unknown</em></p>"
        size = max(max(i, j) for i, j, _ in links) + 1
        cells = {(i, j): LinkClass.parse(k) for i, j, k in links}
        head = "".join(f"<th>{j}</th>" for j in range(size))
        rows = []
        for i in range(size):
            row = [f"<th>GPU {i}</th>"]
            for j in range(size):
                link = cells.get((i, j))
                if link is None:
                    row.append("<td>—</td>" if i != j else "<td>X</td>")
                    continue
                shade = _LINK_SHADES[int(link) - 1]
                ink = "#fff" if int(link) >= 4 else "#000"
                row.append(
                    f'<td style="background:{shade};color:{ink}" '
                    f'title="GPU {i} – GPU {j}: {html.escape(link.label)}">'
                    f"{_LINK_CODES[link]}</td>"
                )
            rows.append("<tr>" + "".join(row) + "</tr>")
        return (
            f"<p><strong>Link classes of {html.escape(self.store.selected)}</strong></p>"
            f'<table class="gp-table gp-topology"><thead><tr><th></th>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table><p><small>{_LINK_LEGEND}</small></p>"
        )

    def node_mig(self, *_: object) -> str:
        rows = [(g, p, s, "free" if f else "in use") for g, p, s, f in self.store.mig_layouts()]
        return c.table_html(rows, ["GPU", "profile", "start", "state"], empty="no MIG instances")

    def health(self, *_: object) -> str:
        rows = [
            (
                *self.store.where(a.scope),
                a.rule.upper() if a.rule == "xid" else a.rule,
                a.state,
                a.summary,
            )
            for a in self.store.health
        ]
        return c.table_html(
            rows, ["node", "GPU", "alert", "state", "about"], empty=self.no_health()
        )

    def no_health(self) -> str:
        """What an empty node-health table says: healthy only when every health alert was
        read; "not shown" for alerts the viewer may not see; "unknown" when the portal could
        not be read (the status line or the note says why)."""
        known = self.store.health_known
        if self.store.error or self.store.updated is None:
            known = UNKNOWN
        return "no health alerts" if known == ALL_READ else known

    def __panel__(self) -> pn.viewable.Viewable:
        choose = pn.widgets.AutocompleteInput.from_param(
            self.store.param.selected,
            options=[n.name for n in self.store.nodes],
            label="node",
            case_sensitive=False,
            search_strategy="includes",
        )

        def options(*_: object) -> None:
            # Nodes change on every allocation; their names seldom: send 1,250 names only then.
            names = [n.name for n in self.store.nodes]
            if names != choose.options:
                choose.options = names

        st = self.store.param
        st.watch(options, ["nodes"])
        return pn.Column(
            pn.pane.Markdown(pn.bind(self.headline, st.nodes)),
            c.status_line(self.store),
            pn.widgets.RadioButtonGroup.from_param(st.metric, name="heatmap"),
            c.message(self.store, "utilization_note"),
            self.chart(),
            "### Node health",
            c.live(self.health, st.health, st.health_known, st.error),
            c.message(self.store, "health_note"),
            pn.Row(
                pn.Column(
                    "### Free capacity by flavor",
                    c.live(self.free, st.nodes, st.capacity, st.guaranteed),
                    sizing_mode="stretch_width",
                ),
                pn.Column(
                    "### MIG layouts", c.live(self.layouts, st.nodes), sizing_mode="stretch_width"
                ),
            ),
            pn.Row(
                pn.Column(
                    "### Selected node",
                    choose,
                    c.live(self.node_mig, st.nodes, st.detail),
                    sizing_mode="stretch_width",
                ),
                pn.Column(c.live(self.topology, st.detail), sizing_mode="stretch_width"),
            ),
            sizing_mode="stretch_width",
        )
