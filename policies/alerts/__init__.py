"""Alert rules over typed samples and the pending -> firing -> resolved state machine.

``Engine(rules).step(state, snapshot, now)`` is pure; ``default_rules()`` gives every rule with
its default settings. ``docs/alerts.md`` describes each rule with a worked example.
"""

from __future__ import annotations

from policies.alerts.budget_burn import BudgetBurnRule, BudgetBurnSettings
from policies.alerts.ecc import EccRule
from policies.alerts.engine import (
    Alert,
    AlertKey,
    AlertState,
    Condition,
    Engine,
    EngineState,
    Rule,
    RuleContext,
    RuleResult,
    Skipped,
    Transition,
)
from policies.alerts.idle import IdleRule, IdleSettings
from policies.alerts.long_queue_wait import LongQueueWaitRule, LongQueueWaitSettings
from policies.alerts.memory_over_share import MemoryOverShareRule, MemoryOverShareSettings
from policies.alerts.noisy_neighbour import (
    NoisyNeighbourRule,
    NoisyNeighbourSettings,
    NoisyScope,
    SlowedByNeighbourRule,
)
from policies.alerts.quota_pressure import QuotaPressureRule, QuotaPressureSettings
from policies.alerts.samples import (
    AllocationContext,
    BudgetSample,
    DeviceSample,
    QueueSample,
    ShareKind,
    Snapshot,
    TenantUsageSample,
)
from policies.alerts.throttle import ThrottleRule, ThrottleSettings
from policies.alerts.xid import CounterSettings, XidRule


def default_rules() -> tuple[Rule, ...]:
    """Every rule with its default settings."""
    return (
        IdleRule(),
        NoisyNeighbourRule(),
        SlowedByNeighbourRule(),
        MemoryOverShareRule(),
        XidRule(),
        EccRule(),
        ThrottleRule(),
        QuotaPressureRule(),
        LongQueueWaitRule(),
        BudgetBurnRule(),
    )


__all__ = [
    "Alert",
    "AlertKey",
    "AlertState",
    "AllocationContext",
    "BudgetBurnRule",
    "BudgetBurnSettings",
    "BudgetSample",
    "Condition",
    "CounterSettings",
    "DeviceSample",
    "EccRule",
    "Engine",
    "EngineState",
    "IdleRule",
    "IdleSettings",
    "LongQueueWaitRule",
    "LongQueueWaitSettings",
    "MemoryOverShareRule",
    "MemoryOverShareSettings",
    "NoisyNeighbourRule",
    "NoisyNeighbourSettings",
    "NoisyScope",
    "QueueSample",
    "QuotaPressureRule",
    "QuotaPressureSettings",
    "Rule",
    "RuleContext",
    "RuleResult",
    "ShareKind",
    "Skipped",
    "SlowedByNeighbourRule",
    "Snapshot",
    "TenantUsageSample",
    "ThrottleRule",
    "ThrottleSettings",
    "Transition",
    "XidRule",
    "default_rules",
]
