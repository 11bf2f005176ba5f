"""The alert state machine: pending -> firing -> resolved, as Prometheus does it.

Each evaluation time the caller hands ``Engine.step`` the previous state, everything sampled at
that time and ``now``; it returns the new state and the transitions. The same code runs live
and in replay: nothing here reads the clock or keeps hidden state.

States of one alert, identified by ``AlertKey(rule, scope, subject)`` (deduplication: a rule
reporting the same key twice in one step makes one alert, naming the union of workloads):

- the condition first holds -> **pending** (``active_since = now``); with ``for_s == 0`` it goes
  straight to **firing**;
- still holding at a step with ``now - active_since >= for_s`` -> **firing** (``fired_at``);
- a pending alert whose condition stops -> dropped (transition to **inactive**): a flap resets
  the ``for`` clock;
- a firing alert whose condition stops -> **resolved** (``resolved_at = now``) and dropped from
  the state; if it holds again later a new pending alert starts.

A condition "stops" when the rule does not report it at a step, including when its subject was
not sampled: callers pass the whole current picture at each step.

Bad input: malformed values are rejected when samples are built (``InvalidRequest``). ``now``
must be finite and not earlier than the previous step's (``InvalidRequest``, state unchanged).
Device samples that are later than ``now``, for a device outside ``Engine.devices`` (when
given), repeated for one device in one step, or not later than the device's last accepted
sample (duplicate or out-of-order timestamps) are skipped: they change no state and are listed
in ``EngineState.skipped`` with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum, auto
from types import MappingProxyType
from typing import Protocol

from policies.alerts.samples import DeviceSample, Snapshot
from policies.errors import InvalidRequest


class AlertState(StrEnum):
    PENDING = auto()
    FIRING = auto()
    RESOLVED = auto()
    INACTIVE = auto()  # a pending alert whose condition stopped before ``for`` elapsed


@dataclass(frozen=True, slots=True, order=True)
class AlertKey:
    """Stable identity of an alert: the rule, where (``scope``) and about what (``subject``)."""

    rule: str
    scope: str
    subject: str


@dataclass(frozen=True, slots=True)
class Condition:
    """What a rule reports while its condition holds for one subject.

    ``tenant`` and ``owner`` scope the alert (who may see it, who is warned); ``workloads``
    names the workload(s) concerned, the offender first where there is one. ``for_s``, when
    given, replaces the rule's ``for`` for this condition (a tenant's own setting).
    """

    scope: str
    subject: str
    tenant: str | None
    owner: str | None
    workloads: tuple[str, ...]
    summary: str
    value: float = 0.0
    for_s: float | None = None


@dataclass(frozen=True, slots=True)
class Alert:
    key: AlertKey
    state: AlertState
    tenant: str | None
    owner: str | None
    workloads: tuple[str, ...]
    summary: str
    value: float
    active_since: float
    fired_at: float | None = None
    resolved_at: float | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """An alert moved from ``previous`` (``None``: new) to ``alert.state`` at ``at``."""

    previous: AlertState | None
    alert: Alert
    at: float


@dataclass(frozen=True, slots=True)
class RuleContext:
    """What a rule sees: this step's accepted samples, each device's previous accepted sample,
    and the rule's own memory from the last step (``None`` at first)."""

    now: float
    snapshot: Snapshot
    previous: Mapping[str, DeviceSample]
    memory: object


@dataclass(frozen=True, slots=True)
class RuleResult:
    conditions: tuple[Condition, ...]
    memory: object = None


class Rule(Protocol):
    """One alert rule. ``evaluate`` must be pure: same context, same result."""

    @property
    def name(self) -> str: ...

    @property
    def for_s(self) -> float: ...

    def evaluate(self, ctx: RuleContext) -> RuleResult: ...


@dataclass(frozen=True, slots=True)
class Skipped:
    sample: DeviceSample
    reason: str


@dataclass(frozen=True, slots=True)
class EngineState:
    """Alerts that are pending or firing, each device's last accepted sample, rule memory."""

    alerts: Mapping[AlertKey, Alert] = field(default_factory=dict)
    last: Mapping[str, DeviceSample] = field(default_factory=dict)
    memory: Mapping[str, object] = field(default_factory=dict)
    now: float | None = None
    skipped: tuple[Skipped, ...] = ()

    def firing(self) -> list[Alert]:
        return sorted(
            (a for a in self.alerts.values() if a.state is AlertState.FIRING), key=lambda a: a.key
        )


def _annotate(alert: Alert, cond: Condition) -> Alert:
    return replace(
        alert,
        tenant=cond.tenant,
        owner=cond.owner,
        workloads=cond.workloads,
        summary=cond.summary,
        value=cond.value,
    )


@dataclass(frozen=True, slots=True)
class Engine:
    """Rules (unique names) and, optionally, the devices samples may name."""

    rules: tuple[Rule, ...]
    devices: frozenset[str] | None = None

    def __post_init__(self) -> None:
        names = [r.name for r in self.rules]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InvalidRequest("rule names", dupes, "unique rule names")
        for rule in self.rules:
            if math.isnan(rule.for_s) or rule.for_s < 0:
                raise InvalidRequest(f"for of rule {rule.name}", rule.for_s, "seconds >= 0")

    def _accept(
        self, state: EngineState, devices: Sequence[DeviceSample], now: float
    ) -> tuple[list[DeviceSample], list[Skipped]]:
        accepted: list[DeviceSample] = []
        skipped: list[Skipped] = []
        seen: set[str] = set()
        for s in devices:
            last = state.last.get(s.device)
            if self.devices is not None and s.device not in self.devices:
                skipped.append(Skipped(s, "unknown device"))
            elif s.at > now:
                skipped.append(Skipped(s, f"sample time {s.at} is after now {now}"))
            elif s.device in seen:
                skipped.append(Skipped(s, "second sample for the device in one step"))
            elif last is not None and s.at <= last.at:
                skipped.append(
                    Skipped(s, f"sample time {s.at} is not after the last one {last.at}")
                )
            else:
                seen.add(s.device)
                accepted.append(s)
        return accepted, skipped

    def step(
        self, state: EngineState, samples: Snapshot, now: float
    ) -> tuple[EngineState, tuple[Transition, ...]]:
        """Evaluate every rule at ``now``; return the new state and what changed, by key."""
        if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
            raise InvalidRequest("now", now, "finite epoch seconds")
        if state.now is not None and now < state.now:
            raise InvalidRequest("now", now, f">= the previous step's {state.now}")
        accepted, skipped = self._accept(state, samples.devices, now)
        snapshot = replace(samples, devices=tuple(accepted))
        memory: dict[str, object] = {}
        holding: dict[AlertKey, tuple[Rule, Condition]] = {}
        for rule in self.rules:
            result = rule.evaluate(
                RuleContext(now, snapshot, state.last, state.memory.get(rule.name))
            )
            memory[rule.name] = result.memory
            for cond in result.conditions:
                key = AlertKey(rule.name, cond.scope, cond.subject)
                if key in holding:
                    first = holding[key][1]
                    merged = first.workloads + tuple(
                        w for w in cond.workloads if w not in first.workloads
                    )
                    cond = replace(first, workloads=merged)
                holding[key] = (rule, cond)

        alerts: dict[AlertKey, Alert] = {}
        transitions: list[Transition] = []
        for key in sorted(holding):
            rule, cond = holding[key]
            for_s = rule.for_s if cond.for_s is None else cond.for_s
            old = state.alerts.get(key)
            if old is None:
                fire = for_s == 0
                alert = _annotate(
                    Alert(
                        key,
                        AlertState.FIRING if fire else AlertState.PENDING,
                        None,
                        None,
                        (),
                        "",
                        0.0,
                        active_since=now,
                        fired_at=now if fire else None,
                    ),
                    cond,
                )
                transitions.append(Transition(None, alert, now))
            elif old.state is AlertState.PENDING and now - old.active_since >= for_s:
                alert = _annotate(replace(old, state=AlertState.FIRING, fired_at=now), cond)
                transitions.append(Transition(AlertState.PENDING, alert, now))
            else:
                alert = _annotate(old, cond)
            alerts[key] = alert
        for key in sorted(set(state.alerts) - set(holding)):
            old = state.alerts[key]
            if old.state is AlertState.FIRING:
                gone = replace(old, state=AlertState.RESOLVED, resolved_at=now)
            else:
                gone = replace(old, state=AlertState.INACTIVE)
            transitions.append(Transition(old.state, gone, now))

        last = dict(state.last)
        last.update((s.device, s) for s in accepted)
        new = EngineState(
            alerts=MappingProxyType(alerts),
            last=MappingProxyType(last),
            memory=MappingProxyType(memory),
            now=now,
            skipped=tuple(skipped),
        )
        return new, tuple(transitions)
