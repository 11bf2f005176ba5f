"""The alert rules with the operator's thresholds and durations, platform-wide and per tenant.

Two settings, both JSON objects keyed by rule name, then by setting (``docs/alerts.md`` lists
every rule's settings and defaults)::

    GPUPORTAL_ALERT_RULES='{"idle": {"threshold_pct": 5, "for_s": 1800}, "xid": {"hold_s": 300}}'
    GPUPORTAL_ALERT_TENANT_RULES='{"team-gpu": {"idle": {"for_s": 900}}}'

A tenant's settings start from the platform's and replace what they name. Only rules whose
alerts belong to one tenant take tenant settings (``TENANT_RULES``): idle, memory over share,
quota pressure, long queue wait, budget burn. Rules about hardware (XID, ECC, throttling) and
about neighbours, who may be of different tenants, are platform-wide. ``noisy_neighbour``'s
settings hold for both of its alerts (the offender's and the victim's).

A rule, setting or value that is not valid raises ``InvalidRequest`` naming the setting, the
path in it and the value, and what would be valid; the service does not start.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from policies.alerts import (
    BudgetBurnRule,
    BudgetBurnSettings,
    CounterSettings,
    EccRule,
    IdleRule,
    IdleSettings,
    LongQueueWaitRule,
    LongQueueWaitSettings,
    MemoryOverShareRule,
    MemoryOverShareSettings,
    NoisyNeighbourRule,
    NoisyNeighbourSettings,
    NoisyScope,
    QuotaPressureRule,
    QuotaPressureSettings,
    SlowedByNeighbourRule,
    ThrottleRule,
    ThrottleSettings,
    XidRule,
)
from policies.alerts.engine import Rule
from policies.errors import InvalidRequest

RULES_SETTING = "GPUPORTAL_ALERT_RULES"
TENANT_RULES_SETTING = "GPUPORTAL_ALERT_TENANT_RULES"

SETTINGS: Mapping[str, type[Any]] = {
    "idle": IdleSettings,
    "noisy_neighbour": NoisyNeighbourSettings,
    "memory_over_share": MemoryOverShareSettings,
    "xid": CounterSettings,
    "ecc": CounterSettings,
    "throttle": ThrottleSettings,
    "quota_pressure": QuotaPressureSettings,
    "long_queue_wait": LongQueueWaitSettings,
    "budget_burn": BudgetBurnSettings,
}
TENANT_RULES = frozenset(
    {"idle", "memory_over_share", "quota_pressure", "long_queue_wait", "budget_burn"}
)


def _value(where: str, field: dataclasses.Field[Any], value: object) -> object:
    """A JSON value as the settings field's type: numbers stay numbers (an int field wants an
    int), the noisy-neighbour scopes become a set of ``NoisyScope``."""
    default = field.default
    if isinstance(default, frozenset):
        names = sorted(s.value for s in NoisyScope)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidRequest(where, json_text(value), f"a list of {', '.join(names)}")
        unknown = sorted(set(value) - set(names))
        if unknown or not value:
            raise InvalidRequest(where, json_text(value), f"some of {', '.join(names)}")
        return frozenset(NoisyScope(v) for v in value)
    if isinstance(default, bool) or isinstance(value, bool):
        raise InvalidRequest(where, json_text(value), "a number")
    if isinstance(default, int) and not isinstance(value, int):
        raise InvalidRequest(where, json_text(value), "a whole number")
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(where, json_text(value), "a number")
    return value


def json_text(value: object) -> str:
    return repr(value) if not isinstance(value, str) else f'"{value}"'


def _settings(setting: str, rule: str, base: Any, given: object) -> Any:
    """``base`` with the fields ``given`` names replaced, validated."""
    cls = SETTINGS[rule]
    if not isinstance(given, Mapping):
        raise InvalidRequest(f"setting {setting} {rule}", json_text(given), "a JSON object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    changes: dict[str, object] = {}
    for name, value in given.items():
        where = f"setting {setting} {rule}.{name}"
        if name not in fields:
            raise InvalidRequest(where, json_text(value), f"one of {', '.join(sorted(fields))}")
        changes[name] = _value(where, fields[name], value)
    # One field at a time, so the error names the setting's path (the rule's own check names
    # its field in words).
    for name, value in changes.items():
        try:
            dataclasses.replace(base, **{name: value})
        except InvalidRequest as exc:
            where = f"setting {setting} {rule}.{name}"
            raise InvalidRequest(where, json_text(given[name]), exc.valid) from exc
    return dataclasses.replace(base, **changes)


def _rules_of(setting: str, given: object, known: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(given, Mapping):
        raise InvalidRequest(f"setting {setting}", json_text(given), "a JSON object of rules")
    out = dict(known)
    for rule, values in given.items():
        if rule not in known:
            raise InvalidRequest(
                f"setting {setting}", json_text(rule), f"a rule of {', '.join(sorted(known))}"
            )
        out[rule] = _settings(setting, rule, known[rule], values)
    return out


def build_rules(
    rules: Mapping[str, object] | None = None,
    tenants: Mapping[str, object] | None = None,
) -> tuple[Rule, ...]:
    """Every rule with the platform's settings (``rules``) and the tenants' own (``tenants``).

    Raises:
        InvalidRequest: an unknown rule or setting, a value of the wrong type or out of range,
            or a tenant setting for a platform-wide rule.
    """
    base = _rules_of(RULES_SETTING, rules or {}, {r: cls() for r, cls in SETTINGS.items()})
    per_tenant: dict[str, dict[str, Any]] = {r: {} for r in TENANT_RULES}
    if not isinstance(tenants or {}, Mapping):
        raise InvalidRequest(f"setting {TENANT_RULES_SETTING}", json_text(tenants), "a JSON object")
    for tenant, given in (tenants or {}).items():
        setting = f"{TENANT_RULES_SETTING} {tenant}:"
        if isinstance(given, Mapping):
            wrong = sorted(set(given) - TENANT_RULES)
            if wrong and wrong[0] in SETTINGS:
                raise InvalidRequest(
                    f"setting {setting}",
                    json_text(wrong[0]),
                    f"a rule with tenant settings ({', '.join(sorted(TENANT_RULES))}); "
                    f"{wrong[0]} is platform-wide ({RULES_SETTING})",
                )
        known = {r: base[r] for r in TENANT_RULES}
        own = _rules_of(setting, given, known)
        for rule in given if isinstance(given, Mapping) else ():
            per_tenant[rule][tenant] = own[rule]
    noisy = base["noisy_neighbour"]
    return (
        IdleRule(base["idle"], tenants=per_tenant["idle"]),
        NoisyNeighbourRule(noisy),
        SlowedByNeighbourRule(noisy),
        MemoryOverShareRule(base["memory_over_share"], tenants=per_tenant["memory_over_share"]),
        XidRule(base["xid"]),
        EccRule(base["ecc"]),
        ThrottleRule(base["throttle"]),
        QuotaPressureRule(base["quota_pressure"], tenants=per_tenant["quota_pressure"]),
        LongQueueWaitRule(base["long_queue_wait"], tenants=per_tenant["long_queue_wait"]),
        BudgetBurnRule(base["budget_burn"], tenants=per_tenant["budget_burn"]),
    )
