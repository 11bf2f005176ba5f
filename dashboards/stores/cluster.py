"""Nodes, GPUs, MIG layouts, topology, utilization and health for the Cluster view."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import param

from dashboards.sources import NodeChanges, Source
from dashboards.stores.base import HEALTH_RULES, UTILIZATION_WINDOW_S, Store, in_words, not_shown
from policies.errors import Forbidden, PortalError
from policies.flavors import Flavor, FlavorKind
from portal.api.alerts import AlertOut
from portal.api.schemas import CapacityOut, GpuOut, MigInstanceOut, NodeOut


@dataclass(frozen=True, slots=True)
class FreeCapacity:
    flavor: str
    capacity: int
    free: int
    guaranteed: int = 0  # the tenants' guarantees the viewer may read, summed

    @property
    def overcommitted(self) -> bool:
        return self.guaranteed > self.capacity


def allocated_milli(g: GpuOut) -> int:
    """Share of ``g`` held by workloads: a MIG GPU counts its used slots' memory slices."""
    if g.mig_enabled and g.mig_layout:
        used = sum(1 for s in g.mig_layout if not s.free)
        return round(1000 * used / len(g.mig_layout))
    return 1000 - g.free_milli


ALL_READ = "read"
NOT_SHOWN = "not shown"
UNKNOWN = "unknown"

_LATEST: dict[str, tuple[str, list[NodeOut]]] = {}
"""Per portal origin: the latest inventory version read by any Cluster page and its nodes."""


def _merged(held: list[NodeOut], changes: NodeChanges) -> list[NodeOut]:
    by_name = {n.name: n for n in held}
    for n in changes.nodes:
        by_name[n.name] = n
    for name in changes.removed:
        by_name.pop(name, None)
    return [by_name[name] for name in sorted(by_name)]


class ClusterStore(Store):
    """Nodes, GPUs, MIG layouts and topology (``inventory:read``)."""

    nodes = param.List(default=[], item_type=NodeOut, doc="Every node, by name, no topology.")
    capacity = param.List(default=[], item_type=CapacityOut, doc="Units per flavor.")
    guaranteed = param.Dict(
        default={}, doc="Flavor -> the guarantees of the tenants the viewer reads, summed."
    )
    selected = param.String(default="", doc="The node whose topology and MIG layout are shown.")
    detail = param.ClassSelector(
        class_=NodeOut, default=None, allow_None=True, doc="The selected node with topology."
    )

    health = param.List(default=[], item_type=AlertOut, doc="XID, throttling, ECC alerts.")
    health_note = param.String(default="", doc="Why node health is not shown.")
    health_known: param.Selector[str] = param.Selector(
        default=UNKNOWN,
        objects=[ALL_READ, NOT_SHOWN, UNKNOWN],
        doc="Whether ``health`` holds every health alert (an empty list: none fire), none the "
        "viewer may see, or what could not be read.",
    )
    platform_alerts = param.Boolean(
        default=True,
        doc="Whether the viewer may see the platform's alerts (devices' XID, ECC, throttling: "
        "workloads:read of every tenant); without, health is not read.",
    )
    metric: param.Selector[str] = param.Selector(
        default="allocation", objects=["allocation", "utilization"], doc="What the heatmap shows."
    )
    utilization = param.Dict(
        default={}, doc="(node, GPU index) -> latest 1-minute utilization % (MIG: busiest)."
    )
    utilization_note = param.String(default="", doc="Why utilization is not shown.")
    clock = param.Callable(default=time.time, doc="Epoch seconds: the end of usage windows.")

    def __init__(self, source: Source, **params: object) -> None:
        super().__init__(source, **params)
        # The inventory version ``nodes`` were read at (None: list them all next time).
        self._inventory_version: str | None = None

    def _read(self) -> None:
        nodes, changed, version = self._nodes_now()
        names = {n.name for n in nodes}
        selected = self.selected if self.selected in names else (nodes[0].name if nodes else "")
        # Topology (an 8 x 8 link matrix per node) only for the node shown, and read again
        # only when that node changed.
        detail = self.detail
        if selected and (detail is None or detail.name != selected or selected in changed):
            detail = self.source.node(selected)
        capacity = self.source.capacity()
        guaranteed = self._guarantees()
        health, note, known = self._health()
        # Read only while shown: one more request per refresh.
        utilization, unmeasured = (
            self._utilization(nodes) if self.metric == "utilization" else ({}, "")
        )
        read = {
            "nodes": nodes,
            "capacity": capacity,
            "guaranteed": guaranteed,
            "health": health,
            "health_note": note,
            "health_known": known,
            "utilization": utilization,
            "utilization_note": unmeasured,
            "detail": detail if selected else None,
            "selected": selected,
        }
        self._set_changed(read)  # unchanged nodes are the same objects: compared at once
        self._inventory_version = version

    def _nodes_now(self) -> tuple[list[NodeOut], set[str], str]:
        """Every node by name, the names of those that changed since the last read, and the
        inventory version they were read at.

        Reads only what changed since the nodes held (a few nodes instead of 10,000 GPUs on
        a live update of a large cluster) and keeps the other records as they are. A new
        page starts from the latest listing any page of this process read from the same
        portal (the inventory is the same for every viewer) and asks, with its own viewer's
        token, for what changed since: the portal still checks this viewer's scope, and the
        first render skips listing every node."""
        version, held = self._inventory_version, self.nodes
        if version is None:
            version, held = _LATEST.get(self.source.origin, (None, []))
        changes = self.source.node_changes(version, topology=False)
        if changes.complete:
            nodes, changed = changes.nodes, {n.name for n in changes.nodes}
        else:
            changed = {n.name for n in changes.nodes} | set(changes.removed)
            nodes = held if not changed else _merged(held, changes)
            if held is not self.nodes:
                changed = {n.name for n in nodes}  # all new to this page
        _LATEST[self.source.origin] = (changes.version, nodes)
        return nodes, changed, changes.version

    @param.depends("selected", watch=True)
    def _node_chosen(self) -> None:
        # Another node picked: its topology now, not at the next live update.
        if not self.selected or (self.detail is not None and self.detail.name == self.selected):
            return
        try:
            self.detail = self.source.node(self.selected)
        except PortalError as exc:
            self.error = in_words(exc)

    @param.depends("metric", watch=True)
    def _metric_chosen(self) -> None:
        # The heatmap switched: read what it now shows at once, not at the next live update.
        self.refresh()

    def _utilization(self, nodes: list[NodeOut]) -> tuple[dict[tuple[str, int], float], str]:
        """Each GPU's latest 1-minute utilization from the portal's per-device read, and why
        none is shown ('' when read). A MIG GPU shows its busiest instance (the max: one
        saturated instance makes the GPU a busy one, and an idle GPU is idle in all of them);
        a shared GPU shows the whole GPU's figure. Devices without a utilization figure
        (MIG instances of an A100 or A30) leave their GPU blank rather than at 0 %."""
        now = float(self.clock())
        try:
            usage = self.source.device_usage(start=now - UTILIZATION_WINDOW_S, end=now)
        except PortalError as exc:
            return {}, not_shown("utilization", exc)
        where = {g.uuid: (n.name, g.index) for n in nodes for g in n.gpus if g.uuid}
        cells: dict[tuple[str, int], float] = {}
        for d in usage:
            cell = where.get(d.gpu_uuid)
            busy = d.utilization_avg
            if cell is not None and busy is not None:
                cells[cell] = max(busy, cells.get(cell, busy))
        return cells, ""

    def _guarantees(self) -> dict[str, int]:
        # Over-commit is the platform's to see: its admins read every tenant's quotas.
        try:
            quotas = self.source.quotas()
        except PortalError:
            return {}
        out: Counter[str] = Counter()
        for q in quotas:
            out[q.flavor] += q.guaranteed
        return dict(out)

    def _health(self) -> tuple[list[AlertOut], str, str]:
        """Health alerts, why they are not shown, and what an empty list means. Device alerts
        are the platform's: only unfiltered workloads:read holders see them, so a viewer
        without is told so instead of seeing "no health alerts" (and costs no read)."""
        if not self.platform_alerts:
            why = "node health: the GPUs' XID, ECC and throttling alerts are for platform operators"
            return [], f"not shown: {why}", NOT_SHOWN
        try:
            alerts = self.source.alerts()
        except Forbidden as exc:
            return [], not_shown("node health", exc), NOT_SHOWN
        except PortalError as exc:
            return [], f"unknown: node health could not be read ({in_words(exc)})", UNKNOWN
        return [a for a in alerts if a.rule in HEALTH_RULES], "", ALL_READ

    def where(self, scope: str) -> tuple[str, str]:
        """(node, GPU) an alert's scope names: a device's GPU by its UUID, or ``node:<n>``;
        the scope itself when the inventory does not know it."""
        if scope.startswith("node:"):
            return scope.removeprefix("node:"), "—"
        uuid, _, instance = scope.partition("/")
        for n in self.nodes:
            for g in n.gpus:
                if g.uuid and g.uuid == uuid:
                    return n.name, f"{g.index}" + (f" ({instance})" if instance else "")
        return scope, "—"

    def allocation(self) -> list[tuple[str, int, float]]:
        """(node, GPU index, allocated fraction 0..1) for every GPU: the heatmap's cells."""
        return [(n.name, g.index, allocated_milli(g) / 1000) for n in self.nodes for g in n.gpus]

    def totals(self) -> tuple[int, float]:
        """(GPUs, GPUs' worth allocated)."""
        cells = self.allocation()
        return len(cells), sum(c[2] for c in cells)

    def free_by_flavor(self) -> list[FreeCapacity]:
        """Free units per flavor, counted as ``/capacity`` counts capacity: whole free non-MIG
        GPUs, free milli of shareable GPUs, free MIG instances per profile."""
        free: Counter[str] = Counter()
        for n in self.nodes:
            if not n.schedulable:
                continue
            for g in n.gpus:
                if g.mig_enabled:
                    for s in g.mig_layout:
                        free[str(Flavor(FlavorKind.MIG, g.model, s.profile))] += int(s.free)
                    continue
                free[g.model] += int(g.free_milli == 1000)
                if g.shareable:
                    free[str(Flavor(FlavorKind.SHARE, g.model))] += g.free_milli
        return [
            FreeCapacity(c.flavor, c.capacity, free[c.flavor], self.guaranteed.get(c.flavor, 0))
            for c in self.capacity
        ]

    def fragmentation(self) -> float:
        """Share of free whole GPUs stranded on partly used nodes (0: every free GPU is on an
        empty node, so whole-node requests fit; 1: none is). 0 when nothing is free."""
        free_total = 0
        stranded = 0
        for n in self.nodes:
            whole = [g for g in n.gpus if not g.mig_enabled]
            free = sum(1 for g in whole if g.free_milli == 1000)
            free_total += free
            if free < len(whole):
                stranded += free
        return stranded / free_total if free_total else 0.0

    def node(self) -> NodeOut | None:
        """The selected node, with its topology once read."""
        if self.detail is not None and self.detail.name == self.selected:
            return self.detail
        return next((n for n in self.nodes if n.name == self.selected), None)

    def link_classes(self) -> list[tuple[int, int, str]]:
        """(GPU i, GPU j, link class) of the selected node; empty when its topology is unknown."""
        node = self.node()
        if node is None or node.links is None:
            return []
        return [(i, j, c) for i, row in enumerate(node.links) for j, c in enumerate(row) if i != j]

    def mig_layouts(self) -> list[tuple[int, str, int, bool]]:
        """(GPU index, profile, start slice, free) of the selected node's MIG instances."""
        node = self.node()
        if node is None:
            return []
        return [(g.index, s.profile, s.start, s.free) for g in node.gpus for s in g.mig_layout]

    def mig_layout_counts(self) -> list[tuple[str, str, int]]:
        """(model, layout as profiles by start, GPUs): which MIG layouts the cluster has."""
        counts: Counter[tuple[str, str]] = Counter()
        for n in self.nodes:
            for g in n.gpus:
                if g.mig_enabled:
                    layout = " + ".join(s.profile for s in sorted(g.mig_layout, key=_start))
                    counts[(g.model, layout or "(empty)")] += 1
        return [(m, lay, k) for (m, lay), k in sorted(counts.items())]


def _start(s: MigInstanceOut) -> int:
    return s.start
