"""My work (data scientists): the viewer's workloads with their devices, queue position,
reason and ETA, and a button to stop (running) or cancel (queued) each."""

from __future__ import annotations

from collections.abc import Callable

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

    def _stopper(self, workload_id: str) -> Callable[[object], None]:
        def stop(_event: object) -> None:
            self.store.stop(workload_id)

        return stop

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
        header = pn.pane.HTML(
            "<b>workload · tenant · kind · state · devices / queue</b>", margin=(0, 5)
        )
        out: list[pn.viewable.Viewable] = [header]
        for w in self.store.workloads:
            label = "Cancel" if w.state == "queued" else "Stop"
            button = pn.widgets.Button(label=label, color="danger", width=80)
            button.on_click(self._stopper(w.id))
            text = f"**{w.name}** · {w.tenant} · {w.kind} · {w.state} · " + (
                waiting(w) or devices(w)
            )
            out.append(pn.Row(button, pn.pane.Markdown(text, css_classes=["gp-workload"])))
        return pn.Column(*out, sizing_mode="stretch_width")

    def __panel__(self) -> pn.viewable.Viewable:
        st = self.store.param
        return pn.Column(
            f"## My work — {self.store.owner}",
            pn.pane.Markdown(pn.bind(self.headline, st.workloads)),
            c.status_line(self.store),
            pn.bind(self.rows, st.workloads),
            c.message(self.store),
            sizing_mode="stretch_width",
        )
