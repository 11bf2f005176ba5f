"""My work (data scientists): the viewer's workloads with their devices, queue position,
reason and ETA, and a button to stop (running) or cancel (queued) each."""

from __future__ import annotations

import panel as pn
from panel.viewable import Viewer

from dashboards import components as c
from dashboards.sources import Workload
from dashboards.stores import MyWorkStore


def devices(w: Workload) -> str:
    """``hgx-1: GPU 4,5 (H100-80GB ×2)``, one part per allocation; '—' when none."""
    if not w.devices:
        return "—"
    return "; ".join(
        f"{d.node}: GPU {','.join(map(str, d.gpus))} ({d.flavor} ×{d.amount})"
        + (" borrowed" if d.borrowed else "")
        for d in w.devices
    )


def waiting(w: Workload) -> str:
    """Queue position, reason and ETA of a queued workload; '' otherwise."""
    if w.state != "queued":
        return ""
    return f"#{w.position} · {w.reason} · ETA {c.eta(w.eta_s)} — {w.message}"


class MyWorkView(Viewer):
    def __init__(self, store: MyWorkStore, **params: object) -> None:
        super().__init__(**params)
        self.store = store
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
            d.amount for w in ws for d in w.devices if "/" not in d.flavor
        )  # whole GPUs only: shares and MIG slices are not GPUs
        return c.summary(
            c.number("running", str(running)),
            c.number("queued", str(queued)),
            c.number("whole GPUs held", str(gpus)),
        )

    def rows(self, *_: object) -> pn.viewable.Viewable:
        if not self.store.workloads:
            return pn.pane.Markdown("*You have no running or queued workloads.*")
        rows = [
            (w.name, w.tenant, w.kind, w.state, waiting(w) or devices(w))
            for w in self.store.workloads
        ]
        return c.table(rows, ["workload", "tenant", "kind", "state", "devices / queue"])

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
            pn.bind(self.rows, st.workloads),
            pn.Row(self.choose, self.stop_button),
            c.message(self.store),
            sizing_mode="stretch_width",
        )
