"""``xid`` and ``ecc``: a new XID error or uncorrectable ECC error fires at once.

A counter that increased since the device's previous accepted sample is a new error. The alert
fires at once (``for`` is 0) and stays firing until ``hold_s`` passed without a further increase,
then resolves. A counter that went down (a driver reload resets it) is a new baseline, not an
error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from policies.alerts._checks import check_range
from policies.alerts.engine import Condition, RuleContext, RuleResult
from policies.alerts.samples import DeviceSample


@dataclass(frozen=True, slots=True)
class CounterSettings:
    hold_s: float = 10 * 60.0

    def __post_init__(self) -> None:
        check_range("hold", self.hold_s, 0)


def counter_conditions(
    ctx: RuleContext,
    counter: Callable[[DeviceSample], int],
    what: str,
    hold_s: float,
) -> RuleResult:
    """Conditions for devices whose ``counter`` rose within ``hold_s``; memory: last rise time."""
    memory = ctx.memory
    last_rise: dict[str, float] = dict(memory) if isinstance(memory, Mapping) else {}
    seen: dict[str, DeviceSample] = {}
    for s in ctx.snapshot.devices:
        seen[s.device] = s
        prev = ctx.previous.get(s.device)
        if prev is not None and counter(s) > counter(prev):
            last_rise[s.device] = ctx.now
    for device in [d for d, t in last_rise.items() if t < ctx.now and ctx.now - t >= hold_s]:
        del last_rise[device]
    out = []
    for device in sorted(last_rise):
        s_or_none = seen.get(device) or ctx.previous.get(device)
        alloc = s_or_none.allocation if s_or_none is not None else None
        out.append(
            Condition(
                scope=device,
                subject=device,
                tenant=alloc.tenant if alloc else None,
                owner=alloc.owner if alloc else None,
                workloads=(alloc.workload_id,) if alloc else (),
                summary=f"new {what} on {device}",
                value=float(counter(s_or_none)) if s_or_none is not None else 0.0,
            )
        )
    return RuleResult(tuple(out), MappingProxyType(last_rise))


@dataclass(frozen=True, slots=True)
class XidRule:
    settings: CounterSettings = field(default_factory=CounterSettings)
    name: str = "xid"

    @property
    def for_s(self) -> float:
        return 0.0

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        return counter_conditions(ctx, lambda s: s.xid_count, "XID error", self.settings.hold_s)
