"""``ecc``: a new uncorrectable ECC error fires at once (see ``policies.alerts.xid``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.alerts.engine import RuleContext, RuleResult
from policies.alerts.xid import CounterSettings, counter_conditions


@dataclass(frozen=True, slots=True)
class EccRule:
    settings: CounterSettings = field(default_factory=CounterSettings)
    name: str = "ecc"

    @property
    def for_s(self) -> float:
        return 0.0

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        return counter_conditions(
            ctx,
            lambda s: s.ecc_uncorrectable,
            lambda _: "uncorrectable ECC error",
            self.settings.hold_s,
        )
