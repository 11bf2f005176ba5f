"""``throttle``: thermal or power throttling reasons set on a GPU for a while.

Reasons are NVML's clock-event bitmask; the default mask is software power cap (0x4), hardware
slowdown (0x8), software thermal (0x20), hardware thermal (0x40) and hardware power brake (0x80).
Idle (0x1) and application clock settings (0x2) are not throttling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.alerts._checks import check_range
from policies.alerts.engine import Condition, RuleContext, RuleResult

SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
THERMAL_OR_POWER = SW_POWER_CAP | HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE


@dataclass(frozen=True, slots=True)
class ThrottleSettings:
    mask: int = THERMAL_OR_POWER
    for_s: float = 10 * 60.0

    def __post_init__(self) -> None:
        check_range("throttle mask", self.mask, 1)
        check_range("throttle for", self.for_s, 0)


@dataclass(frozen=True, slots=True)
class ThrottleRule:
    settings: ThrottleSettings = field(default_factory=ThrottleSettings)
    name: str = "throttle"

    @property
    def for_s(self) -> float:
        return self.settings.for_s

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        out = []
        for s in ctx.snapshot.devices:
            reasons = s.throttle_reasons & self.settings.mask
            if not reasons:
                continue
            alloc = s.allocation
            out.append(
                Condition(
                    scope=s.device,
                    subject=s.device,
                    tenant=alloc.tenant if alloc else None,
                    owner=alloc.owner if alloc else None,
                    workloads=(alloc.workload_id,) if alloc else (),
                    summary=(
                        f"{s.where} throttled (reasons {reasons:#x}) at {s.temperature_c:g} °C"
                        + (f"; workload {alloc.display}" if alloc else "")
                    ),
                    value=float(reasons),
                )
            )
        return RuleResult(tuple(out))
