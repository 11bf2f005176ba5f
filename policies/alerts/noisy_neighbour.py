"""``noisy_neighbour``: one workload crowding the others where they share hardware.

Scopes (``NoisyScope``, all on by default):
- ``gpu``: the parent GPU of shares (milli) and MIG instances. Allocated share ``a`` = milli /
  1000 or compute slices / total slices; measured share ``m`` = the workload's activity as a
  part of the parent GPU (a MIG instance's activity is of the instance, so it is multiplied by
  slices / total).
- ``node`` and ``domain``: whole GPUs on one node, or in one NVLink/PCIe domain of a node, held
  by different workloads. ``a`` = the workload's sampled GPUs / all sampled GPUs there; ``m`` =
  the workload's summed activity / all summed activity there (0 when all are idle). A workload
  driving far more of the node than its GPUs while a neighbour slows down is the usual sign of
  contention for what the GPUs share (PCIe, host memory, CPU).

A workload is an *offender* when ``m > ratio x a`` and ``m - a > min_excess_pct / 100``
(defaults 1.5x and 20 points). A co-located workload is a *victim* when the activity of one of
its devices fell below ``(1 - drop) x`` that device's baseline; the baseline is an exponential
moving average of the device's activity (weight ``alpha`` per step), frozen while it is a victim
so crowding does not become the new normal, and ignored below ``min_baseline_pct``. The
condition holds while an offender and at least one victim exist, as two alerts that never name
the other side (co-located workloads often belong to different tenants):

- ``noisy_neighbour``, keyed by scope and offender, scoped to the offender's tenant and owner:
  it names the offender only and says how many workloads it slows;
- ``slowed_by_neighbour``, keyed by scope and victim, scoped to the victim's tenant and owner:
  it names the victim only, says how far its activity fell, and what its owner can do.

Both rules compute the same crowding from the same samples (``crowding``), each keeping its own
baselines, so each alert has its own ``for``.

Samples without activity measured (``None``: a MIG instance on a GPU without GPU Performance
Monitoring) take no part: neither offender nor victim, not counted in any share, and their
baselines stay as they were.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from policies.alerts._checks import check_range
from policies.alerts.engine import Condition, RuleContext, RuleResult
from policies.alerts.samples import AllocationContext, DeviceSample, ShareKind
from policies.errors import InvalidRequest


class NoisyScope(StrEnum):
    GPU = "gpu"
    NODE = "node"
    DOMAIN = "domain"


@dataclass(frozen=True, slots=True)
class NoisyNeighbourSettings:
    ratio: float = 1.5
    min_excess_pct: float = 20.0
    drop: float = 0.3
    alpha: float = 0.1
    min_baseline_pct: float = 10.0
    for_s: float = 5 * 60.0
    scopes: frozenset[NoisyScope] = frozenset(NoisyScope)

    def __post_init__(self) -> None:
        check_range("noisy neighbour ratio", self.ratio, 1)
        check_range("noisy neighbour excess", self.min_excess_pct, 0, 100)
        check_range("noisy neighbour drop", self.drop, 0, 1)
        check_range("noisy neighbour alpha", self.alpha, 0, 1)
        check_range("noisy neighbour minimum baseline", self.min_baseline_pct, 0, 100)
        check_range("noisy neighbour for", self.for_s, 0)
        if not self.scopes or not all(isinstance(x, NoisyScope) for x in self.scopes):
            raise InvalidRequest(
                "noisy neighbour scopes", sorted(map(str, self.scopes)), "some of gpu, node, domain"
            )


def _activity(sample: DeviceSample) -> float:
    """The activity of a sample that has one (the rule filters the others out first)."""
    assert sample.activity_pct is not None
    return sample.activity_pct


def measured_share(sample: DeviceSample) -> float:
    """The sample's activity as a part (0..1) of its parent GPU."""
    alloc = sample.allocation
    part = _activity(sample) / 100
    if alloc is not None and alloc.share is ShareKind.MIG:
        return part * alloc.parent_fraction
    return part


@dataclass(frozen=True, slots=True)
class Crowded:
    """One offender in one scope and the devices of the workloads it slows there."""

    scope: str
    where: str  # the scope for people: a GPU's label, node:<n>, domain:<n>/<d>
    offender: AllocationContext
    allocated: float
    measured: float
    victims: tuple[tuple[AllocationContext, tuple[DeviceSample, ...]], ...]


def crowding(
    ctx: RuleContext, cfg: NoisyNeighbourSettings
) -> tuple[list[Crowded], Mapping[str, float]]:
    """This step's offenders with their victims, and the devices' baselines after the step."""
    memory = ctx.memory
    baseline: dict[str, float] = dict(memory) if isinstance(memory, Mapping) else {}

    def dropped(s: DeviceSample) -> bool:
        base = baseline.get(s.device)
        return (
            base is not None
            and base >= cfg.min_baseline_pct
            and _activity(s) < (1 - cfg.drop) * base
        )

    measured = tuple(s for s in ctx.snapshot.devices if s.activity_pct is not None)
    victims_now: set[str] = set()
    out: list[Crowded] = []
    for scope, where, members in _groups(measured, cfg.scopes):
        victims = {w: [d for d in m.devices if dropped(d)] for w, m in members.items()}
        for w, member in members.items():
            a, m = member.allocated, member.measured
            if not (m > cfg.ratio * a and m - a > cfg.min_excess_pct / 100):
                continue
            hurt = sorted(v for v, devs in victims.items() if devs and v != w)
            if not hurt:
                continue
            victims_now.update(d.device for v in hurt for d in victims[v])
            out.append(
                Crowded(
                    scope,
                    where,
                    member.alloc,
                    a,
                    m,
                    tuple((members[v].alloc, tuple(victims[v])) for v in hurt),
                )
            )
    for s in measured:
        if s.device in victims_now:
            continue
        base, now = baseline.get(s.device), _activity(s)
        baseline[s.device] = now if base is None else base + cfg.alpha * (now - base)
    return out, MappingProxyType(baseline)


def _baseline_of(ctx: RuleContext, device: str) -> float | None:
    memory = ctx.memory
    return memory.get(device) if isinstance(memory, Mapping) else None


@dataclass(frozen=True, slots=True)
class NoisyNeighbourRule:
    """The offender's alert: it names the offender only."""

    settings: NoisyNeighbourSettings = field(default_factory=NoisyNeighbourSettings)
    name: str = "noisy_neighbour"

    @property
    def for_s(self) -> float:
        return self.settings.for_s

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        crowded, baseline = crowding(ctx, self.settings)
        out = []
        for c in crowded:
            n = len(c.victims)
            out.append(
                Condition(
                    scope=c.scope,
                    subject=c.offender.workload_id,
                    tenant=c.offender.tenant,
                    owner=c.offender.owner,
                    workloads=(c.offender.workload_id,),
                    summary=(
                        f"{c.offender.display} uses {c.measured:.0%} of {c.where} with"
                        f" {c.allocated:.0%} allocated and is slowing {n} other"
                        f" workload{'s' if n != 1 else ''} there; keep to your share or ask"
                        " for a whole GPU"
                    ),
                    value=c.measured,
                )
            )
        return RuleResult(tuple(out), baseline)


@dataclass(frozen=True, slots=True)
class SlowedByNeighbourRule:
    """The victim's alert: it names the victim only, never the neighbour or its tenant."""

    settings: NoisyNeighbourSettings = field(default_factory=NoisyNeighbourSettings)
    name: str = "slowed_by_neighbour"

    @property
    def for_s(self) -> float:
        return self.settings.for_s

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        crowded, baseline = crowding(ctx, self.settings)
        out: dict[tuple[str, str], Condition] = {}
        for c in crowded:
            for victim, devices in c.victims:
                key = (c.scope, victim.workload_id)
                if key in out:  # slowed by two offenders there: one alert
                    continue
                d = devices[0]
                base = _baseline_of(ctx, d.device)
                fell = f" from {base:.0f} % to {_activity(d):.0f} %" if base is not None else ""
                out[key] = Condition(
                    scope=c.scope,
                    subject=victim.workload_id,
                    tenant=victim.tenant,
                    owner=victim.owner,
                    workloads=(victim.workload_id,),
                    summary=(
                        f"{victim.display} is slowed by another workload on {c.where}: its"
                        f" activity fell{fell}. Stopping and starting it again may place it on"
                        " another GPU; a whole GPU has no neighbours"
                    ),
                    value=_activity(d),
                )
        return RuleResult(tuple(out[k] for k in sorted(out)), baseline)


@dataclass(slots=True)
class _Member:
    alloc: AllocationContext
    allocated: float
    measured: float
    devices: list[DeviceSample]


def _groups(
    samples: tuple[DeviceSample, ...], scopes: frozenset[NoisyScope]
) -> list[tuple[str, str, dict[str, _Member]]]:
    """Co-located workloads by scope name (and its name for people), only where at least two
    workloads meet."""
    out: list[tuple[str, str, dict[str, _Member]]] = []
    if NoisyScope.GPU in scopes:
        by_gpu: dict[str, dict[str, _Member]] = defaultdict(dict)
        labels: dict[str, str] = {}
        for s in samples:
            alloc = s.allocation
            if alloc is None or alloc.share is ShareKind.WHOLE:
                continue
            if s.label:
                # "n1: GPU 0 / MIG 3g.40gb": the GPU is the part before the instance's own.
                labels.setdefault(s.gpu, s.label.split(" / ", 1)[0])
            group = by_gpu[s.gpu]
            member = group.get(alloc.workload_id)
            if member is None:
                group[alloc.workload_id] = _Member(alloc, 0.0, 0.0, [])
                member = group[alloc.workload_id]
            member.allocated += alloc.parent_fraction
            member.measured += measured_share(s)
            member.devices.append(s)
        out.extend((g, labels.get(g, g), m) for g, m in sorted(by_gpu.items()))
    for scope in (NoisyScope.NODE, NoisyScope.DOMAIN):
        if scope not in scopes:
            continue
        hosts: dict[str, list[DeviceSample]] = defaultdict(list)
        for s in samples:
            alloc = s.allocation
            if alloc is None or alloc.share is not ShareKind.WHOLE or not alloc.node:
                continue
            if scope is NoisyScope.DOMAIN:
                if alloc.domain:
                    hosts[f"domain:{alloc.node}/{alloc.domain}"].append(s)
            else:
                hosts[f"node:{alloc.node}"].append(s)
        for name, devs in sorted(hosts.items()):
            total_activity = sum(_activity(d) for d in devs)
            members: dict[str, _Member] = {}
            for d in devs:
                assert d.allocation is not None
                member = members.setdefault(
                    d.allocation.workload_id, _Member(d.allocation, 0.0, 0.0, [])
                )
                member.allocated += 1 / len(devs)
                if total_activity > 0:
                    member.measured += _activity(d) / total_activity
                member.devices.append(d)
            out.append((name, name, members))
    return [(name, where, group) for name, where, group in out if len(group) >= 2]
