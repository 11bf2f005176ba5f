"""Ray clusters for My work (the viewer's own), Tenant (the tenant's) and Cost (every
cluster the viewer may read): one line per cluster with its slices, each slice an allocator
workload (its state, workers, devices held, and why it waits), and its GPU-hours and money
since it was created (``GET /api/v1/ray/costs``: one read per refresh, whatever the number
of clusters)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import param

from dashboards.stores.base import Store, not_shown
from policies.errors import Forbidden, PortalError
from policies.ray import RayState, SliceState
from portal.api.ray import RayCostOut, RayOut, SliceOut
from portal.waits import queue_line


@dataclass(frozen=True, slots=True)
class SliceLine:
    """One slice as a line shows it: number, workers, state, devices held, and why it
    waits or was released ('' otherwise)."""

    number: int
    workers: int
    state: str
    devices: int
    why: str


def slice_line(s: SliceOut) -> SliceLine:
    w = s.workload
    devices = sum(len(a.gpus) or 1 for a in w.allocations) if w is not None else 0
    if s.state is SliceState.QUEUED and w is not None:
        why = queue_line(w.position, w.reason, w.message, w.eta_s, w)
    else:
        why = s.reason
    return SliceLine(s.number, s.workers, s.state.value, devices, why)


def devices_held(c: RayOut) -> int:
    """Devices its running slices hold now (GPUs, or MIG instances / shares, one each)."""
    return sum(slice_line(s).devices for s in c.slices if s.state is SliceState.RUNNING)


class RayStore(Store):
    """Ray clusters of ``tenant`` (Tenant), or those ``owner`` created (My work), or every
    one the viewer may read (Cost: stopped ones too, if they ended in ``since``'s month).
    Every read is the viewer's: the portal decides what they may see."""

    owner = param.String(default="", doc="My work: only clusters this person created.")
    tenant = param.String(default="", doc="Tenant: only this tenant's clusters.")
    stopped = param.Boolean(default=False, doc="Cost: stopped clusters too (this month's).")
    clusters = param.List(default=[], item_type=RayOut, doc="The clusters shown.")
    costs = param.Dict(
        default=None,
        allow_None=True,
        doc="Cluster id -> its cost since creation; None when cost cannot be read.",
    )
    note = param.String(default="", doc="What is not shown, and why.")
    clock = param.Callable(default=None, allow_None=True, doc="Epoch seconds (stopped cut-off).")

    def _read(self) -> None:
        try:
            found = self.source.ray_clusters(self.tenant or None)
        except Forbidden as exc:  # a cost reader without workloads:read: a note, not an error
            self._set_changed({"clusters": [], "costs": {}, "note": not_shown("Ray clusters", exc)})
            return
        cutoff = self._month_start()
        shown = [
            c
            for c in found
            if (not self.owner or c.owner == self.owner)
            and (
                c.state is not RayState.STOPPED
                or (self.stopped and c.ended_at is not None and c.ended_at >= cutoff)
            )
        ]
        notes: list[str] = []
        costs: dict[str, RayCostOut] | None = {}
        try:
            ids = {c.id for c in shown}
            read = self.source.ray_costs(self.tenant or None, ended_since=cutoff)
            costs = {c.cluster_id: c for c in read if c.cluster_id in ids}
        except PortalError as exc:
            notes.append(not_shown("Ray clusters' GPU-hours and cost", exc))
            costs = None
        self._set_changed({"clusters": shown, "costs": costs, "note": "; ".join(notes)})

    def _month_start(self) -> datetime:
        now = datetime.now(UTC) if self.clock is None else datetime.fromtimestamp(self.clock(), UTC)
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)

    def cost_of(self, cluster_id: str) -> RayCostOut | None:
        return (self.costs or {}).get(cluster_id)
