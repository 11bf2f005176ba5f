"""When held devices are expected back, kept up to date as the live state changes.

A queued workload's ETA asks "when do the holders of my flavor (or my tenant's holders of it)
free enough?". Collecting and sorting every holder per question costs O(holders · log) —
tens of milliseconds at 100,000 GPUs, on every request that ends up queued. The live state
instead keeps one ``ReleaseTimeline`` per flavor and per (flavor, tenant), changed by the
same assignment that changes a workload in memory (``LiveTable``), so the timelines cannot
drift from the workloads they describe. Only the applied state keeps them; a decision's
working copy does not read ETAs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

from policies.eta import ReleaseTimeline
from portal.allocator.memory import Live

Key = tuple[str, str | None]  # (flavor, tenant); tenant None: every tenant's holders


def _held(lv: Live) -> dict[str, int]:
    """Amount held per flavor, as the ledger counts it."""
    out: dict[str, int] = {}
    for a in lv.allocations:
        if a.flavor:
            out[a.flavor] = out.get(a.flavor, 0) + a.amount
    return out


class ReleaseIndex:
    __slots__ = ("_timelines",)

    def __init__(self) -> None:
        self._timelines: dict[Key, ReleaseTimeline] = {}

    def timeline(self, flavor: str, tenant: str | None) -> ReleaseTimeline:
        got = self._timelines.get((flavor, tenant))
        return got if got is not None else ReleaseTimeline()

    def replace(self, wid: str, old: Live | None, new: Live | None) -> None:
        if old is not None and old.allocations:
            for fl, amount in _held(old).items():
                for key in ((fl, None), (fl, old.rec.tenant)):
                    self._timelines[key].remove(old.end_at, wid, amount)
        if new is not None and new.allocations:
            for fl, amount in _held(new).items():
                for key in ((fl, None), (fl, new.rec.tenant)):
                    line = self._timelines.get(key)
                    if line is None:
                        line = self._timelines[key] = ReleaseTimeline()
                    line.add(new.end_at, wid, amount)

    def snapshot(self) -> dict[Key, list[tuple[float, str, int]]]:
        return {k: line.entries() for k, line in self._timelines.items() if len(line)}


class LiveTable(dict[str, Live]):
    """The live workloads by id; every assignment and deletion also updates ``releases``.
    Other ways of changing a dict are refused so none can bypass the index."""

    __slots__ = ("releases",)

    def __init__(self) -> None:
        super().__init__()
        self.releases = ReleaseIndex()

    def __setitem__(self, wid: str, lv: Live) -> None:
        old = self.get(wid)
        super().__setitem__(wid, lv)
        self.releases.replace(wid, old, lv)

    def __delitem__(self, wid: str) -> None:
        old = self[wid]
        super().__delitem__(wid)
        self.releases.replace(wid, old, None)

    def _refused(self, *_: Any, **__: Any) -> NoReturn:
        raise TypeError("LiveTable changes only by assignment and del (they keep its index)")

    pop = popitem = clear = update = setdefault = __ior__ = _refused

    @classmethod
    def of(cls, lives: Iterable[Live]) -> LiveTable:
        table = cls()
        for lv in lives:
            table[lv.rec.id] = lv
        return table
