"""The rules' thresholds and durations as settings, platform-wide and per tenant: a tenant of
expensive GPUs calls 15 minutes idle while the others keep 30; bad values are refused with the
setting, the path in it and the value named."""

from __future__ import annotations

import pytest

from policies.alerts import AlertState
from policies.errors import InvalidRequest
from portal.alerting.rules import build_rules
from portal.alerting.wiring import load_alerting_settings
from tests.portal.alerting.conftest import Scenario, gpu

PENDING, FIRING = AlertState.PENDING, AlertState.FIRING


def test_a_tenant_with_its_own_idle_window_is_told_after_15_minutes_the_others_after_30(
    scenario: Scenario,
) -> None:
    p = scenario.portal
    fast = p.gpus("team-a", 1, owner="alice", name="alice/default")
    slow = p.gpus("team-b", 1, owner="bob", name="bob/default")
    (ga,), (gb,) = p.devices_of(fast), p.devices_of(slow)
    cfg = load_alerting_settings(
        alert_rules={"idle": {"threshold_pct": 10}},
        alert_tenant_rules={"team-a": {"idle": {"for_s": 900}}},
    )
    scenario.start(rules=cfg.rules())
    # Both at 8 %: idle under the platform's 10 % threshold (the default 5 % would not be).
    scenario.run(range(32), lambda k: [("n1", gpu(ga, 8.0)), ("n1", gpu(gb, 8.0))])
    fired = {t.alert.workloads: (t.at - scenario.log[0].at) / 60 for t in scenario.log
             if t.alert.key.rule == "idle" and t.alert.state is FIRING}  # fmt: skip
    assert fired == {(fast,): 15, (slow,): 30}


@pytest.mark.parametrize(
    ("rules", "tenants", "message"),
    [
        ({"idle": {"for_s": -1}}, {}, "GPUPORTAL_ALERT_RULES idle.for_s -1: expected a number in"),
        ({"idle": {"for": 60}}, {}, "idle.for 60: expected one of for_s, threshold_pct"),
        ({"idel": {}}, {}, 'GPUPORTAL_ALERT_RULES "idel": expected a rule of budget_burn'),
        ({"throttle": {"mask": 4.5}}, {}, "throttle.mask 4.5: expected a whole number"),
        ({"idle": {"for_s": True}}, {}, "idle.for_s True: expected a number"),
        ({"idle": {"for_s": "15m"}}, {}, 'idle.for_s "15m": expected a number'),
        ({"noisy_neighbour": {"scopes": ["rack"]}}, {}, "expected some of domain, gpu, node"),
        ({"idle": 900}, {}, "GPUPORTAL_ALERT_RULES idle 900: expected a JSON object"),
        (
            {},
            {"team-a": {"idle": {"threshold_pct": 101}}},
            "GPUPORTAL_ALERT_TENANT_RULES team-a: idle.threshold_pct 101: expected a number in",
        ),
        ({}, {"team-a": {"xid": {"hold_s": 5}}}, "xid is platform-wide (GPUPORTAL_ALERT_RULES)"),
    ],
)
def test_a_bad_rule_setting_is_refused_naming_it(
    rules: dict[str, object], tenants: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        build_rules(rules, tenants)
    assert message in err.value.message
    with pytest.raises(InvalidRequest):
        load_alerting_settings(alert_rules=rules, alert_tenant_rules=tenants)


def test_no_settings_are_the_defaults() -> None:
    names = [r.name for r in build_rules()]
    assert names[:3] == ["idle", "noisy_neighbour", "slowed_by_neighbour"]
    idle = build_rules()[0]
    assert idle.for_s == 1800.0
