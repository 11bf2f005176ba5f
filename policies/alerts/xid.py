"""``xid`` and ``ecc``: a new XID error or uncorrectable ECC error fires at once.

A counter that increased since the device's previous accepted sample is a new error. The alert
fires at once (``for`` is 0) and stays firing until ``hold_s`` passed without a further increase,
then resolves. A counter that went down (a driver reload resets it) is a new baseline, not an
error. The XID alert names the code of the latest error and its meaning (its value is the code;
the count when the driver gave none).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from policies.alerts._checks import check_range
from policies.alerts.engine import Condition, RuleContext, RuleResult
from policies.alerts.samples import DeviceSample
from policies.alerts.xid_codes import describe_xid


@dataclass(frozen=True, slots=True)
class CounterSettings:
    hold_s: float = 10 * 60.0

    def __post_init__(self) -> None:
        check_range("hold", self.hold_s, 0)


def counter_conditions(
    ctx: RuleContext,
    counter: Callable[[DeviceSample], int],
    what: Callable[[DeviceSample], str],
    hold_s: float,
    value: Callable[[DeviceSample], float] | None = None,
) -> RuleResult:
    """Conditions for devices whose ``counter`` rose within ``hold_s``; memory: last rise time.

    ``what`` names the error of a sample in the summary; ``value`` is the alert's value (the
    counter by default)."""
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
                summary=_summary(s_or_none, device, what),
                value=(
                    0.0
                    if s_or_none is None
                    else (value or (lambda x: float(counter(x))))(s_or_none)
                ),
            )
        )
    return RuleResult(tuple(out), MappingProxyType(last_rise))


def _summary(s: DeviceSample | None, device: str, what: Callable[[DeviceSample], str]) -> str:
    if s is None:
        return f"new error on {device}"
    alloc = s.allocation
    held = f"; workload {alloc.display}" if alloc is not None else ""
    return f"new {what(s)} on {s.where}{held}"


@dataclass(frozen=True, slots=True)
class XidRule:
    settings: CounterSettings = field(default_factory=CounterSettings)
    name: str = "xid"

    @property
    def for_s(self) -> float:
        return 0.0

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        return counter_conditions(
            ctx,
            lambda s: s.xid_count,
            lambda s: describe_xid(s.last_xid),
            self.settings.hold_s,
            # The code says what happened; the count only that something did.
            lambda s: float(s.last_xid if s.last_xid is not None else s.xid_count),
        )
