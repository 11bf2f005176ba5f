"""Helpers to script alert scenarios: one snapshot per minute, transitions collected."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from policies.alerts import AllocationContext, Engine, EngineState, Rule, ShareKind, Snapshot
from policies.alerts.engine import AlertState

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
MIN = 60.0

Seen = tuple[float, AlertState | None, AlertState, str, str, tuple[str, ...]]


def minute(m: float) -> float:
    return T0 + m * MIN


def run(
    rules: Iterable[Rule], minutes: Iterable[int], snapshot: Callable[[int], Snapshot]
) -> tuple[list[Seen], EngineState]:
    """Step at each minute; return (minute, previous, state, scope, subject, workloads) seen."""
    engine = Engine(tuple(rules))
    state = EngineState()
    seen: list[Seen] = []
    for m in minutes:
        state, transitions = engine.step(state, snapshot(m), minute(m))
        seen.extend(
            (
                m,
                t.previous,
                t.alert.state,
                t.alert.key.scope,
                t.alert.key.subject,
                t.alert.workloads,
            )
            for t in transitions
        )
    return seen, state


def share(workload: str, milli: int, tenant: str = "ml", memory_mib: int = 0) -> AllocationContext:
    return AllocationContext(
        workload, tenant, f"{workload}-owner", ShareKind.MILLI, milli=milli, memory_mib=memory_mib
    )


def whole(workload: str, tenant: str = "ml") -> AllocationContext:
    return AllocationContext(workload, tenant, f"{workload}-owner")
