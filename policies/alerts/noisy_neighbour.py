"""``noisy_neighbour``: one workload crowding the others on a GPU it shares.

Scope: the parent GPU of shares (milli) and MIG instances. For each workload there:
- allocated share ``a`` = milli / 1000, or MIG compute slices / total slices;
- measured share ``m`` = its activity as a part of the parent GPU (a MIG instance's activity is
  of the instance, so it is multiplied by slices / total).

It is an *offender* when ``m > ratio x a`` and ``m - a > min_excess_pct / 100`` (defaults 1.5x
and 20 points). A co-located workload is a *victim* when its activity fell below
``(1 - drop) x`` its baseline; the baseline is an exponential moving average of its activity
(weight ``alpha`` per step), frozen while it is a victim so crowding does not become the new
normal, and ignored below ``min_baseline_pct``. The condition holds, keyed by GPU and offender,
while an offender and at least one victim exist; it names the offender first, then the victims.
Whole GPUs sharing a node or an NVLink/PCIe domain are not covered: the samples carry no
measure of the host resources they would contend for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from policies.alerts._checks import check_range
from policies.alerts.engine import Condition, RuleContext, RuleResult
from policies.alerts.samples import DeviceSample, ShareKind


@dataclass(frozen=True, slots=True)
class NoisyNeighbourSettings:
    ratio: float = 1.5
    min_excess_pct: float = 20.0
    drop: float = 0.3
    alpha: float = 0.1
    min_baseline_pct: float = 10.0
    for_s: float = 5 * 60.0

    def __post_init__(self) -> None:
        check_range("noisy neighbour ratio", self.ratio, 1)
        check_range("noisy neighbour excess", self.min_excess_pct, 0, 100)
        check_range("noisy neighbour drop", self.drop, 0, 1)
        check_range("noisy neighbour alpha", self.alpha, 0, 1)
        check_range("noisy neighbour minimum baseline", self.min_baseline_pct, 0, 100)
        check_range("noisy neighbour for", self.for_s, 0)


def measured_share(sample: DeviceSample) -> float:
    """The sample's activity as a part (0..1) of its parent GPU."""
    alloc = sample.allocation
    part = sample.activity_pct / 100
    if alloc is not None and alloc.share is ShareKind.MIG:
        return part * alloc.parent_fraction
    return part


@dataclass(frozen=True, slots=True)
class NoisyNeighbourRule:
    settings: NoisyNeighbourSettings = field(default_factory=NoisyNeighbourSettings)
    name: str = "noisy_neighbour"

    @property
    def for_s(self) -> float:
        return self.settings.for_s

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        cfg = self.settings
        memory = ctx.memory
        baseline: dict[str, float] = dict(memory) if isinstance(memory, Mapping) else {}
        groups: dict[str, list[DeviceSample]] = defaultdict(list)
        for s in ctx.snapshot.devices:
            if s.allocation is not None and s.allocation.share is not ShareKind.WHOLE:
                groups[s.gpu].append(s)
        victims_now: set[str] = set()
        out = []
        for gpu, members in sorted(groups.items()):
            victims = []
            for s in members:
                base = baseline.get(s.device)
                if (
                    base is not None
                    and base >= cfg.min_baseline_pct
                    and s.activity_pct < (1 - cfg.drop) * base
                ):
                    victims.append(s)
            for s in members:
                alloc = s.allocation
                assert alloc is not None
                a = alloc.parent_fraction
                m = measured_share(s)
                if not (m > cfg.ratio * a and m - a > cfg.min_excess_pct / 100):
                    continue
                hurt = [
                    v.allocation.workload_id
                    for v in victims
                    if v.allocation is not None and v.allocation.workload_id != alloc.workload_id
                ]
                if not hurt:
                    continue
                victims_now.update(v.device for v in victims)
                out.append(
                    Condition(
                        scope=gpu,
                        subject=alloc.workload_id,
                        tenant=alloc.tenant,
                        owner=alloc.owner,
                        workloads=(alloc.workload_id, *sorted(set(hurt))),
                        summary=(
                            f"{alloc.workload_id} uses {m:.0%} of {gpu} with {a:.0%} allocated;"
                            f" slowed: {', '.join(sorted(set(hurt)))}"
                        ),
                        value=m,
                    )
                )
        for s in ctx.snapshot.devices:
            if s.device in victims_now:
                continue
            base = baseline.get(s.device)
            baseline[s.device] = (
                s.activity_pct if base is None else base + cfg.alpha * (s.activity_pct - base)
            )
        return RuleResult(tuple(out), MappingProxyType(baseline))
