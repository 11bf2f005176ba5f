"""``memory_over_share``: a fractional share using more GPU memory than it was allocated.

The allocated memory is ``AllocationContext.memory_mib`` or, when that is 0, milli / 1000 of
the GPU's memory (``memory_total_mib`` of the sample). Using exactly the share is fine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.alerts._checks import check_range, of_tenant
from policies.alerts.engine import Condition, RuleContext, RuleResult
from policies.alerts.samples import ShareKind


@dataclass(frozen=True, slots=True)
class MemoryOverShareSettings:
    for_s: float = 60.0

    def __post_init__(self) -> None:
        check_range("memory over share for", self.for_s, 0)


@dataclass(frozen=True, slots=True)
class MemoryOverShareRule:
    settings: MemoryOverShareSettings = field(default_factory=MemoryOverShareSettings)
    name: str = "memory_over_share"
    tenants: Mapping[str, MemoryOverShareSettings] = field(default_factory=dict)

    @property
    def for_s(self) -> float:
        return self.settings.for_s

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        out = []
        for s in ctx.snapshot.devices:
            alloc = s.allocation
            if alloc is None or alloc.share is not ShareKind.MILLI:
                continue
            allowed = alloc.memory_mib or s.memory_total_mib * alloc.parent_fraction
            if allowed > 0 and s.memory_used_mib > allowed:
                out.append(
                    Condition(
                        scope=s.gpu,
                        subject=alloc.workload_id,
                        tenant=alloc.tenant,
                        owner=alloc.owner,
                        workloads=(alloc.workload_id,),
                        summary=(
                            f"{alloc.display} uses {s.memory_used_mib:.0f} MiB of GPU memory"
                            f" on {s.where}, {allowed:.0f} MiB allocated"
                        ),
                        value=s.memory_used_mib,
                        for_s=of_tenant(self.settings, self.tenants, alloc.tenant).for_s,
                    )
                )
        return RuleResult(tuple(out))
