"""Scripted alert scenarios: synthetic samples posted through the real ingest route, the real
alert service over the real allocator and store, evaluated once a minute."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from policies.alerts import AlertState, Transition
from portal.alerting.service import Action, AlertService
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.api.telemetry import use_telemetry
from portal.telemetry.service import Telemetry
from tests.portal.telemetry.conftest import T0, Portal, make_portal

AGENT = Caller("node-agent", CallerKind.SERVICE, frozenset({Scope.TELEMETRY_WRITE}))
STEP_S = 60.0

Samples = Callable[[int], Sequence[tuple[str, dict[str, object]]]]
"""Minute k -> (node, sample without its time) pairs; the sample is taken at T0 + 60 k + 30."""


@dataclass
class Clock:
    now: float = T0

    def __call__(self) -> float:
        return self.now


@dataclass
class Scenario:
    portal: Portal
    client: TestClient
    clock: Clock
    service: AlertService | None = None
    log: list[Transition] = field(default_factory=list)

    def start(self, actions: Sequence[Action] = (), **kw: object) -> AlertService:
        self.service = AlertService(
            self.portal.alloc,
            interval_s=STEP_S,
            actions=actions,
            clock=self.clock,
            **kw,  # type: ignore[arg-type]
        )
        return self.service

    def set_time(self, t: float) -> None:
        self.clock.now = t
        self.portal.clock.now = datetime.fromtimestamp(t, UTC)

    def run(self, minutes: range, samples: Samples) -> None:
        """For each minute k: post its samples at T0 + 60 k + 30, evaluate at T0 + 60 (k + 1)."""
        assert self.service is not None, "call start() first"
        for k in minutes:
            at = T0 + STEP_S * k + 30
            self.set_time(at + 1)
            by_node: dict[str, list[dict[str, object]]] = {}
            for node, s in samples(k):
                by_node.setdefault(node, []).append({**s, "at": at})
            for node, batch in by_node.items():
                r = self.client.post(
                    "/api/v1/telemetry/samples",
                    json={"node": node, "source": "nvml", "samples": batch},
                    headers={"Authorization": "token agent"},
                )
                assert r.status_code == 200 and r.json()["accepted"] == len(batch), r.text
            self.set_time(T0 + STEP_S * (k + 1))
            self.log.extend(self.service.evaluate())

    def times(self, rule: str, state: AlertState) -> list[float]:
        """Minutes after T0 at which alerts of ``rule`` entered ``state``."""
        return [
            (t.at - T0) / 60
            for t in self.log
            if t.alert.key.rule == rule and t.alert.state is state
        ]

    def named(self, rule: str) -> set[tuple[str, ...]]:
        return {t.alert.workloads for t in self.log if t.alert.key.rule == rule}


@pytest.fixture
def scenario(db_url: str) -> Iterator[Scenario]:
    """A scenario on SQLite, then on PostgreSQL."""
    yield from _scenario(db_url)


@pytest.fixture
def sqlite_scenario(tmp_path: Path) -> Iterator[Scenario]:
    yield from _scenario(f"sqlite:///{tmp_path / 'portal.db'}")


def _scenario(url: str) -> Iterator[Scenario]:
    p = make_portal(url)
    clock = Clock()
    app = create_app(p.alloc, StaticAuthenticator({"agent": AGENT}))
    use_telemetry(app, Telemetry(p.alloc, clock=clock, attribution_ttl_s=0))
    with TestClient(app) as client:
        yield Scenario(p, client, clock)
    p.store.close()


def gpu(uuid: str, util: float, **kw: object) -> dict[str, object]:
    return {
        "gpu_uuid": uuid,
        "utilization_pct": util,
        "memory_used_mib": 1000.0,
        "memory_total_mib": 81920.0,
        **kw,
    }


def t4(
    uuid: str, util: float, procs: Sequence[dict[str, object]], **kw: object
) -> dict[str, object]:
    return gpu(uuid, util, memory_total_mib=15360.0, processes=list(procs), **kw)
