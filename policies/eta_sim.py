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

Given the allocator's cluster state and placement policy (``Placing``), the replay places by
node as the allocator does: a fork of the snapshot per sample, releases give back the
holders' devices, each admitted workload is placed with the allocator's placement
(``place_gang``) and the first one blocked by capacity in a pass reserves the node the
allocator would reserve (``policies.placement.backfill``), so a later, smaller workload that
fits on another node is foreseen to start first. Without it (or for work without a placement
shape) the replay counts devices per flavor and the first workload blocked by capacity holds
back what it needs from those behind it. Placements are bounded per sample
(``Placing.max_tries``): a sample that reaches the cap stops, and what it had not admitted by
then waits *at least* that long (``Estimate.at_least`` when that decides the median). The real
allocator already tried every waiting workload on the snapshot, so the replay admits nothing
before the first release — never "under a minute" by this estimate. New arrivals ahead of a
workload are not foreseen. Pure: no I/O, time is an argument.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from policies import quota
from policies.errors import InvalidRequest
from policies.eta import HIGH_Q, LOW_Q, Interval, RunLengths
from policies.placement.backfill import member_request, reserve_node
from policies.placement.fork import ClusterFork
from policies.placement.framework import PlacementContext, Policy
from policies.placement.gangs import place_gang
from policies.placement.pipeline import NoFit
from policies.placement.state import ClusterState, Placement
from policies.requests import DeviceRequest, TopologyRequirement

SAMPLES = 24
"""Seeded replays per estimate: the p20 and p80 of 24 samples are the 5th and 20th."""
MAX_QUEUE = 400
"""Queued workloads replayed (in order); those behind get no estimate from the replay: its cost
grows with the square of the queue replayed."""
HORIZON_S = 30 * 86400.0
"""Releases further ahead than this are not replayed (their workloads get no estimate)."""
MAX_PLACE_TRIES = 400
"""Placement attempts per sample when replaying by node: a placement costs far more than a
count, and a long queue of workloads that do not fit would try again at every release."""
MIN_PLACE_TRIES = 16
NODE_VISITS = 50_000
"""What one sample may spend on placements, in nodes looked at: a placement may look at every
node of its model, so a large cluster gets fewer tries per sample (``place_tries``)."""


def place_tries(nodes: int) -> int:
    """Placement attempts per sample on a cluster of ``nodes`` nodes: ``NODE_VISITS`` over
    the nodes, within ``MIN_PLACE_TRIES``..``MAX_PLACE_TRIES``."""
    return max(MIN_PLACE_TRIES, min(MAX_PLACE_TRIES, NODE_VISITS // max(1, nodes)))


@dataclass(frozen=True, slots=True)
class Placing:
    """What placing by node needs: the allocator's cluster state (forked per sample, never
    changed) and placement policy, and the cap on placement attempts per sample."""

    cluster: ClusterState
    policy: Policy
    max_tries: int = MAX_PLACE_TRIES


@dataclass(frozen=True, slots=True)
class Shape:
    """How a waiting workload is placed: its device request, gang size and placement context,
    and the model each of its flavors is counted for (``(model, flavor)``, the allocator's
    order: quota is asked per model)."""

    devices: DeviceRequest
    members: int
    ctx: PlacementContext
    models: tuple[tuple[str, str], ...]


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
    placed: tuple[Placement, ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A queued workload: the flavors it may use (any one), how much of it, its time limit."""

    id: str
    tenant: str
    flavors: tuple[str, ...]
    need: int
    group: tuple[str, str]
    limit_s: float | None = None
    shape: Shape | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A waiting workload's replayed wait: the interval, and what its median sample waited
    for (releases at a time limit or deadline, and ones drawn from past run lengths).
    ``at_least``: no interval because the median sample reached the placement cap before
    admitting it; it waits at least this long."""

    interval: Interval | None
    by_limit: int
    by_history: int
    at_least: float | None = None


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
    placing: Placing | None = None,
) -> dict[str, Estimate]:
    """Every replayed waiting workload's estimate, by id (see the module docstring)."""
    if samples < 1:
        raise InvalidRequest("samples", samples, "at least 1")
    if placing is not None and placing.max_tries < 1:
        raise InvalidRequest("placement tries per sample", placing.max_tries, "at least 1")
    replayed = list(queue[:max_queue])
    got: dict[str, list[_Result]] = {w.id: [] for w in replayed}
    run = _Run(now, book, holders, history, horizon_s, placing)
    for k in range(samples):
        rng = random.Random(seed * 1_000_003 + k)
        for wid, result in run.one(usage, replayed, rng):
            got[wid].append(result)
    return {w.id: _summarize(got[w.id], samples) for w in replayed}


# One sample's wait of a workload: seconds from now, the releases at a limit and by history
# it waited for, and whether the wait is only a lower bound (the sample reached its cap).
_Result = tuple[float, int, int, bool]
# A release: when, a tie-break, whose, what it held per flavor, whether its end was declared,
# and its placements when replayed by node.
_Event = tuple[float, int, str, tuple[tuple[str, int], ...], bool, tuple[Placement, ...]]


class _Run:
    """What every sample of one ``simulate`` call shares: the inputs and the member requests
    already built (building one re-validates it)."""

    def __init__(
        self,
        now: float,
        book: quota.QuotaBook,
        holders: Sequence[Holder],
        history: RunLengths,
        horizon_s: float,
        placing: Placing | None,
    ) -> None:
        self.now, self.book, self.holders = now, book, holders
        self.history, self.horizon_s, self.placing = history, horizon_s, placing
        self.members: dict[
            tuple[DeviceRequest, frozenset[str]], tuple[DeviceRequest, TopologyRequirement]
        ] = {}

    def one(
        self, usage0: Mapping[tuple[str, str], int], queue: list[Waiting], rng: random.Random
    ) -> list[tuple[str, _Result]]:
        now, book, history, horizon_s = self.now, self.book, self.history, self.horizon_s
        usage = dict(usage0)
        used: dict[str, int] = {}
        for (_, fl), amount in usage.items():
            used[fl] = used.get(fl, 0) + amount
        capacity = book.capacity
        placing = self.placing
        cluster = ClusterFork(placing.cluster) if placing is not None else None
        tries = placing.max_tries if placing is not None else 0
        events: list[_Event] = []
        for i, h in enumerate(self.holders):
            end = sample_end(h, h.started_at, now, history, rng.random())
            if end - now <= horizon_s:
                known = h.deadline is not None or h.limit_s is not None
                events.append((end, i, h.tenant, h.held, known, h.placed))
        heapq.heapify(events)
        seq = len(events)
        pending = list(queue)
        out: list[tuple[str, _Result]] = []
        by_limit = by_history = 0
        while events and pending:
            t = events[0][0]
            freed: set[str] = set()
            while events and events[0][0] == t:
                _, _, tenant, held, known, placed = heapq.heappop(events)
                by_limit += known
                by_history += not known
                for fl, amount in held:
                    usage[(tenant, fl)] = usage.get((tenant, fl), 0) - amount
                    used[fl] = used.get(fl, 0) - amount
                    freed.add(fl)
                if cluster is not None:
                    for p in placed:
                        cluster.unapply(p)
            reserved: dict[str, int] = {}
            refused: dict[tuple[str, str], int] = {}
            # Per pass, as one full cycle of the allocator: the node reserved for the first
            # workload placement refused, and the shapes refused (not tried again).
            node: frozenset[str] = frozenset()
            failed: set[tuple[DeviceRequest, int, str]] = set()
            still: list[Waiting] = []
            for j, w in enumerate(pending):
                if not any(
                    capacity.get(fl, 0) - used.get(fl, 0) - reserved.get(fl, 0) > 0 for fl in freed
                ):
                    still.extend(pending[j:])
                    break
                placed = ()
                if cluster is not None and w.shape is not None:
                    admitted = _admit_quota(book, usage, refused, w, w.shape)
                    key = (w.shape.devices, w.shape.members, w.tenant)
                    if not admitted or key in failed:
                        still.append(w)
                        continue
                    if tries <= 0:
                        # The cap: what is not admitted yet waits at least this long.
                        left = (t - now, by_limit, by_history, True)
                        out.extend((v.id, left) for v in still + pending[j:])
                        return out
                    tries -= 1
                    got = self._place(cluster, w.shape, admitted, node)
                    if isinstance(got, NoFit):
                        failed.add(key)
                        if not node:
                            first = reserve_node(cluster, w.shape.devices, min(admitted))
                            node = frozenset({first}) if first is not None else node
                        still.append(w)
                        continue
                    placed = tuple(got)
                    for p in placed:
                        cluster.apply(p)
                    flavor = _flavor_of(cluster, w.shape, admitted, placed)
                else:
                    found = _admit(book, usage, used, capacity, reserved, refused, w)
                    if found is None:
                        still.append(w)
                        continue
                    flavor = found
                usage[(w.tenant, flavor)] = usage.get((w.tenant, flavor), 0) + w.need
                used[flavor] = used.get(flavor, 0) + w.need
                out.append((w.id, (t - now, by_limit, by_history, False)))
                end = sample_end(w, t, t, history, rng.random())
                if end - now <= horizon_s:
                    known = w.limit_s is not None
                    ev = (end, seq, w.tenant, ((flavor, w.need),), known, placed)
                    heapq.heappush(events, ev)
                    seq += 1
            pending = still
        return out

    def _place(
        self,
        cluster: ClusterState,
        shape: Shape,
        admitted: dict[str, str],
        reserved: frozenset[str],
    ) -> list[Placement] | NoFit:
        """The allocator's placement of every member of ``shape`` on the admitted models,
        away from the reserved node; the cluster is unchanged."""
        assert self.placing is not None
        key = (shape.devices, frozenset(admitted))
        got = self.members.get(key)
        if got is None:
            got = self.members[key] = member_request(shape.devices, frozenset(admitted))
        member, gang = got
        ctx = shape.ctx
        if reserved:
            ctx = PlacementContext(ctx.pools, ctx.tolerations, ctx.only, reserved, ctx.prefer)
        return place_gang(member, shape.members, cluster, self.placing.policy, ctx, gang)


def _admit_quota(
    book: quota.QuotaBook,
    usage: dict[tuple[str, str], int],
    refused: dict[tuple[str, str], int],
    w: Waiting,
    shape: Shape,
) -> dict[str, str]:
    """The models (with their flavors) whose flavor the quota rules admit ``w`` on now, asked
    per model as the allocator does; ``refused`` as in ``_admit``."""
    out: dict[str, str] = {}
    for model, fl in shape.models:
        key = (w.tenant, fl)
        if w.need >= refused.get(key, math.inf):
            continue
        if quota.admit(book, usage, w.tenant, fl, w.need).ok:
            out[model] = fl
        else:
            refused[key] = w.need
    return out


def _flavor_of(
    cluster: ClusterState, shape: Shape, admitted: dict[str, str], placed: Sequence[Placement]
) -> str:
    """The flavor the placement is counted as: its GPUs' model's."""
    p = placed[0]
    if p.gpus:
        model = cluster.node(p.node).node.gpus[p.gpus[0]].model
        if model in admitted:
            return admitted[model]
    return next(iter(admitted.values()))


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


def _summarize(results: list[_Result], total: int) -> Estimate:
    """Median and p20–p80 over the samples; a sample that never admits counts as infinite.
    No estimate when the median is infinite (only an unforeseen release admits it), nor when
    a sample that reached its cap is at or below the median: then the median is at least the
    median of the samples' waits and lower bounds (``at_least``)."""
    results = sorted(results)
    n = len(results)
    if n == 0:
        return Estimate(None, 0, 0)
    # The samples that never admitted it sort last, as infinite waits; an infinite p80 is
    # shown as the longest finite sample (a lower bound).
    mid = _rank(0.5, total)
    if mid >= n:
        return Estimate(None, 0, 0)
    if any(r[3] for r in results[: mid + 1]):
        return Estimate(None, 0, 0, at_least=results[mid][0])
    waits = [r[0] for r in results]
    high_i = _rank(HIGH_Q, total)
    high = waits[high_i] if high_i < n else waits[-1]
    point, by_limit, by_history, _ = results[mid]
    return Estimate(Interval(point, waits[_rank(LOW_Q, total)], high, ""), by_limit, by_history)


def _rank(q: float, n: int) -> int:
    return min(n - 1, max(0, math.ceil(q * n) - 1))
