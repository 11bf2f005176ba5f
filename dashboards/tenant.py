"""Tenant view (tenant admins, members, leadership): quota per flavor as bars, the tenant's
queue with reasons, members' workloads and efficiency, the tenant's alerts, and, for holders
of ``quotas:write`` on the tenant, the quota editor."""

from __future__ import annotations

import html

import panel as pn
from panel.viewable import Viewer

from dashboards import components as c
from dashboards.ray_view import RayClustersView
from dashboards.services_view import ServicesView
from dashboards.stores import QuotaDraft, TenantStore
from portal.api.auth import Caller, Scope
from portal.waits import eta_words

MEASURES = ["guaranteed", "limit", "in use", "borrowed", "lent"]
_MEASURE_COLOURS = {  # Category10, as the charts elsewhere
    "guaranteed": "#1f77b4",
    "limit": "#ff7f0e",
    "in use": "#2ca02c",
    "borrowed": "#d62728",
    "lent": "#9467bd",
}
BAR_CSS = """
.gp-bar-grid { display: flex; flex-wrap: wrap; gap: 12px 32px; }
.gp-bars { width: 300px; font-size: 13px; }
.gp-bar-row { display: flex; align-items: center; gap: 6px; margin: 3px 0; }
.gp-bar-label { width: 80px; color: #555; }
.gp-bar-track { flex: 1; }
.gp-bar-track .gp-bar { display: block; height: 14px; min-width: 1px; }
.gp-bar-value { width: 56px; text-align: right; font-variant-numeric: tabular-nums; }
"""


class QuotaEditor(Viewer):
    """Flavor, guaranteed, limit and budget inputs; a live check and preview; Save sends the
    edit with the quota's ETag. Nothing is sent while the check fails."""

    def __init__(self, store: TenantStore, **params: object) -> None:
        super().__init__(**params)
        self.store = store
        self.flavor = pn.widgets.Select(label="flavor", options=self._flavors())
        self.guaranteed = pn.widgets.IntInput(label="guaranteed")
        self.limit = pn.widgets.IntInput(label="limit")
        self.budget = pn.widgets.TextInput(label="budget (GPU-hours / month)", placeholder="none")
        self.save_button = pn.widgets.Button(label="Save quota", color="primary")
        self.save_button.on_click(self._on_save)
        self.flavor.param.watch(lambda _e: self._load(), "value")
        store.param.watch(lambda _e: self._reload(), ["quotas"])
        self._load()

    def _flavors(self) -> list[str]:
        return [q.flavor for q in self.store.quotas]

    def _reload(self) -> None:
        self.flavor.options = self._flavors()
        if self.flavor.value not in self.flavor.options and self.flavor.options:
            self.flavor.value = self.flavor.options[0]

    def _load(self) -> None:
        q = self.store.quota(self.flavor.value or "")
        if q is None:
            return
        self.guaranteed.value = q.guaranteed
        self.limit.value = q.limit
        self.budget.value = "" if q.budget_gpu_hours is None else f"{q.budget_gpu_hours:g}"

    def draft(self) -> QuotaDraft | str:
        """The inputs as a draft, or what is wrong with the budget text."""
        text = (self.budget.value or "").strip()
        budget: float | None = None
        if text:
            try:
                budget = float(text)
            except ValueError:
                return (
                    f"invalid budget_gpu_hours {text!r}: expected a number of GPU-hours, or empty"
                )
        return QuotaDraft(
            flavor=self.flavor.value or "",
            guaranteed=int(self.guaranteed.value or 0),
            limit=int(self.limit.value or 0),
            budget_gpu_hours=budget,
        )

    def preview(self, *_: object) -> str:
        draft = self.draft()
        if isinstance(draft, str):
            return f"**{draft}**"
        problem = self.store.check(draft)
        if problem:
            return f"**{problem}**"
        return "\n".join(f"- {line}" for line in self.store.preview(draft))

    def _on_save(self, _event: object) -> None:
        self.save()

    def save(self) -> bool:
        draft = self.draft()
        if isinstance(draft, str):
            self.store.message = draft
            return False
        return self.store.save(draft)

    def __panel__(self) -> pn.viewable.Viewable:
        inputs = (self.flavor, self.guaranteed, self.limit, self.budget)
        return pn.Column(
            "### Edit quota",
            pn.Row(*inputs),
            pn.pane.Markdown(
                pn.bind(self.preview, *(w.param.value for w in inputs), self.store.param.usage),
                css_classes=["gp-preview"],
            ),
            self.save_button,
            c.message(self.store),
        )


class TenantView(Viewer):
    """One tenant's quota use and queue; the editor only for its quota writers."""

    def __init__(
        self,
        store: TenantStore,
        viewer: Caller,
        services: ServicesView | None = None,
        ray: RayClustersView | None = None,
        **params: object,
    ) -> None:
        super().__init__(**params)
        self.store = store
        self.viewer = viewer
        self.services = services
        self.ray = ray
        self.editor = QuotaEditor(store) if self.may_edit() else None

    def may_edit(self) -> bool:
        return self.viewer.can(Scope.QUOTAS_WRITE, self.store.tenant)

    def bars(self, *_: object) -> str:
        """Quota and use per flavor as bars, one block per flavor on its own scale (flavors
        count in different units: GPUs, instances, milli-GPU). HTML, not a plot: a live
        update replaces the text, and the page loads without a Bokeh figure per flavor (each
        cost a page load ~0.1 s in the browser)."""
        by_flavor: dict[str, list[tuple[str, int]]] = {}
        for flavor, measure, units in self.store.bars():
            by_flavor.setdefault(flavor, []).append((measure, units))
        if not by_flavor:
            return "<p><em>no quotas</em></p>"
        blocks = []
        for flavor, rows in by_flavor.items():
            top = max((units for _, units in rows), default=0) or 1
            lines = "".join(
                f'<div class="gp-bar-row"><span class="gp-bar-label">{html.escape(m)}</span>'
                f'<span class="gp-bar-track"><span class="gp-bar" '
                f'style="width:{100 * units / top:.1f}%;background:{_MEASURE_COLOURS[m]}" '
                f'title="{html.escape(m)}: {units:,}"></span></span>'
                f'<span class="gp-bar-value">{units:,}</span></div>'
                for m, units in rows
            )
            blocks.append(
                f'<div class="gp-bars"><strong>{html.escape(flavor)}</strong>{lines}</div>'
            )
        return f'<div class="gp-bar-grid">{"".join(blocks)}</div>'

    def numbers(self, *_: object) -> str:
        rows = [
            (u.flavor, u.guaranteed, u.limit, u.used, u.borrowed, u.lent) for u in self.store.usage
        ]
        return c.table_html(rows, ["flavor", *MEASURES], empty="no quotas")

    def queue(self, *_: object) -> str:
        rows = [
            (
                e.tenant_position,
                e.position,
                e.name,
                e.owner,
                e.reason,
                e.message,
                eta_words(e.eta_s, e.eta_low_s, e.eta_high_s),
            )
            for e in self.store.queue
        ]
        return c.table_html(
            rows,
            ["#", "overall", "workload", "owner", "reason", "why", "ETA"],
            empty="nothing waiting",
        )

    def members(self, *_: object) -> str:
        """A row per member; the month's columns only for viewers who may read cost."""
        cost = self.store.spend is not None
        rows = [
            (
                m.owner,
                m.running,
                m.queued,
                m.whole_gpus,
                *(
                    (
                        f"{m.gpu_hours or 0.0:,.1f}",
                        "not measured" if m.used_gpu_hours is None else f"{m.used_gpu_hours:,.2f}",
                        c.percent(None if m.efficiency is None else 100 * m.efficiency),
                    )
                    if cost
                    else ()
                ),
            )
            for m in self.store.members()
        ]
        month = ["GPU-hours this month", "used GPU-hours", "efficiency"] if cost else []
        return c.table_html(
            rows, ["member", "running", "queued", "whole GPUs", *month], empty="no members' work"
        )

    def workloads(self, *_: object) -> str:
        """Running workloads with their devices and latest minute of GPU utilization."""
        latest = self.store.latest
        rows = [
            (
                w.name,
                w.owner,
                w.kind,
                c.devices(w),
                c.percent(latest[w.id]) if w.id in latest else "—",
            )
            for w in sorted(self.store.workloads, key=lambda w: (w.owner, w.name))
            if w.state == "running"
        ]
        return c.table_html(
            rows, ["workload", "member", "kind", "devices", "GPU util now"], empty="nothing runs"
        )

    def alerts(self, *_: object) -> str:
        return c.alert_table(self.store.alerts, empty="no alerts in this tenant", owners=True)

    def __panel__(self) -> pn.viewable.Viewable:
        st = self.store.param
        editor: pn.viewable.Viewable = (
            self.editor.__panel__()
            if self.editor is not None
            else pn.pane.Markdown(
                f"*Changing quotas needs the tenant admin role of {self.store.tenant}.*",
                css_classes=["gp-no-editor"],
            )
        )
        return pn.Column(
            f"## Tenant {self.store.tenant}",
            c.status_line(self.store),
            c.live(self.bars, st.usage, css=BAR_CSS),
            c.live(self.numbers, st.usage),
            "### Queue",
            c.live(self.queue, st.queue),
            "### Alerts",
            c.live(self.alerts, st.alerts),
            "### Members",
            c.live(self.members, st.workloads, st.spend),
            "### Members' running workloads",
            c.live(self.workloads, st.workloads, st.latest),
            c.message(self.store, "note"),
            *([self.services] if self.services is not None else []),
            *([self.ray] if self.ray is not None else []),
            editor,
            sizing_mode="stretch_width",
        )
