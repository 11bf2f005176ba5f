"""Warm a dashboards process up before its first visitor.

The first page a process builds pays for lazy imports and first-use set-up in Panel, Bokeh
and HoloViews (matplotlib's figure module, which Panel imports when it first looks for the
pane type of an object; option trees, plot classes, property defaults): about a second more
than the next page of the same view. ``warm_up`` pays it at start by rendering, once, into
a throwaway document, a page with every kind of chart and widget the views use.
"""

from __future__ import annotations

import time

import holoviews as hv
import numpy as np
import panel as pn
from bokeh.document import Document

import dashboards.components  # noqa: F401  (the Bokeh backend and canvas settings the views use)


def _sample_page() -> pn.Column:
    days, tenants = ["11-01", "11-02"], ["team-a", "team-b"]
    stacked = hv.Bars(
        [(d, t, 1.0) for d in days for t in tenants], kdims=["day", "tenant"], vdims=["cost"]
    ).opts(stacked=True, tools=["hover"], responsive=True, height=320, framewise=True)
    raster = hv.Image(np.zeros((2, 8)), bounds=(-0.5, -0.5, 7.5, 1.5)).opts(
        cmap="Blues", clim=(0, 1), colorbar=True, tools=["hover"], responsive=True, height=260
    )
    cells = hv.HeatMap([(0, "node-a", 0.5), (1, "node-a", 1.0)], kdims=["GPU", "node"]).opts(
        invert_yaxis=True, colorbar=True, tools=["hover"], responsive=True, height=260
    )
    usage = hv.Layout([hv.Overlay([hv.Curve([(0, 1.0), (1, 2.0)], "minute", "utilization")])]).opts(
        shared_axes=False
    )
    return pn.Column(
        # A string, as the views' headings are: Panel searches its pane types for it, and
        # that search imports matplotlib's figure module the first time (~0.7 s).
        "## warm",
        pn.pane.HoloViews(hv.DynamicMap(lambda: stacked)),
        pn.pane.HoloViews(hv.DynamicMap(lambda: raster)),
        pn.pane.HoloViews(cells),
        pn.pane.HoloViews(usage, linked_axes=False),
        pn.pane.HoloViews(hv.Text(0, 0, "no samples")),
        pn.pane.Markdown("**warm**"),
        pn.pane.HTML("<p>warm</p>"),
        pn.pane.Alert("warm", alert_type="success"),
        pn.widgets.Select(options=["a", "b"]),
        pn.widgets.RadioButtonGroup(options=["a", "b"]),
        pn.widgets.AutocompleteInput(options=["a", "b"]),
        pn.widgets.IntInput(value=1),
        pn.widgets.TextInput(),
        pn.widgets.Button(label="warm"),
        pn.widgets.FileDownload(callback=lambda: None, filename="warm.csv", embed=False),
    )


_warmed = False


def warm_up() -> float:
    """Render the sample page once per process into a throwaway document; the seconds it
    took (0 when the process was already warm). Panel keeps a reference to the page until the
    process ends: one small page, once."""
    global _warmed
    if _warmed:
        return 0.0
    started = time.perf_counter()
    _sample_page().get_root(Document())
    _warmed = True
    return time.perf_counter() - started
