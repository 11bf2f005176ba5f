"""Queue waits estimated by replaying the queue forward on a snapshot, many times.

From the running work (each holder's end: its time limit, shortened by how its group's runs
usually compare to their limits; else its remaining time drawn from its group's past run
lengths given how long it has run) and the queue in the allocator's order, ``simulate``
replays releases and admissions with the quota rules of ``policies.quota`` until every
waiting workload is admitted, ``samples`` times with seeded draws for what is unknown. A
workload's wait is the median over the samples, its interval their p20–p80: when the run-length
model is right, the interval holds the realized wait about 60 % of the time by construction.
With exact ends only (a preemption deadline, limits that runs always reach), the samples agree
— too much: what is left out below makes real waits differ, so the portal shows an interval
calibrated on its own past errors instead (``policies.eta.WaitCalibration``).

Counts, not devices: placement (topology, fragmentation) is not replayed. The real allocator
already tried every waiting workload on the snapshot, so the replay admits nothing before the
first release — a workload that fits by the counts still waits for one, never "under a
minute" by this estimate. The first workload blocked by capacity on a flavor holds back what
it needs from the workloads behind it, as the allocator's reservation does. New arrivals ahead
of a workload are not foreseen. Pure: no I/O, time is an argument.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies import quota
from policies.errors import InvalidRequest
from policies.eta import HIGH_Q, LOW_Q, Interval, RunLengths

SAMPLES = 24
"""Seeded replays per estimate: the p20 and p80 of 24 samples are the 5th and 20th."""
MAX_QUEUE = 400
"""Queued workloads replayed (in order); those behind get no estimate from the replay: its cost
grows with the square of the queue replayed."""
HORIZON_S = 30 * 86400.0
"""Releases further ahead than this are not replayed (their workloads get no estimate)."""


@dataclass(frozen=True, slots=True)
class Holder:
    """Running work: what it holds per flavor, since when, and its end when known — its time
    limit (``limit_s``, a bound a run may end before) or a fixed deadline (``deadline``, a
    preemption's grace end)."""

    tenant: str
    held: tuple[tuple[str, int], ...]
    started_at: float
    group: tuple[str, str]
    limit_s: float | None = None
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    """A queued workload: the flavors it may use (any one), how much of it, its time limit."""

    id: str
    tenant: str
    flavors: tuple[str, ...]
    need: int
    group: tuple[str, str]
    limit_s: float | None = None


@dataclass(frozen=True, slots=True)
class Estimate:
    """A waiting workload's replayed wait: the interval, and what its median sample waited
    for (releases at a time limit or deadline, and ones drawn from past run lengths)."""

    interval: Interval | None
    by_limit: int
    by_history: int


def sample_end(
    h: Holder | Waiting, start: float, now: float, history: RunLengths, u: float
) -> float:
    """One draw of when work that started at ``start`` ends, given it still runs at ``now``
    (``u`` uniform in [0, 1)); inf when nothing tells."""
    if isinstance(h, Holder) and h.deadline is not None:
        return max(now, h.deadline)
    elapsed = max(0.0, now - start)
    if h.limit_s is not None and h.limit_s > 0:
        done = elapsed / h.limit_s
        rest = history.of_limits.draw(h.group, done, u)
        share = 1.0 if rest is None else min(1.0, done + rest)
        return max(now, start + share * h.limit_s)
    rem = history.draw(h.group, elapsed, u)
    return math.inf if rem is None else now + rem


def simulate(
    now: float,
    book: quota.QuotaBook,
    usage: Mapping[tuple[str, str], int],
    holders: Sequence[Holder],
    queue: Sequence[Waiting],
    history: RunLengths,
    samples: int = SAMPLES,
    seed: int = 0,
    max_queue: int = MAX_QUEUE,
    horizon_s: float = HORIZON_S,
) -> dict[str, Estimate]:
    """Every replayed waiting workload's estimate, by id (see the module docstring)."""
    if samples < 1:
        raise InvalidRequest("samples", samples, "at least 1")
    replayed = list(queue[:max_queue])
    got: dict[str, list[tuple[float, int, int]]] = {w.id: [] for w in replayed}
    for k in range(samples):
        rng = random.Random(seed * 1_000_003 + k)
        for wid, result in _one(now, book, usage, holders, replayed, history, rng, horizon_s):
            got[wid].append(result)
    return {w.id: _summarize(got[w.id], samples) for w in replayed}


def _one(
    now: float,
    book: quota.QuotaBook,
    usage0: Mapping[tuple[str, str], int],
    holders: Sequence[Holder],
    queue: list[Waiting],
    history: RunLengths,
    rng: random.Random,
    horizon_s: float,
) -> list[tuple[str, tuple[float, int, int]]]:
    usage = dict(usage0)
    used: dict[str, int] = {}
    for (_, fl), amount in usage.items():
        used[fl] = used.get(fl, 0) + amount
    capacity = book.capacity
    events: list[tuple[float, int, str, tuple[tuple[str, int], ...], bool]] = []
    for i, h in enumerate(holders):
        end = sample_end(h, h.started_at, now, history, rng.random())
        if end - now <= horizon_s:
            known = h.deadline is not None or h.limit_s is not None
            events.append((end, i, h.tenant, h.held, known))
    heapq.heapify(events)
    seq = len(events)
    pending = list(queue)
    out: list[tuple[str, tuple[float, int, int]]] = []
    by_limit = by_history = 0
    while events and pending:
        t = events[0][0]
        freed: set[str] = set()
        while events and events[0][0] == t:
            _, _, tenant, held, known = heapq.heappop(events)
            by_limit += known
            by_history += not known
            for fl, amount in held:
                usage[(tenant, fl)] = usage.get((tenant, fl), 0) - amount
                used[fl] = used.get(fl, 0) - amount
                freed.add(fl)
        reserved: dict[str, int] = {}
        refused: dict[tuple[str, str], int] = {}
        still: list[Waiting] = []
        for j, w in enumerate(pending):
            if not any(
                capacity.get(fl, 0) - used.get(fl, 0) - reserved.get(fl, 0) > 0 for fl in freed
            ):
                still.extend(pending[j:])
                break
            flavor = _admit(book, usage, used, capacity, reserved, refused, w)
            if flavor is None:
                still.append(w)
                continue
            usage[(w.tenant, flavor)] = usage.get((w.tenant, flavor), 0) + w.need
            used[flavor] = used.get(flavor, 0) + w.need
            out.append((w.id, (t - now, by_limit, by_history)))
            end = sample_end(w, t, t, history, rng.random())
            if end - now <= horizon_s:
                known = w.limit_s is not None
                heapq.heappush(events, (end, seq, w.tenant, ((flavor, w.need),), known))
                seq += 1
        pending = still
    return out


def _admit(
    book: quota.QuotaBook,
    usage: dict[tuple[str, str], int],
    used: dict[str, int],
    capacity: Mapping[str, int],
    reserved: dict[str, int],
    refused: dict[tuple[str, str], int],
    w: Waiting,
) -> str | None:
    """The first of ``w``'s flavors the quota rules admit it on now, else None; the first
    workload blocked by capacity on a flavor reserves its need there.

    ``refused``: per (tenant, flavor), the least need the quota rules refused in this pass.
    Within a pass usage only grows, and more usage or a larger need never turns a refusal
    into an admission, so a need at least that large is refused without asking again (the
    replay's cost was mostly these repeated refusals)."""
    for fl in w.flavors:
        free = capacity.get(fl, 0) - used.get(fl, 0) - reserved.get(fl, 0)
        if free < w.need:
            if fl not in reserved:
                reserved[fl] = max(0, min(w.need, capacity.get(fl, 0) - used.get(fl, 0)))
            continue
        key = (w.tenant, fl)
        if w.need >= refused.get(key, math.inf):
            continue
        if quota.admit(book, usage, w.tenant, fl, w.need).ok:
            return fl
        refused[key] = w.need
    return None


def _summarize(results: list[tuple[float, int, int]], total: int) -> Estimate:
    """Median and p20–p80 over the samples; a sample that never admits counts as infinite.
    No estimate when the median is infinite (only an unforeseen release admits it)."""
    results = sorted(results)
    n = len(results)
    if n == 0:
        return Estimate(None, 0, 0)
    # The samples that never admitted it sort last, as infinite waits; an infinite p80 is
    # shown as the longest finite sample (a lower bound).
    mid = _rank(0.5, total)
    if mid >= n:
        return Estimate(None, 0, 0)
    waits = [r[0] for r in results]
    high_i = _rank(HIGH_Q, total)
    high = waits[high_i] if high_i < n else waits[-1]
    point, by_limit, by_history = results[mid]
    return Estimate(Interval(point, waits[_rank(LOW_Q, total)], high, ""), by_limit, by_history)


def _rank(q: float, n: int) -> int:
    return min(n - 1, max(0, math.ceil(q * n) - 1))
