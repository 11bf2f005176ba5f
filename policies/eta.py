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
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

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
        short = _shortfall(ahead, free_now, need)
        if short <= 0:
            return 0.0
        i = bisect.bisect_left(self._released, short)
        if i == len(self._released):
            return None
        return max(0.0, self._times[i] - now)


def _shortfall(ahead: int, free_now: int, need: int) -> int:
    """How much must be released before ``need`` fits after ``ahead``."""
    if need < 0 or free_now < 0 or ahead < 0:
        raise InvalidRequest("amounts", f"need={need} free_now={free_now} ahead={ahead}", ">= 0")
    return ahead + need - free_now


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
        short = _shortfall(ahead, free_now, need)
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


# ---------------------------------------------------------------- calibrated intervals

LOW_Q, POINT_Q, HIGH_Q = 0.2, 0.5, 0.8
MIN_HISTORY = 5
"""Completed runs a group needs before its history estimates a holder's remaining time; with
fewer, the pooled history of every group answers."""


class RunLengths:
    """Completed run lengths (seconds) per group (tenant and kind), kept sorted, and the
    remaining time of a holder that has run ``elapsed`` so far: the empirical quantiles of
    ``length - elapsed`` over the completed runs longer than ``elapsed``. A holder that has
    outlived every recorded run of its group gets no estimate from it (None).

    Only the newest ``per_group`` runs of a group (and ``pooled`` of all) are kept: habits
    change, and a live portal adds a run at every end for as long as it runs."""

    __slots__ = ("_all", "_by", "_limits", "_order", "_per_group", "_pooled")

    def __init__(self, per_group: int = 1000, pooled: int = 20_000) -> None:
        if per_group < 1 or pooled < 1:
            raise InvalidRequest("run-length window", (per_group, pooled), "at least 1 run")
        self._per_group = per_group
        self._pooled = pooled
        self._by: dict[tuple[str, str], list[float]] = {}
        self._all: list[float] = []
        # Arrival order, oldest first, to forget the oldest run of a group and of the pool.
        self._order: dict[tuple[str, str] | None, deque[float]] = {}
        self._limits: RunLengths | None = None

    @property
    def of_limits(self) -> RunLengths:
        """The runs that had a time limit, as fractions of it (length / limit): how far short
        of their limits a group's runs end (1.0: limits are exact)."""
        if self._limits is None:
            self._limits = RunLengths(self._per_group, self._pooled)
        return self._limits

    def add(self, group: tuple[str, str], length: float, limit_s: float | None = None) -> None:
        """One completed run; ``limit_s``: the time limit it declared, if any."""
        if not (math.isfinite(length) and length >= 0):
            raise InvalidRequest("run length", length, "a finite number of seconds >= 0")
        if limit_s is not None and math.isfinite(limit_s) and limit_s > 0:
            self.of_limits.add(group, min(1.0, length / limit_s))
        for key, lengths, cap in ((group, None, self._per_group), (None, self._all, self._pooled)):
            if lengths is None:
                lengths = self._by.setdefault(group, [])
            bisect.insort(lengths, length)
            order = self._order.setdefault(key, deque())
            order.append(length)
            if len(order) > cap:
                oldest = order.popleft()
                del lengths[bisect.bisect_left(lengths, oldest)]

    def __len__(self) -> int:
        return len(self._all)

    @property
    def capacity(self) -> int:
        """The most runs kept in all (the pooled window)."""
        return self._pooled

    def remaining(
        self, group: tuple[str, str], elapsed: float, qs: Sequence[float] = (LOW_Q, POINT_Q, HIGH_Q)
    ) -> tuple[float, ...] | None:
        """Quantiles ``qs`` of the remaining time after ``elapsed``, nondecreasing in q."""
        elapsed = max(0.0, elapsed)
        for lengths in (self._by.get(group, []), self._all):
            i = bisect.bisect_right(lengths, elapsed)
            longer = len(lengths) - i
            if longer >= MIN_HISTORY or (lengths is self._all and longer > 0):
                return tuple(lengths[i + _rank(q, longer)] - elapsed for q in qs)
        return None

    def draw(self, group: tuple[str, str], elapsed: float, u: float) -> float | None:
        """One random remaining time after ``elapsed`` (``u`` uniform in [0, 1)): a run drawn
        from those of the group (or, with too few, of all) longer than ``elapsed``."""
        elapsed = max(0.0, elapsed)
        for lengths in (self._by.get(group, []), self._all):
            i = bisect.bisect_right(lengths, elapsed)
            longer = len(lengths) - i
            if longer >= MIN_HISTORY or (lengths is self._all and longer > 0):
                return lengths[i + min(longer - 1, int(u * longer))] - elapsed
        return None


@dataclass(frozen=True, slots=True)
class Release:
    """When one holder is expected to free ``amount``: ends at the low, point and high
    quantile (epoch seconds; inf: unknown), and whether the end is a declared time limit."""

    amount: int
    low: float
    point: float
    high: float
    declared: bool


class Interval(NamedTuple):
    """A wait: its point, its p20–p80 interval (seconds from now) and why, in words. A named
    tuple: a queue view makes one per pending workload."""

    point: float
    low: float
    high: float
    reason: str


def release_of(
    amount: int,
    started_at: float,
    declared_end: float | None,
    group: tuple[str, str],
    history: RunLengths,
    now: float,
) -> Release:
    """A holder's release: its declared end when it has one, else its remaining time by the
    history of its group's runs (unknown when there is none)."""
    if declared_end is not None and math.isfinite(declared_end):
        return Release(amount, declared_end, declared_end, declared_end, True)
    rem = history.remaining(group, now - started_at)
    if rem is None:
        inf = float("inf")
        return Release(amount, inf, inf, inf, False)
    return Release(amount, now + rem[0], now + rem[1], now + rem[2], False)


class IntervalCurve:
    """The low, point and high release curves of one flavor's holders (one ``ReleaseCurve``
    each), built once and asked for every queued workload: each answer three binary
    searches. Since every holder's low <= point <= high, the k-th smallest end of each
    curve keeps that order, so every interval has low <= point <= high."""

    __slots__ = ("_curves", "_declared", "_first", "_next")

    def __init__(self, releases: Sequence[Release]) -> None:
        self._curves = tuple(
            ReleaseCurve([(getattr(r, q), r.amount) for r in releases])
            for q in ("low", "point", "high")
        )
        ended = sorted((r.point, r.declared) for r in releases if math.isfinite(r.point))
        self._first = ended[0] if ended else None
        self._declared = any(r.declared for r in releases)
        self._next: tuple[float, str, str] | None = None  # (now, unit, what frees next)

    def interval(
        self, ahead: int, free_now: int, need: int, now: float, ahead_count: int, unit: str
    ) -> Interval | None:
        """The wait of a workload behind ``ahead`` (``ahead_count`` workloads), None when the
        known and estimated ends never free enough."""
        if need < 0 or free_now < 0 or ahead < 0:
            raise InvalidRequest(
                "amounts", f"need={need} free_now={free_now} ahead={ahead}", ">= 0"
            )
        short = ahead + need - free_now
        if short <= 0:
            return Interval(0.0, 0.0, 0.0, self._reason(ahead_count, unit, now))
        # ReleaseCurve.wait for each curve, inlined: a queue view asks once per workload.
        waits = []
        for c in self._curves:
            i = bisect.bisect_left(c._released, short)
            waits.append(math.inf if i == len(c._released) else max(0.0, c._times[i] - now))
        low, point, high = waits
        if point == math.inf:
            return None
        return Interval(point, low, high, self._reason(ahead_count, unit, now))

    def _reason(self, ahead_count: int, unit: str, now: float) -> str:
        if ahead_count == 0:
            queue = "nothing ahead of you"
        elif ahead_count == 1:
            queue = "1 workload ahead of you"
        else:
            queue = f"{ahead_count} workloads ahead of you"
        cached = self._next
        if cached is None or cached[0] != now or cached[1] != unit:
            cached = self._next = (now, unit, self._what_frees(unit, now))
        return f"{queue}; {cached[2]}"

    def _what_frees(self, unit: str, now: float) -> str:
        if self._first is None:
            return "waits for a release: no running workload has an end time"
        end, declared = self._first
        how = "reaches its time limit" if declared else "ends, judging by past run lengths"
        return f"the next {unit} frees {minutes_words(end - now)} when a job {how}"


def _rank(q: float, n: int) -> int:
    """The nearest-rank index of quantile ``q`` among ``n`` sorted values."""
    return min(n - 1, max(0, math.ceil(q * n) - 1))


def minutes_words(seconds: float) -> str:
    """A wait in a reason: 'within a minute' or 'in about N min'."""
    if seconds < 60:
        return "within a minute"
    return f"in about {math.ceil(seconds / 60)} min"


class WaitCalibration:
    """How past estimates turned out: the ratios realized / estimated wait of admitted
    workloads (the newest ``window``), kept sorted. ``apply`` puts the interval at the raw
    point times their p20 and p80 — split-conformal: when waits to come err as past ones did,
    the interval holds the realized wait 60 % of the time whatever the replay left out
    (arrivals that jump ahead, placement, preemption). The raw interval's own width is not
    added: the ratios already hold that spread, and adding it over-covers. The point stays
    the raw point, moved into the interval when past waits say it lies outside. With fewer
    than ``MIN_HISTORY`` ratios it returns the estimate as is."""

    __slots__ = ("_order", "_ratios", "_window")

    def __init__(self, window: int = 1000) -> None:
        if window < MIN_HISTORY:
            raise InvalidRequest("calibration window", window, f"at least {MIN_HISTORY}")
        self._ratios: list[float] = []
        self._order: deque[float] = deque()
        self._window = window

    def __len__(self) -> int:
        return len(self._ratios)

    def add(self, estimated: float, realized: float) -> None:
        if not (math.isfinite(estimated) and estimated > 0):
            return  # nothing to learn from a zero or unknown estimate
        if not (math.isfinite(realized) and realized >= 0):
            raise InvalidRequest("realized wait", realized, "a finite number of seconds >= 0")
        ratio = realized / estimated
        bisect.insort(self._ratios, ratio)
        self._order.append(ratio)
        if len(self._order) > self._window:
            oldest = self._order.popleft()
            del self._ratios[bisect.bisect_left(self._ratios, oldest)]

    def _q(self, q: float) -> float:
        r = self._ratios
        return r[_rank(q, len(r))]

    def apply(self, raw: Interval) -> Interval:
        if len(self._ratios) < MIN_HISTORY:
            return raw
        low, high = raw.point * self._q(LOW_Q), raw.point * self._q(HIGH_Q)
        return Interval(min(high, max(low, raw.point)), low, high, raw.reason)
