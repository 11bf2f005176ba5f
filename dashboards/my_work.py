"""My work (data scientists): the viewer's workloads with their devices, queue position,
reason and ETA, GPU utilization and memory over the last hour (1-minute telemetry), the alerts
about them (idle, noisy neighbour, ...), and a button to stop (running) or cancel (queued)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import holoviews as hv
import panel as pn
from panel.viewable import Viewer

from dashboards import components as c
from dashboards.jobs_view import JobsView
from dashboards.ray_view import RayClustersView
from dashboards.services_view import ServicesView
from dashboards.stores import MyWorkStore
from portal.api.schemas import WorkloadOut
from portal.api.telemetry import PointOut
from portal.waits import queue_line


def waiting(w: WorkloadOut) -> str:
    """Queue position, reason and wait of a queued workload, in the words the spawn page and
    the CLI use (``portal.waits``); '' otherwise."""
    if w.state != "queued":
        return ""
    return queue_line(w.position, w.reason, w.message, w.eta_s, w)


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def usage_row(name: str, points: list[PointOut]) -> tuple[str, str, str, str, str]:
    """Workload, utilization now and averaged over the hour (of its allocation), memory now
    and at most (MiB); the hour's average weighs every measured minute alike."""
    measured = [p.utilization_avg for p in points if p.utilization_avg is not None]
    last = points[-1]
    average = sum(measured) / len(measured) if measured else None
    peak = max(p.memory_used_avg for p in points)
    return (
        name,
        c.percent(last.utilization_avg),
        c.percent(average),
        f"{last.memory_used_avg:,.0f}",
        f"{peak:,.0f}",
    )


class MyWorkView(Viewer):
    def __init__(
        self,
        store: MyWorkStore,
        jobs: JobsView | None = None,
        services: ServicesView | None = None,
        ray: RayClustersView | None = None,
        **params: object,
    ) -> None:
        super().__init__(**params)
        self.store = store
        self.jobs = jobs
        self.services = services
        self.ray = ray
        self.choose = pn.widgets.Select(label="workload", options={}, width=320)
        self.stop_button = pn.widgets.Button(label="Stop / cancel", color="danger", width=140)
        self.stop_button.on_click(self._stop)
        store.param.watch(self._choices, ["workloads"])
        self._choices()

    def headline(self, *_: object) -> str:
        ws = self.store.workloads
        running = sum(1 for w in ws if w.state == "running")
        queued = sum(1 for w in ws if w.state == "queued")
        gpus = sum(
            d.amount for w in ws for d in w.allocations if "/" not in d.flavor
        )  # whole GPUs only: shares and MIG slices are not GPUs
        return c.summary(
            c.number("running", str(running)),
            c.number("queued", str(queued)),
            c.number("whole GPUs held", str(gpus)),
        )

    def rows(self, *_: object) -> str:
        if not self.store.workloads:
            return c.table_html([], [], empty="You have no running or queued workloads.")
        rows = [
            (w.name, w.tenant, w.kind, w.state, waiting(w) or c.devices(w))
            for w in self.store.workloads
        ]
        return c.table_html(rows, ["workload", "tenant", "kind", "state", "devices / queue"])

    def usage_table(self, *_: object) -> str:
        names = {w.id: w.name for w in self.store.workloads}
        rows = [
            usage_row(names[wid], points)
            for wid, points in sorted(self.store.usage.items(), key=lambda kv: names[kv[0]])
            if points and wid in names
        ]
        return c.table_html(
            rows,
            ["workload", "GPU util now", "avg (1 h)", "memory MiB now", "max MiB (1 h)"],
            empty="no GPU samples in the last hour",
        )

    def usage_plot(self, *_: object) -> hv.Overlay | hv.Text:
        names = {w.id: w.name for w in self.store.workloads}
        curves = []
        for metric, label in (
            ("utilization_avg", "GPU utilization %"),
            ("memory_used_avg", "memory MiB"),
        ):
            # An unmeasured minute (None) is a gap in the line (NaN), neither 0 % nor a
            # straight line drawn across it.
            per_workload = [
                hv.Curve(
                    [
                        (datetime.fromtimestamp(p.at, UTC), _or_nan(getattr(p, metric)))
                        for p in points
                    ],
                    kdims=["time"],
                    vdims=[label],
                    label=names.get(wid, wid),
                )
                for wid, points in sorted(self.store.usage.items())
                if points
            ]
            if per_workload:
                curves.append(hv.Overlay(per_workload).opts(title=label, width=520, height=260))
        if not curves:
            return hv.Text(0, 0, "no GPU samples in the last hour")
        return hv.Layout(curves).opts(shared_axes=False)

    def alert_table(self, *_: object) -> str:
        return c.alert_table(self.store.alerts, empty="no alerts about your work")

    def _choices(self, *_: object) -> None:
        # One picker and one button, not a button per row: re-rendering hundreds of widget
        # rows on every live update costs seconds.
        options = {
            f"{w.name} ({'cancel' if w.state == 'queued' else 'stop'})": w.id
            for w in self.store.workloads
        }
        self.choose.options = options
        if self.choose.value not in options.values():
            self.choose.value = next(iter(options.values()), None)

    def _stop(self, _event: object) -> None:
        if self.choose.value:
            self.store.stop(self.choose.value)

    def __panel__(self) -> pn.viewable.Viewable:
        st = self.store.param
        return pn.Column(
            f"## My work — {self.store.owner}",
            pn.pane.Markdown(pn.bind(self.headline, st.workloads)),
            c.status_line(self.store),
            c.live(self.rows, st.workloads),
            pn.Row(self.choose, self.stop_button),
            c.message(self.store),
            *([self.jobs] if self.jobs is not None else []),
            *([self.services] if self.services is not None else []),
            *([self.ray] if self.ray is not None else []),
            "### GPU usage, last hour",
            c.live(self.usage_table, st.usage),
            pn.pane.HoloViews(pn.bind(self.usage_plot, st.usage), linked_axes=False),
            "### Alerts",
            c.live(self.alert_table, st.alerts),
            c.message(self.store, "telemetry_note"),
            sizing_mode="stretch_width",
        )
