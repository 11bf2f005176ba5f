"""``idle``: an allocated GPU, MIG instance or share used below a threshold for a while.

The condition holds for a sample with an allocation whose utilization of its own allocation is
below ``threshold_pct``. A share's utilization is of its parent GPU, so it is divided by the
share (a 250-milli share at 4 % of the GPU uses 16 % of its share). A sample whose utilization
was not measured (``None``) is never idle: no evidence is not evidence of idleness, and an idle
alert may cull the server.

``tenants`` gives a tenant its own threshold and ``for`` (an expensive GPU's tenant may call
15 minutes idle); the others use ``settings``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.alerts._checks import check_range, of_tenant
from policies.alerts.engine import Condition, RuleContext, RuleResult
from policies.alerts.samples import DeviceSample, ShareKind


@dataclass(frozen=True, slots=True)
class IdleSettings:
    threshold_pct: float = 5.0
    for_s: float = 30 * 60.0

    def __post_init__(self) -> None:
        check_range("idle threshold", self.threshold_pct, 0, 100)
        check_range("idle for", self.for_s, 0)


def own_utilization(sample: DeviceSample) -> float | None:
    """Utilization of the sample's own allocation, in percent (at most 100); ``None``: not
    measured."""
    alloc = sample.allocation
    if sample.utilization_pct is None:
        return None
    if alloc is not None and alloc.share is ShareKind.MILLI:
        return min(100.0, sample.utilization_pct / alloc.parent_fraction)
    return sample.utilization_pct


@dataclass(frozen=True, slots=True)
class IdleRule:
    settings: IdleSettings = field(default_factory=IdleSettings)
    name: str = "idle"
    tenants: Mapping[str, IdleSettings] = field(default_factory=dict)

    @property
    def for_s(self) -> float:
        return self.settings.for_s

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        out = []
        for s in ctx.snapshot.devices:
            alloc = s.allocation
            if alloc is None:
                continue
            cfg = of_tenant(self.settings, self.tenants, alloc.tenant)
            used = own_utilization(s)
            if used is not None and used < cfg.threshold_pct:
                out.append(
                    Condition(
                        scope=s.device,
                        subject=alloc.workload_id,
                        tenant=alloc.tenant,
                        owner=alloc.owner,
                        workloads=(alloc.workload_id,),
                        summary=(
                            f"{alloc.display} uses {used:.1f} % of {s.where}"
                            f" (idle below {cfg.threshold_pct:g} %)"
                        ),
                        value=used,
                        for_s=cfg.for_s,
                    )
                )
        return RuleResult(tuple(out))
