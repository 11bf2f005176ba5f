"""The viewer's own workloads, their usage and alerts for My work."""

from __future__ import annotations

import time

import param

from dashboards.stores.base import USAGE_WINDOW_S, Store, in_words, not_shown
from policies.errors import PortalError
from portal.api.alerts import AlertOut
from portal.api.schemas import WorkloadOut
from portal.api.telemetry import PointOut


class MyWorkStore(Store):
    """The viewer's own workloads with their devices, queue positions and reasons."""

    owner = param.String(default="", doc="The viewer: workloads they own are shown.")
    workloads = param.List(default=[], item_type=WorkloadOut, doc="Live workloads of the owner.")
    message = param.String(default="", doc="Result of the last stop or cancel.")
    usage = param.Dict(default={}, doc="Workload id -> 1-minute points of the last hour.")
    alerts = param.List(default=[], item_type=AlertOut, doc="Alerts about the owner's work.")
    telemetry_note = param.String(default="", doc="Why usage or alerts are not shown.")
    clock = param.Callable(default=time.time, doc="Epoch seconds: the end of the usage window.")

    def _read(self) -> None:
        mine = [w for w in self.source.workloads() if w.owner == self.owner]
        ids = {w.id for w in mine}
        usage: dict[str, list[PointOut]] = {}
        alerts: list[AlertOut] = []
        notes = []
        if any(w.state == "running" for w in mine):
            now = float(self.clock())
            try:
                series = self.source.series(start=now - USAGE_WINDOW_S, end=now, owner=self.owner)
            except PortalError as exc:  # e.g. no usage:read: the rest of the page still shows
                notes.append(not_shown("GPU usage", exc))
            else:
                usage = {wid: points for wid, points in series.items() if wid in ids}
        try:
            alerts = [
                a
                for a in self.source.alerts()
                if a.owner == self.owner or ids.intersection(a.workloads)
            ]
        except PortalError as exc:
            notes.append(not_shown("alerts", exc))
        self.workloads = mine
        self.usage = usage
        self.alerts = alerts
        self.telemetry_note = "; ".join(notes)

    def stop(self, workload_id: str) -> bool:
        """Release a running workload's devices or take a queued one out of the queue."""
        try:
            w = self.source.release(workload_id)
        except PortalError as exc:
            self.message = f"not stopped: {in_words(exc)}"
            return False
        self.message = f"{w.name} ({w.id}): {w.state}"
        self.refresh()
        return True
