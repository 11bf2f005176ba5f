"""A simple, explainable estimate of how long a pending workload waits.

Everything ahead of it in the queue (``position_amounts``) and the workload itself (``need``)
must fit, in the same unit, into what is free now plus what running work releases as it ends.
Walking the running work by expected end time, the estimate is the first end at which

    free_now + Σ released so far >= Σ position_amounts + need

Work with no expected end (``end_at`` infinite or NaN) releases nothing; work already past its
expected end counts as ending now. ``None`` when the known ends never free enough. The
estimate ignores placement (fragmentation, topology) and new arrivals with higher priority;
it is a hint for people, not a promise.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

from policies.errors import InvalidRequest


def estimate_wait(
    position_amounts: Sequence[int],
    running_ends: Sequence[tuple[float, int]],
    free_now: int,
    need: int,
    now: float,
) -> float | None:
    """Seconds from ``now`` until ``need`` (after everything ahead of it) likely fits."""
    if need < 0 or free_now < 0 or any(a < 0 for a in position_amounts):
        raise InvalidRequest(
            "amounts", f"need={need} free_now={free_now} ahead={list(position_amounts)}", ">= 0"
        )
    return ReleaseCurve(running_ends).wait(sum(position_amounts), free_now, need, now)


class ReleaseCurve:
    """What running work releases over time: its finite expected ends, sorted, with the
    cumulative amount released by each. Built once, asked for many queued workloads (a walk
    down the queue asks once per entry), each answer a binary search."""

    __slots__ = ("_released", "_times")

    def __init__(self, running_ends: Sequence[tuple[float, int]]) -> None:
        for _, amount in running_ends:
            if amount < 0:
                raise InvalidRequest("running amount", amount, ">= 0")
        ends = sorted((end, amount) for end, amount in running_ends if math.isfinite(end))
        self._times = [end for end, _ in ends]
        self._released = list(itertools.accumulate(amount for _, amount in ends))

    @classmethod
    def _of_sorted(cls, times: list[float], amounts: list[int]) -> ReleaseCurve:
        curve = cls.__new__(cls)
        curve._times = times
        curve._released = list(itertools.accumulate(amounts))
        return curve

    def wait(self, ahead: int, free_now: int, need: int, now: float) -> float | None:
        """Seconds until ``free_now`` plus what has ended covers ``ahead + need``."""
        if need < 0 or free_now < 0 or ahead < 0:
            raise InvalidRequest(
                "amounts", f"need={need} free_now={free_now} ahead={ahead}", ">= 0"
            )
        short = ahead + need - free_now
        if short <= 0:
            return 0.0
        i = bisect.bisect_left(self._released, short)
        if i == len(self._released):
            return None
        return max(0.0, self._times[i] - now)


class ReleaseTimeline:
    """``ReleaseCurve``'s incremental twin: the holders' finite expected ends kept sorted as
    holders come and go, so a live state keeps one per flavor and answers one queued
    workload's wait by walking only the first ends it needs — O(ends walked) — instead of
    collecting and sorting every holder per question. ``wait`` answers what a
    ``ReleaseCurve`` of the same ends answers; ``curve()`` is that curve, for a walk down a
    whole queue."""

    __slots__ = ("_ends",)

    def __init__(self) -> None:
        self._ends: list[tuple[float, str, int]] = []

    def add(self, end: float, holder: str, amount: int) -> None:
        if amount < 0:
            raise InvalidRequest("running amount", amount, ">= 0")
        if amount and math.isfinite(end):
            bisect.insort(self._ends, (end, holder, amount))

    def remove(self, end: float, holder: str, amount: int) -> None:
        if not amount or not math.isfinite(end):
            return
        entry = (end, holder, amount)
        i = bisect.bisect_left(self._ends, entry)
        if i == len(self._ends) or self._ends[i] != entry:
            raise KeyError(entry)
        del self._ends[i]

    def __len__(self) -> int:
        return len(self._ends)

    def entries(self) -> list[tuple[float, str, int]]:
        return list(self._ends)

    def wait(self, ahead: int, free_now: int, need: int, now: float) -> float | None:
        """Seconds until ``free_now`` plus what has ended covers ``ahead + need``."""
        if need < 0 or free_now < 0 or ahead < 0:
            raise InvalidRequest(
                "amounts", f"need={need} free_now={free_now} ahead={ahead}", ">= 0"
            )
        short = ahead + need - free_now
        if short <= 0:
            return 0.0
        released = 0
        for end, _, amount in self._ends:
            released += amount
            if released >= short:
                return max(0.0, end - now)
        return None

    def curve(self) -> ReleaseCurve:
        return ReleaseCurve._of_sorted([e[0] for e in self._ends], [e[2] for e in self._ends])
