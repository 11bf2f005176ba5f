"""``quota_pressure``: a tenant using at least ``ratio`` of its limit of a flavor for a while."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.alerts._checks import check_range, of_tenant
from policies.alerts.engine import Condition, RuleContext, RuleResult


@dataclass(frozen=True, slots=True)
class QuotaPressureSettings:
    ratio: float = 0.9
    for_s: float = 15 * 60.0

    def __post_init__(self) -> None:
        check_range("quota pressure ratio", self.ratio, 0, 1)
        check_range("quota pressure for", self.for_s, 0)


@dataclass(frozen=True, slots=True)
class QuotaPressureRule:
    settings: QuotaPressureSettings = field(default_factory=QuotaPressureSettings)
    name: str = "quota_pressure"
    tenants: Mapping[str, QuotaPressureSettings] = field(default_factory=dict)

    @property
    def for_s(self) -> float:
        return self.settings.for_s

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        out = []
        for t in ctx.snapshot.tenants:
            cfg = of_tenant(self.settings, self.tenants, t.tenant)
            if t.limit > 0 and t.used >= cfg.ratio * t.limit:
                out.append(
                    Condition(
                        scope=t.tenant,
                        subject=t.flavor,
                        tenant=t.tenant,
                        owner=None,
                        workloads=(),
                        summary=f"{t.tenant} uses {t.used:g} of its {t.limit:g} {t.flavor}",
                        value=t.used / t.limit,
                        for_s=cfg.for_s,
                    )
                )
        return RuleResult(tuple(out))
