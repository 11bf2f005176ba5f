"""``long_queue_wait``: a queued workload waiting at least ``max_wait_s``; fires at once then."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.alerts._checks import check_range, of_tenant
from policies.alerts.engine import Condition, RuleContext, RuleResult


@dataclass(frozen=True, slots=True)
class LongQueueWaitSettings:
    max_wait_s: float = 30 * 60.0

    def __post_init__(self) -> None:
        check_range("maximum queue wait", self.max_wait_s, 0)


@dataclass(frozen=True, slots=True)
class LongQueueWaitRule:
    settings: LongQueueWaitSettings = field(default_factory=LongQueueWaitSettings)
    name: str = "long_queue_wait"
    tenants: Mapping[str, LongQueueWaitSettings] = field(default_factory=dict)

    @property
    def for_s(self) -> float:
        # The wait is the duration; counting ``for`` on top would wait twice.
        return 0.0

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        out = []
        for q in ctx.snapshot.queue:
            waited = ctx.now - q.queued_since
            if waited >= of_tenant(self.settings, self.tenants, q.tenant).max_wait_s:
                out.append(
                    Condition(
                        scope=q.tenant,
                        subject=q.workload_id,
                        tenant=q.tenant,
                        owner=q.owner,
                        workloads=(q.workload_id,),
                        summary=(
                            f"{q.name or q.workload_id} has waited {waited / 60:.0f} min"
                            " in the queue"
                        ),
                        value=waited,
                    )
                )
        return RuleResult(tuple(out))
