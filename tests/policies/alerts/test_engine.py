"""The state machine: bad input, deduplication, and properties over random condition traces."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.alerts import (
    AlertState,
    Condition,
    DeviceSample,
    Engine,
    EngineState,
    IdleRule,
    RuleContext,
    RuleResult,
    Snapshot,
    TenantUsageSample,
)
from policies.errors import InvalidRequest

from .scenario import minute, whole


@dataclass(frozen=True, slots=True)
class FlagRule:
    """Holds for each tenant sampled with ``used > 0``; reports it twice to exercise dedup."""

    for_s: float
    name: str = "flag"

    def evaluate(self, ctx: RuleContext) -> RuleResult:
        out = []
        for t in ctx.snapshot.tenants:
            if t.used > 0:
                for w in (f"{t.tenant}-1", f"{t.tenant}-2"):
                    out.append(Condition("scope", t.tenant, t.tenant, None, (w,), "flag"))
        return RuleResult(tuple(out))


def flag(now: float, on: bool, tenant: str = "t") -> Snapshot:
    return Snapshot(tenants=(TenantUsageSample(tenant, "T4/share", now, float(on), 1.0),))


def test_duplicate_conditions_make_one_alert_naming_every_workload() -> None:
    engine = Engine((FlagRule(0.0),))
    state, transitions = engine.step(EngineState(), flag(minute(0), True), minute(0))
    assert len(transitions) == 1
    (alert,) = state.alerts.values()
    assert alert.workloads == ("t-1", "t-2")
    assert alert.state is AlertState.FIRING
    assert alert.tenant == "t"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"utilization_pct": math.nan}, "utilization"),
        ({"utilization_pct": -1.0}, "utilization"),
        ({"utilization_pct": 100.5}, "utilization"),
        ({"memory_used_mib": math.inf}, "memory used"),
        ({"xid_count": -1}, "XID count"),
        ({"at": math.nan}, "sample time"),
    ],
)
def test_malformed_samples_are_rejected(kwargs: dict[str, float], field: str) -> None:
    args: dict[str, object] = {"device": "g0", "at": minute(0), "utilization_pct": 1.0, **kwargs}
    with pytest.raises(InvalidRequest, match=f"invalid {field}"):
        DeviceSample(**args)  # type: ignore[arg-type]


def test_bad_now_is_rejected_and_changes_nothing() -> None:
    engine = Engine((IdleRule(),))
    state, _ = engine.step(EngineState(), Snapshot(), minute(5))
    with pytest.raises(InvalidRequest, match="previous step"):
        engine.step(state, Snapshot(), minute(4))
    with pytest.raises(InvalidRequest, match="finite epoch seconds"):
        engine.step(state, Snapshot(), math.nan)
    assert state.now == minute(5)


def test_out_of_order_duplicate_future_and_unknown_samples_are_skipped() -> None:
    engine = Engine((IdleRule(),), devices=frozenset({"g0"}))
    idle = DeviceSample("g0", minute(0), 1.0, allocation=whole("w1"))
    state, transitions = engine.step(EngineState(), Snapshot(devices=(idle,)), minute(0))
    assert [t.alert.state for t in transitions] == [AlertState.PENDING]
    busy_dup = DeviceSample("g0", minute(0), 90.0, allocation=whole("w1"))
    older = DeviceSample("g0", minute(-1), 90.0, allocation=whole("w1"))
    future = DeviceSample("g0", minute(9), 90.0, allocation=whole("w1"))
    unknown = DeviceSample("g9", minute(1), 1.0, allocation=whole("w9"))
    now_ok = DeviceSample("g0", minute(1), 1.0, allocation=whole("w1"))
    twice = DeviceSample("g0", minute(1), 90.0, allocation=whole("w1"))
    state2, transitions = engine.step(
        state,
        Snapshot(devices=(busy_dup, older, future, unknown, now_ok, twice)),
        minute(1),
    )
    assert transitions == ()
    assert [s.sample for s in state2.skipped] == [busy_dup, older, future, unknown, twice]
    assert state2.last["g0"] == now_ok
    assert "g9" not in state2.last
    assert [a.active_since for a in state2.alerts.values()] == [minute(0)]


def test_rule_names_must_be_unique() -> None:
    with pytest.raises(InvalidRequest, match="unique rule names"):
        Engine((IdleRule(), IdleRule()))


@given(
    for_s=st.sampled_from([0.0, 60.0, 300.0, 1800.0]),
    trace=st.lists(st.tuples(st.integers(min_value=0, max_value=600), st.booleans()), max_size=60),
)
def test_state_machine_properties(for_s: float, trace: list[tuple[int, bool]]) -> None:
    """Never firing before ``for`` held continuously; every alert resolves once it stops."""
    engine = Engine((FlagRule(for_s),))
    state = EngineState()
    now = minute(0)
    held_since: float | None = None
    for gap, on in trace:
        now += gap
        state, transitions = engine.step(state, flag(now, on), now)
        held_since = (held_since if held_since is not None else now) if on else None
        alerts = list(state.alerts.values())
        if not on:
            assert alerts == []
            assert all(
                t.alert.state in (AlertState.RESOLVED, AlertState.INACTIVE) for t in transitions
            )
            continue
        (alert,) = alerts
        assert held_since is not None
        assert alert.active_since == held_since
        if alert.state is AlertState.FIRING:
            assert alert.fired_at is not None
            assert alert.fired_at - alert.active_since >= for_s
        else:
            assert now - held_since < for_s
    # Whatever is pending or firing resolves (or is dropped) at the next step without it.
    now += 60
    state, transitions = engine.step(state, flag(now, False), now)
    assert state.alerts == {}
    assert all(t.alert.state in (AlertState.RESOLVED, AlertState.INACTIVE) for t in transitions)
