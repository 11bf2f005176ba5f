"""The Services section of My work and Tenant: per inference service its state, replicas
serving / starting / queued (with why) / warm asleep, its bounds, requests waiting and
first-byte latency as the portal's gateway counts them, GPU-hours serving and warm this month,
and the replicas of the service picked (``docs/dashboards.md``). Read only."""

from __future__ import annotations

from datetime import datetime

import holoviews as hv
import panel as pn
from panel.viewable import Viewer

from dashboards import components as c
from dashboards.stores.services import ServicesStore, bounds, counts, queue_reasons, waiting
from policies.services import ReplicaState
from portal.api.cost import ServiceHoursOut
from portal.api.services import ReplicaOut, ServiceOut

COLUMNS = [
    "service",
    "tenant",
    "owner",
    "state",
    "serving",
    "starting",
    "queued",
    "warm asleep",
    "min–max (warm)",
    "requests waiting",
    "in flight",
    "first byte p50 / p99",
    "GPU-hours serving / warm",
    "queue / message",
]
REPLICA_COLUMNS = ["replica", "state", "warm", "node", "devices", "woken", "ready since", "why"]


def _seconds(value: float | int | None) -> str:
    return "—" if value is None else f"{float(value):.2f} s"


def _when(at: datetime | None) -> str:
    return "—" if at is None else at.strftime("%Y-%m-%d %H:%M:%S")


def latency(s: ServiceOut) -> str:
    """Arrival to the replica's first byte, median and 99th percentile, since the portal
    started (the gateway keeps no longer history; ``—`` before the first request)."""
    t = s.traffic
    return f"{_seconds(t.get('first_byte_p50_s'))} / {_seconds(t.get('first_byte_p99_s'))}"


def service_row(s: ServiceOut, hours: ServiceHoursOut | None, priced: bool) -> tuple[str, ...]:
    n = counts(s)
    low, high, warm = bounds(s)
    if not priced:
        spent = "not shown"
    elif hours is None:
        spent = "0.00 / 0.00"
    else:
        spent = f"{hours.serving_gpu_hours:.2f} / {hours.warm_gpu_hours:.2f}"
    why = "; ".join(queue_reasons(s)) or s.message or "—"
    return (
        s.name,
        s.tenant,
        s.owner,
        s.state.value,
        str(n.serving),
        str(n.starting),
        str(n.queued),
        str(n.asleep),
        f"{low}–{high} ({warm})",
        str(s.traffic.get("held") or 0),
        str(s.traffic.get("in_flight") or 0),
        latency(s),
        spent,
        why,
    )


def priced(hours: dict[str, ServiceHoursOut] | None) -> bool:
    """Whether the viewer may read the services' GPU-hours (``None``: cost refused)."""
    return hours is not None


def replica_row(r: ReplicaOut) -> tuple[str, ...]:
    why = waiting(r) if r.state is ReplicaState.QUEUED else r.reason or "—"
    return (
        str(r.number),
        r.state.value,
        "yes" if r.warm else "no",
        r.node or "—",
        ", ".join(r.devices) or "—",
        _when(r.woken_at),
        _when(r.ready_at),
        why,
    )


class ServicesView(Viewer):
    """The table of services, a picker, the picked one's replicas, and a chart of GPU-hours
    serving against warm."""

    def __init__(self, store: ServicesStore, *, empty: str, **params: object) -> None:
        super().__init__(**params)
        self.store = store
        self.empty = empty
        self.choose = pn.widgets.Select(label="service", options={}, width=320)
        self.choose.param.watch(self._chosen, "value")
        store.param.watch(self._choices, ["services", "selected"])
        self._choices()

    def rows(self, *_: object) -> str:
        hours = self.store.hours
        rows = [
            service_row(s, (hours or {}).get(s.id), hours is not None) for s in self.store.services
        ]
        return c.table_html(rows, COLUMNS, empty=self.empty)

    def replicas(self, *_: object) -> str:
        s = self.store.service()
        if s is None:
            return ""
        return c.table_html(
            [replica_row(r) for r in s.replicas], REPLICA_COLUMNS, empty="no live replicas"
        )

    def hours_chart(self, *_: object) -> hv.Bars:
        """GPU-hours this month per service, serving and warm stacked."""
        hours = self.store.hours or {}
        data = [
            (s.name, part, value)
            for s in self.store.services
            if (h := hours.get(s.id)) is not None
            for part, value in (("serving", h.serving_gpu_hours), ("warm", h.warm_gpu_hours))
        ]
        return hv.Bars(data, kdims=["service", "part"], vdims=["GPU-hours"]).opts(
            stacked=bool(data), width=520, height=220, title="GPU-hours this month", tools=[]
        )

    def read_error(self, error: str) -> str:
        return f"**Could not read services from the portal:** {error}" if error else ""

    def _choices(self, *_: object) -> None:
        self.choose.options = {f"{s.name} ({s.tenant}, {s.id})": s.id for s in self.store.services}
        self.choose.value = self.store.selected or None

    def _chosen(self, event: object) -> None:
        value = getattr(event, "new", None)
        if value and value != self.store.selected:
            self.store.select(value)

    def __panel__(self) -> pn.viewable.Viewable:
        st = self.store.param
        return pn.Column(
            "### Services",
            pn.pane.Markdown(pn.bind(self.read_error, st.error)),
            c.live(self.rows, st.services, st.hours),
            # The rest only once there is a service: an empty picker and chart say nothing.
            pn.Column(
                pn.pane.Markdown(
                    "*Requests waiting, in flight and first-byte latency are the gateway's "
                    "counts since the portal last started.*"
                ),
                self.choose,
                c.live(self.replicas, st.services, st.selected),
                pn.pane.HoloViews(
                    pn.bind(self.hours_chart, st.services, st.hours),
                    visible=pn.bind(priced, st.hours),
                ),
                c.message(self.store, "note"),
                visible=pn.bind(bool, st.services),
                sizing_mode="stretch_width",
            ),
            sizing_mode="stretch_width",
        )
