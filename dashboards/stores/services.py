"""Inference services for My work (the viewer's own) and Tenant (the tenant's): each service's
replicas by state, its queue and latency as the gateway counts them, its GPU-hours serving and
warm, and the replicas of the one picked."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import param

from dashboards.stores.base import Store, not_shown
from policies.errors import PortalError
from policies.services import ReplicaState, ServiceState
from portal.api.cost import ServiceHoursOut
from portal.api.services import ReplicaOut, ServiceOut
from portal.waits import queue_line


@dataclass(frozen=True, slots=True)
class ReplicaCounts:
    """A service's live replicas by what they do now (derived from its ``replicas``)."""

    serving: int
    starting: int
    queued: int
    asleep: int
    stopping: int


def counts(s: ServiceOut) -> ReplicaCounts:
    states = [r.state for r in s.replicas]
    return ReplicaCounts(
        serving=states.count(ReplicaState.READY),
        starting=states.count(ReplicaState.STARTING),
        queued=states.count(ReplicaState.QUEUED),
        asleep=states.count(ReplicaState.ASLEEP),
        stopping=states.count(ReplicaState.STOPPING),
    )


def queue_reasons(s: ServiceOut) -> list[str]:
    """Why each queued replica waits, in the queue's own words (``portal.waits``)."""
    return [f"#{r.number}: {waiting(r)}" for r in s.replicas if r.state is ReplicaState.QUEUED]


def waiting(r: ReplicaOut) -> str:
    w = r.workload
    if w is None:
        return r.reason or "queued"
    return queue_line(w.position, w.reason, w.message, w.eta_s, w)


def bounds(s: ServiceOut) -> tuple[int, int, int]:
    """min, max and warm of the service's spec."""
    r = s.spec.get("replicas", {})
    return int(r.get("min", 0)), int(r.get("max", 0)), int(r.get("warm", 0))


def month_start(now: float) -> datetime:
    at = datetime.fromtimestamp(now, UTC)
    return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


class ServicesStore(Store):
    """Services of ``tenant`` (Tenant), or those ``owner`` deployed (My work); deleted ones
    are left out. Every read is the viewer's: the portal decides what they may see."""

    owner = param.String(default="", doc="My work: only services this person deployed.")
    tenant = param.String(default="", doc="Tenant: only this tenant's services.")
    services = param.List(default=[], item_type=ServiceOut, doc="Live services (not deleted).")
    hours = param.Dict(
        default=None,
        allow_None=True,
        doc="Service id -> its GPU-hours this month; None when cost cannot be read.",
    )
    selected = param.String(default="", doc="Id of the service whose replicas are shown.")
    note = param.String(default="", doc="What is not shown, and why.")
    clock = param.Callable(default=time.time, doc="Epoch seconds: the end of the cost window.")

    def _read(self) -> None:
        found = self.source.services(self.tenant or None)
        shown = [
            s
            for s in found
            if s.state is not ServiceState.DELETED and (not self.owner or s.owner == self.owner)
        ]
        notes: list[str] = []
        hours: dict[str, ServiceHoursOut] | None = None
        if shown:
            now = float(self.clock())
            try:
                rows = self.source.service_hours(
                    start=month_start(now),
                    end=datetime.fromtimestamp(now, UTC),
                    tenant=self.tenant or None,
                )
            except PortalError as exc:  # members may lack cost:read; the rest still shows
                notes.append(not_shown("GPU-hours serving and warm", exc))
            else:
                hours = {h.service_id: h for h in rows.services}
        selected = self.selected if any(s.id == self.selected for s in shown) else ""
        if not selected and shown:
            selected = shown[0].id
        self._set_changed(
            {
                "services": shown,
                "hours": hours,
                "selected": selected,
                "note": "; ".join(notes),
            }
        )

    def service(self) -> ServiceOut | None:
        return next((s for s in self.services if s.id == self.selected), None)

    def select(self, service_id: str) -> None:
        """Show ``service_id``'s replicas (read with the rest: no extra request)."""
        self.selected = service_id
