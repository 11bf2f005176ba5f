"""Pieces every view shares: the status line, number cards and plain tables."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import holoviews as hv
import holoviews.plotting.bokeh  # registers the Bokeh backend that .opts() needs
import panel as pn
import param

from dashboards.stores import Store
from portal.api.alerts import AlertOut
from portal.api.schemas import WorkloadOut

hv.Store.set_current_backend("bokeh")
# Canvas, not WebGL: these plots are small (one raster, a few hundred bars), where a WebGL
# context and its shaders cost a page more than the drawing does (~0.1 s per page in a
# browser that renders GL in software, as on GPU-less servers).
hv.renderer("bokeh").webgl = False

MAX_ROWS = 500
TABLE_CSS = """
table.gp-table { border-collapse: collapse; font-size: 13px; }
table.gp-table th, table.gp-table td { padding: 3px 10px; border-bottom: 1px solid #ddd; }
table.gp-table th { text-align: left; }
table.gp-table td { font-variant-numeric: tabular-nums; }
table.gp-topology td { text-align: center; font-size: 12px; padding: 3px 6px; }
"""


def after_load(make: Callable[[], pn.viewable.Viewable], min_height: int) -> pn.viewable.Viewable:
    """``make()``, built once the page shows (Panel's ``defer_load``): the numbers around a
    chart appear ~0.3-0.5 s sooner in the browser, the chart right after them. The
    placeholder keeps ``min_height`` so the page does not jump when the chart arrives."""
    deferred: pn.viewable.Viewable = pn.panel(  # type: ignore[assignment]
        make, defer_load=True, sizing_mode="stretch_width", min_height=min_height
    )
    return deferred


def status_line(store: Store) -> pn.pane.Markdown:
    """When the data was read, or why it could not be; follows the store."""

    def text(updated: object, error: str) -> str:
        if error:
            return f"**Could not read from the portal:** {error}"
        if updated is None:
            return "Loading…"
        return f"Updated {updated:%H:%M:%S} UTC"

    return pn.pane.Markdown(
        pn.bind(text, store.param.updated, store.param.error),
        css_classes=["gp-status"],
        sizing_mode="stretch_width",
    )


def number(label: str, value: str) -> str:
    """One figure of a summary line, as Markdown: the value in bold after its label."""
    return f"{label} **{value}**"


def summary(*figures: str) -> str:
    return " · ".join(figures)


def percent(value: float | None) -> str:
    """A percentage (0-100) for people: '90%', '0.8%' below 10; 'not measured' for None, so
    missing data never reads as 0."""
    if value is None:
        return "not measured"
    return f"{value:.1f}%" if 0 < value < 10 else f"{value:.0f}%"


def devices(w: WorkloadOut) -> str:
    """``hgx-1: GPU 4,5 (H100-80GB ×2)``, one part per allocation; '—' when none."""
    if not w.allocations:
        return "—"
    return "; ".join(
        f"{d.node}: GPU {','.join(map(str, d.gpus))} ({d.flavor} ×{d.amount})"
        + (" borrowed" if d.borrowed else "")
        for d in w.allocations
    )


def alert_table(alerts: Sequence[AlertOut], *, empty: str, owners: bool = False) -> str:
    """Alerts as rows of rule (in words), state, the member it is about (with ``owners``) and
    the portal's summary."""
    columns = ["alert", "state", *(["member"] if owners else []), "about"]
    rows = [
        (
            a.rule.replace("_", " "),
            a.state,
            *([a.owner or "—"] if owners else []),
            a.summary,
        )
        for a in alerts
    ]
    return table_html(rows, columns, empty=empty)


def table(
    rows: Sequence[Sequence[object]], columns: Sequence[str], *, empty: str = "none"
) -> pn.viewable.Viewable:
    """A plain HTML table (cheap to render, and its numbers are text a browser test reads)."""
    return pn.pane.HTML(
        table_html(rows, columns, empty=empty), stylesheets=[TABLE_CSS], sizing_mode="stretch_width"
    )


def table_html(
    rows: Sequence[Sequence[object]], columns: Sequence[str], *, empty: str = "none"
) -> str:
    """The HTML of ``table``: for a pane that live updates change its text in place."""
    if not rows:
        return f"<p><em>{html.escape(empty)}</em></p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in r) + "</tr>"
        for r in rows[:MAX_ROWS]
    )
    more = f"<p>… {len(rows) - MAX_ROWS:,} more rows</p>" if len(rows) > MAX_ROWS else ""
    return (
        f'<table class="gp-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        + more
    )


def live(html_of: Callable[..., str], *deps: object, css: str = TABLE_CSS) -> pn.pane.HTML:
    """One HTML pane whose text follows ``html_of(*deps)``: a live update changes the text of
    the pane already in the page instead of replacing it with a new one (a new pane costs the
    browser a new view and a layout pass; new text costs an innerHTML). ``css`` styles it."""
    return pn.pane.HTML(pn.bind(html_of, *deps), stylesheets=[css], sizing_mode="stretch_width")


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def message(store: param.Parameterized, name: str = "message") -> pn.pane.Alert:
    """The store's last action result or note as an alert: red when something failed (it
    starts with 'invalid', 'not ' or 'unknown'), blue for a part the viewer's roles leave out
    ('not shown': nothing went wrong), green otherwise.
    One Alert whose text, colour and visibility follow the parameter (not a function Panel
    must find a pane type for on every change: that search imports matplotlib's figure
    module the first time, ~0.7 s of a process's first page)."""
    text = store.param[name]

    def kind(value: str) -> str:
        if value.startswith("not shown"):
            return "info"
        return "danger" if value.startswith(("invalid", "not ", "unknown")) else "success"

    return pn.pane.Alert(text, alert_type=pn.bind(kind, text), visible=pn.bind(bool, text))
