"""Which figures of a device a caller filtered to some tenants may read: those of the intervals
one of its tenants held the device.

Holdings come from the allocation history (``created_at``, ``released_at``; a workload's tenant
from its row), read only:

- a whole GPU or a shared GPU (milli shares) is held by each allocation on its UUID; a share's
  holder reads the GPU's totals (device series carry no process or workload), never another
  workload's figures;
- a MIG instance (``<GPU>/gi<id>``) is held by the allocation whose workload the instance's
  samples were attributed to (``telemetry_workload_samples``: ingest decides which workload an
  instance's sample belongs to). A MIG allocation not yet or no longer traced to an instance
  (its raw samples pruned) may have held any instance of its GPU: it grants its tenant nothing
  there, and it blocks other tenants where a figure would reach into its time.

A raw point at ``t`` is shown when a holding of the caller's covers ``t``. A roll-up bucket
``[b, e)`` is shown when it meets the caller's holdings and no other tenant's holding meets the
part of the bucket outside them (a minute in which alice's workload started right after bob's
ended averages bob's samples too: neither sees it).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import Engine, Table, select

from portal.store.models import metadata
from portal.store.records import AllocationRecord
from portal.store.writer import Store
from portal.telemetry.attribution import GpuInfo
from portal.telemetry.store import HOUR_S, between
from portal.telemetry.tables import WORKLOAD_SAMPLES

_WORKLOADS: Table = metadata.tables["workloads"]

Interval = tuple[float, float]  # [start, end) in epoch s; end is inf while held


def _merge(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _meets(intervals: Iterable[Interval], lo: float, hi: float) -> bool:
    return any(a < hi and lo < b for a, b in intervals)


def _outside(mine: list[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts of ``[lo, hi)`` that ``mine`` (merged) does not cover."""
    out: list[Interval] = []
    at = lo
    for a, b in mine:
        if b <= at or a >= hi:
            continue
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < hi:
        out.append((at, hi))
    return out


@dataclass(frozen=True, slots=True)
class DeviceAccess:
    """Per device, the caller's holdings and other tenants' (each merged)."""

    mine: Mapping[str, list[Interval]] = field(default_factory=dict)
    others: Mapping[str, list[Interval]] = field(default_factory=dict)

    def held(self, device: str) -> list[Interval]:
        return self.mine.get(device, [])

    def point(self, device: str, at: float) -> bool:
        return any(a <= at < b for a, b in self.held(device))

    def bucket(self, device: str, lo: float, hi: float) -> bool:
        mine = self.held(device)
        if not _meets(mine, lo, hi):
            return False
        others = self.others.get(device, [])
        return not any(_meets(others, a, b) for a, b in _outside(mine, lo, hi))

    def span(self, device: str, lo: float, hi: float) -> Interval | None:
        """The part of ``[lo, hi)`` from the caller's first to its last holding (None: none)."""
        inside = [(max(a, lo), min(b, hi)) for a, b in self.held(device) if a < hi and lo < b]
        if not inside:
            return None
        return inside[0][0], inside[-1][1]


def _epoch(t: datetime | None) -> float:
    return math.inf if t is None else t.timestamp()


def device_access(
    store: Store,
    gpus: Mapping[str, GpuInfo],
    tenants: Collection[str],
    start: float,
    end: float,
) -> DeviceAccess:
    """Holdings of every device in ``[start, end)``: ``tenants``' and the others'."""
    records = store.allocations_between(
        datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC)
    )
    if not records:
        return DeviceAccess()
    parent = {m: g for g, info in gpus.items() for m in info.mig_instances}
    tenant_of = _tenants(store.engine, {a.workload_id for a in records})
    mig = [a for a in records if a.mig_profile is not None]
    instances = _instances(store.engine, {a.workload_id for a in mig}, start, end)
    mine: dict[str, list[Interval]] = {}
    others: dict[str, list[Interval]] = {}

    def add(device: str, a: AllocationRecord, ours: bool) -> None:
        (mine if ours else others).setdefault(device, []).append(
            (_epoch(a.created_at), _epoch(a.released_at))
        )

    for a in records:
        ours = tenant_of.get(a.workload_id) in tenants
        gpu_ids = {parent.get(u, u) for u in a.gpu_uuids}
        if a.mig_profile is None:
            for g in gpu_ids:
                add(g, a, ours)
            continue
        traced = [d for d in instances.get(a.workload_id, ()) if d.split("/", 1)[0] in gpu_ids]
        for d in traced:
            add(d, a, ours)
        if not traced and not ours:
            for g in gpu_ids:  # on some instance of the GPU: blocks every one of them
                for d in _known_instances(instances, g):
                    add(d, a, False)
    return DeviceAccess(
        {d: _merge(v) for d, v in mine.items()}, {d: _merge(v) for d, v in others.items()}
    )


def _known_instances(instances: Mapping[str, set[str]], gpu: str) -> set[str]:
    return {d for ds in instances.values() for d in ds if d.split("/", 1)[0] == gpu}


def _tenants(engine: Engine, workload_ids: set[str]) -> dict[str, str]:
    w = _WORKLOADS.c
    with engine.connect() as conn:
        rows = conn.execute(select(w.id, w.tenant).where(w.id.in_(sorted(workload_ids))))
        return {r[0]: r[1] for r in rows}


def _instances(
    engine: Engine, workload_ids: set[str], start: float, end: float
) -> dict[str, set[str]]:
    """The MIG instances (``<GPU>/gi<id>``) each workload's samples were attributed to, from
    its samples near ``[start, end)`` (the window's buckets reach up to an hour past it; a
    holding with no sample there put none of its figures in the window either)."""
    if not workload_ids:
        return {}
    w = WORKLOAD_SAMPLES.c
    lo, hi = round((start - HOUR_S) * 1000), round((end + HOUR_S) * 1000)
    stmt = (
        select(w.workload_id, w.device)
        .where(
            w.workload_id.in_(sorted(workload_ids)),
            w.device.contains("/"),
            between(w.at_ms, lo, hi),
        )
        .distinct()
    )
    out: dict[str, set[str]] = {}
    with engine.connect() as conn:
        for wid, device in conn.execute(stmt):
            out.setdefault(wid, set()).add(device)
    return out
