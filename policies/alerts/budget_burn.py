"""``budget_burn``: the spend projected to the end of the period exceeds the budget.

Projection (``policies.pricing.projected_spend``): spent / elapsed x period length, evaluated
once at least ``min_elapsed_s`` of the period passed (earlier rates are noise).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.alerts._checks import check_range, of_tenant
from policies.alerts.engine import Condition, RuleContext, RuleResult
from policies.pricing import Period, projected_spend


@dataclass(frozen=True, slots=True)
class BudgetBurnSettings:
    min_elapsed_s: float = 3600.0
    for_s: float = 3600.0

    def __post_init__(self) -> None:
        check_range("budget burn minimum elapsed", self.min_elapsed_s, 1)
        check_range("budget burn for", self.for_s, 0)


@dataclass(frozen=True, slots=True)
class BudgetBurnRule:
    settings: BudgetBurnSettings = field(default_factory=BudgetBurnSettings)
    name: str = "budget_burn"
    tenants: Mapping[str, BudgetBurnSettings] = field(default_factory=dict)

    @property
    def for_s(self) -> float:
        return self.settings.for_s

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        out = []
        now = math.floor(ctx.now)
        for b in ctx.snapshot.budgets:
            cfg = of_tenant(self.settings, self.tenants, b.tenant)
            if now - b.period_start < cfg.min_elapsed_s:
                continue
            projected = projected_spend(b.spent, Period(b.period_start, b.period_end), now)
            if projected > b.budget:
                out.append(
                    Condition(
                        scope=b.tenant,
                        subject=str(b.period_start),
                        tenant=b.tenant,
                        owner=None,
                        workloads=(),
                        summary=(
                            f"{b.tenant} is projected to spend {float(projected):.2f}"
                            f" of its {b.budget} budget"
                        ),
                        value=float(projected),
                        for_s=cfg.for_s,
                    )
                )
        return RuleResult(tuple(out))
