"""Alerts in a running ``gpuportal serve``: ``budget_burn`` fires for a tenant burning its
monthly money budget too fast (the service wires cost accounting's budgets into the rules),
with the rules' settings from the environment."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.portal.service.conftest import ALICE, ServiceFactory, gpu

pytestmark = pytest.mark.slow


def test_budget_burn_fires_in_the_running_service_for_a_tenant_spending_too_fast(
    service_factory: ServiceFactory,
) -> None:
    svc = service_factory()
    pricing = svc.workdir / "pricing.yaml"
    # 1,000 USD per GPU-hour against 10 USD for the month: a few seconds of one GPU project
    # far past the budget (spent / elapsed x the month's length). team-b has no budget.
    pricing.write_text(
        yaml.safe_dump(
            {"currency": "USD", "prices": {"H100-80GB": "1000.00"}, "budgets": {"team-a": "10"}}
        )
    )
    svc.extra_env = {
        "GPUPORTAL_PRICING_FILE": str(pricing),
        "GPUPORTAL_ALERTS_INTERVAL_S": "1",
        # Judged from the first second of the month and fired at once, not after an hour.
        "GPUPORTAL_ALERT_RULES": json.dumps({"budget_burn": {"for_s": 0, "min_elapsed_s": 1}}),
    }
    svc.start()
    with svc.client(ALICE) as c:
        r = c.post("/api/v1/workloads", json=gpu("team-a", 1, "nb"))
        assert r.status_code == 201, r.text
    with svc.client() as c:
        r = c.post("/api/v1/workloads", json=gpu("team-b", 1, "nb"))
        assert r.status_code in (201, 202), r.text
        deadline = time.monotonic() + 60
        alerts: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            alerts = c.get("/api/v1/alerts", params={"rule": "budget_burn"}).json()["items"]
            if any(a["state"] == "firing" for a in alerts):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"budget_burn did not fire: {alerts}\n{svc.tail()}")
    (burn,) = alerts
    assert (burn["tenant"], burn["state"], burn["owner"]) == ("team-a", "firing", None)
    assert "team-a is projected to spend" in str(burn["summary"])
    assert float(burn["value"]) > 10  # type: ignore[arg-type]
    assert svc.terminate() == 0
