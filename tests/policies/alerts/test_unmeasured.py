"""Samples without a utilization figure (MIG instances of an A100 or A30, no GPU Performance
Monitoring): use rules leave them out, health and memory rules judge them as any other."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest

from policies.alerts import (
    AllocationContext,
    DeviceSample,
    EccRule,
    IdleRule,
    MemoryOverShareRule,
    NoisyNeighbourRule,
    Rule,
    ShareKind,
    Snapshot,
    ThrottleRule,
    XidRule,
)
from policies.alerts.engine import AlertState
from policies.alerts.throttle import HW_THERMAL
from policies.errors import InvalidRequest

from .scenario import minute, run, share

P, F, R, GONE = AlertState.PENDING, AlertState.FIRING, AlertState.RESOLVED, AlertState.INACTIVE


def mig(workload: str, slices: int = 3) -> AllocationContext:
    return AllocationContext(
        workload, "ml", f"{workload}-owner", ShareKind.MIG, mig_slices=slices, mig_total_slices=7
    )


def unmeasured(device: str, m: int, **kw: Any) -> DeviceSample:
    return DeviceSample(device, minute(m), None, activity_pct=None, **kw)


def test_an_unmeasured_instance_is_never_idle_and_a_pending_idle_alert_stops() -> None:
    # Measured at 1 % for minutes 0-9 (pending at 0), unmeasured from 10: the condition stops
    # at 10 and nothing fires in the hour, where 0 % would have fired at 30 and culled it.
    def snap(m: int) -> Snapshot:
        if m < 10:
            sample = DeviceSample("g0/gi1", minute(m), 1.0, allocation=mig("w1"), parent="g0")
        else:
            sample = unmeasured("g0/gi1", m, allocation=mig("w1"), parent="g0")
        return Snapshot(devices=(sample,))

    seen, _ = run([IdleRule()], range(60), snap)
    assert [(m, prev, cur) for m, prev, cur, *_ in seen] == [(0, None, P), (10, P, GONE)]


def _shared(m: int, a: float, b: float | None) -> Snapshot:
    return Snapshot(
        devices=(
            DeviceSample(
                "p0/a", minute(m), a, activity_pct=a, allocation=share("w-a", 500), parent="p0"
            ),
            DeviceSample(
                "p0/b", minute(m), b, activity_pct=b, allocation=share("w-b", 500), parent="p0"
            ),
        )
    )


def test_an_unmeasured_neighbour_is_no_victim_and_keeps_its_baseline() -> None:
    # B at 45 % for minutes 0-9 (baseline 45), unmeasured 10-19 while A takes 85 %: B is no
    # victim (nothing says it slowed). From 20 B is measured at 12 % < 0.7 x 45 = 31.5: a
    # victim at once, pending at 20, firing at 25. Had the gap counted as 0 %, B's baseline
    # would have decayed to 45 x 0.9^10 = 15.7 and 12 % would not be a drop (>= 11.0).
    def snap(m: int) -> Snapshot:
        if m < 10:
            return _shared(m, 45.0, 45.0)
        return _shared(m, 85.0, None if m < 20 else 12.0)

    seen, state = run([NoisyNeighbourRule()], range(30), snap)
    assert seen == [
        (20, None, P, "p0", "w-a", ("w-a",)),
        (25, P, F, "p0", "w-a", ("w-a",)),
    ]
    baselines = state.memory["noisy_neighbour"]
    assert isinstance(baselines, Mapping)
    assert baselines["p0/b"] == pytest.approx(45.0)  # frozen while a victim, kept in the gap


def test_errors_throttling_and_memory_of_unmeasured_devices_still_alert() -> None:
    # The A100's own sample and its instances carry no utilization; XID at 2, ECC at 3,
    # thermal throttling from 1, a share over its memory from 0.
    def snap(m: int) -> Snapshot:
        return Snapshot(
            devices=(
                unmeasured(
                    "g0",
                    m,
                    xid_count=int(m >= 2),
                    ecc_uncorrectable=int(m >= 3),
                    throttle_reasons=HW_THERMAL if m >= 1 else 0,
                ),
                unmeasured(
                    "g1/w9",
                    m,
                    memory_used_mib=9000.0,
                    memory_total_mib=16000.0,
                    allocation=share("w9", 500),
                    parent="g1",
                ),
            )
        )

    rules: list[Rule] = [XidRule(), EccRule(), ThrottleRule(), MemoryOverShareRule()]
    seen, _ = run(rules, range(15), snap)
    fired = {(m, scope, subject) for m, _, cur, scope, subject, _ in seen if cur is F}
    assert fired == {(2, "g0", "g0"), (3, "g0", "g0"), (11, "g0", "g0"), (1, "g1", "w9")}


def test_a_measured_value_is_still_checked() -> None:
    assert unmeasured("g0", 0).utilization_pct is None
    with pytest.raises(InvalidRequest, match="utilization"):
        DeviceSample("g0", minute(0), math.nan)
    with pytest.raises(InvalidRequest, match="activity"):
        DeviceSample("g0", minute(0), None, activity_pct=101.0)
