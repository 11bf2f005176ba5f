"""The alert service across a restart, and its wiring into the service's loops."""

from __future__ import annotations

import pytest

from policies.alerts import AlertState
from policies.errors import InvalidRequest
from portal.alerting.service import AlertService
from portal.alerting.webhook import WebhookAction
from portal.alerting.wiring import AlertingSettings, register_for_service
from portal.service.loops import Loops
from tests.portal.alerting.conftest import STEP_S, Scenario, gpu

PENDING, FIRING, RESOLVED = AlertState.PENDING, AlertState.FIRING, AlertState.RESOLVED


def test_a_restarted_service_continues_its_alerts_without_duplicates(scenario: Scenario) -> None:
    p = scenario.portal
    w = p.gpus("team-a", 1, owner="alice", name="alice/default")
    (g,) = p.devices_of(w)
    scenario.start()

    def minute(k: int) -> list[tuple[str, dict[str, object]]]:
        return [("n1", gpu(g, 1.0 if k < 40 else 50.0))]

    scenario.run(range(20), minute)  # pending since minute 1
    # A new process: the pending alert comes back from the database with its start time.
    scenario.service = AlertService(p.alloc, interval_s=STEP_S, clock=scenario.clock)
    scenario.run(range(20, 45), minute)
    assert scenario.times("idle", PENDING) == [1]
    assert scenario.times("idle", FIRING) == [31]
    assert scenario.times("idle", RESOLVED) == [41]
    (stored,) = scenario.service.store.alerts()
    assert stored.state is RESOLVED and stored.alert.active_since == scenario.log[0].at


def test_evaluating_twice_at_one_time_changes_nothing(scenario: Scenario) -> None:
    p = scenario.portal
    w = p.gpus("team-a", 1, owner="alice", name="alice/default")
    (g,) = p.devices_of(w)
    service = scenario.start()
    scenario.run(range(3), lambda k: [("n1", gpu(g, 1.0))])
    assert service.evaluate(scenario.clock.now) == ()  # e.g. a retried round
    (alert,) = service.store.alerts()
    assert alert.state is PENDING and alert.alert.active_since == scenario.log[0].at


def test_the_service_registers_its_loops_and_actions(scenario: Scenario) -> None:
    loops = Loops()
    service = register_for_service(
        loops,
        scenario.portal.alloc,
        AlertingSettings(alerts_interval_s=30, alerts_webhook_url="http://127.0.0.1:9/hook"),
        environ={},
    )
    assert {loop.name: loop.interval_s for loop in loops} == {"telemetry": 30.0, "alerts": 30.0}
    assert [type(a) for a in service.actions] == [WebhookAction]
    loops["alerts"].work()  # one real round over the empty database
    loops["telemetry"].work()


def test_culling_without_the_hub_is_refused_with_a_reason(scenario: Scenario) -> None:
    with pytest.raises(InvalidRequest, match="JUPYTERHUB_API_URL and JUPYTERHUB_API_TOKEN"):
        register_for_service(
            Loops(), scenario.portal.alloc, AlertingSettings(cull_idle_gpu_servers=True), {}
        )
