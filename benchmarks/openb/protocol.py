"""One run of the published protocol: a policy, a seed, every arrival placed and measured.

1. The cluster is every trace node, inserted in a per-seed random order; that order is the
   placement tie-break (first node wins among equal scores).
2. Pods arrive in a per-seed shuffled order; then pods sampled uniformly with replacement
   from the trace are appended until the next one would push total GPU demand above
   ``inflation`` × cluster GPUs. There are no departures and no retries.
3. After every arrival: ``arrived %`` = Σ GPU milli of arrived pods ÷ cluster milli, rounded
   to an integer bin; per bin the mean allocation % and fragmentation ratio are kept.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from benchmarks.openb.trace import TraceNode, TracePod, typical_shapes
from policies.flavors import MILLI_PER_GPU
from policies.placement.pipeline import NoFit, place
from policies.placement.scorers import policy as make_policy
from policies.placement.scorers.fragmentation import FragModel, Shape, state_key
from policies.placement.state import ClusterState, Placement

INFLATION = 1.3


@dataclass(frozen=True, slots=True)
class Arrival:
    """One arrival and where it went (``placement`` None: it failed)."""

    seq: int
    pod: TracePod
    placement: Placement | None


@dataclass(slots=True)
class RunResult:
    policy: str
    seed: int
    arrivals: list[Arrival] = field(default_factory=list)
    alloc_by_bin: dict[int, float] = field(default_factory=dict)
    frag_by_bin: dict[int, float] = field(default_factory=dict)
    times_ns: list[int] = field(default_factory=list)

    def unallocated_at(self, arrived: int) -> float:
        """100 − allocation % in the ``arrived`` bin (the last bin if the run stopped short)."""
        if arrived in self.alloc_by_bin:
            return 100.0 - self.alloc_by_bin[arrived]
        last = max(b for b in self.alloc_by_bin if b <= arrived)
        return 100.0 - self.alloc_by_bin[last]


def arrival_order(
    pods: Sequence[TracePod], gpus: int, seed: int, inflation: float = INFLATION
) -> list[TracePod]:
    """Shuffled trace pods, then uniform resamples until demand would exceed the target."""
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    limit = inflation * gpus * MILLI_PER_GPU
    demand = sum(p.total_milli for p in order)
    while True:
        nxt = pods[rng.randrange(len(pods))]
        if demand + nxt.total_milli > limit:
            break
        order.append(nxt)
        demand += nxt.total_milli
    return order


def node_order(nodes: Sequence[TraceNode], seed: int) -> list[TraceNode]:
    """The per-seed node permutation (the simulator's random name prefixes)."""
    out = list(nodes)
    random.Random(f"nodes-{seed}").shuffle(out)
    return out


def arrived_bin(arrived_milli: int, capacity_milli: int) -> int:
    """Arrived % rounded half up to an integer (Go's math.Round for positive values)."""
    return math.floor(arrived_milli * 100 / capacity_milli + 0.5)


def run(
    policy_name: str,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    seed: int,
    inflation: float = INFLATION,
    typical: Sequence[tuple[Shape, float]] | None = None,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> RunResult:
    """Replay one seed. FGD gets the trace's typical pods; Random a generator seeded here."""
    typical = list(typical) if typical is not None else typical_shapes(pods)
    pol = make_policy(policy_name, typical=typical, rng=random.Random(seed))
    cluster = ClusterState(n.to_node() for n in node_order(nodes, seed))
    capacity = sum(n.gpus for n in nodes) * MILLI_PER_GPU
    metric = FragModel(typical)
    frag = {st.name: metric.node(st) for st in cluster}
    frag_total = sum(frag.values())
    result = RunResult(policy_name, seed)
    arrived = allocated = 0
    sums: dict[int, list[float]] = {}
    for seq, pod in enumerate(arrival_order(pods, sum(n.gpus for n in nodes), seed, inflation)):
        req = pod.to_request()
        t0 = clock()
        got = place(req, cluster, pol)
        placement = None if isinstance(got, NoFit) else got
        if placement is not None:
            cluster.apply(placement)
        pol.observe(req, placement)
        result.times_ns.append(clock() - t0)
        result.arrivals.append(Arrival(seq, pod, placement))
        arrived += pod.total_milli
        if placement is not None:
            allocated += pod.total_milli
            st = cluster.node(placement.node)
            new = metric.value(state_key(st))
            frag_total += new - frag[st.name]
            frag[st.name] = new
        idle = capacity - allocated
        b = arrived_bin(arrived, capacity)
        acc = sums.setdefault(b, [0.0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += 100.0 * allocated / capacity
        acc[2] += 100.0 * frag_total / idle if idle else 0.0
    for b, (n, alloc, fr) in sorted(sums.items()):
        result.alloc_by_bin[b] = alloc / n
        result.frag_by_bin[b] = fr / n
    return result


def summarize(results: Sequence[RunResult]) -> dict[str, float]:
    """Mean ± std over seeds of the headline numbers, and pooled per-placement times."""

    def ms(values: list[float]) -> tuple[float, float]:
        xs = [x for x in values if not math.isnan(x)]
        if not xs:
            return math.nan, math.nan
        return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0

    u100 = [r.unallocated_at(100) for r in results]
    u130 = [r.unallocated_at(130) for r in results]
    f90 = [r.frag_by_bin.get(90, math.nan) for r in results]
    times = sorted(t for r in results for t in r.times_ns)
    out = {}
    out["unalloc100_mean"], out["unalloc100_std"] = ms(u100)
    out["unalloc130_mean"], out["unalloc130_std"] = ms(u130)
    out["frag90_mean"], out["frag90_std"] = ms(f90)
    out["time_median_ms"] = times[len(times) // 2] / 1e6 if times else math.nan
    out["time_p99_ms"] = (
        times[min(len(times) - 1, int(0.99 * len(times)))] / 1e6 if times else math.nan
    )
    return out
