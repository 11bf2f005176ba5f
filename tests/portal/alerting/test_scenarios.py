"""Each rule fires at the exact expected minute, names the right workloads, and resolves.

Samples are posted through ``POST /api/v1/telemetry/samples`` once a minute (at second 30) and
the service evaluates at each minute's end over that minute, so "minute m" below is the
evaluation at T0 + m x 60 s, which reads the samples of minute m - 1.
"""

from __future__ import annotations

from decimal import Decimal

from policies.alerts import AlertState, BudgetSample
from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadRequest
from tests.portal.alerting.conftest import Scenario, gpu, t4
from tests.portal.telemetry.conftest import T0

PENDING, FIRING, RESOLVED = AlertState.PENDING, AlertState.FIRING, AlertState.RESOLVED


def test_idle_fires_after_30_minutes_below_5_percent_and_resolves_when_used(
    scenario: Scenario,
) -> None:
    p = scenario.portal
    idle = p.gpus("team-a", 1, owner="alice", name="alice/default")
    busy = p.gpus("team-b", 1, owner="bob", name="bob/default")
    (g_idle,), (g_busy,) = p.devices_of(idle), p.devices_of(busy)
    scenario.start()
    # Idle at 2 % for minutes 0-39, then 60 %; the busy one at 5 % (the threshold) and above.
    scenario.run(
        range(45),
        lambda k: [("n1", gpu(g_idle, 2.0 if k < 40 else 60.0)), ("n1", gpu(g_busy, 5.0))],
    )
    # Pending at minute 1 (first evaluation), firing once 30 min held (minute 31), resolved at
    # the first evaluation of a busy minute (minute 41).
    assert scenario.times("idle", PENDING) == [1]
    assert scenario.times("idle", FIRING) == [31]
    assert scenario.times("idle", RESOLVED) == [41]
    assert scenario.named("idle") == {(idle,)}
    assert scenario.service is not None
    (alert,) = scenario.service.store.alerts()  # one row, updated through its states
    assert (alert.alert.tenant, alert.alert.owner, alert.state) == ("team-a", "alice", RESOLVED)


def test_noisy_neighbour_names_offender_and_victim_and_spares_a_workload_at_its_share(
    scenario: Scenario,
) -> None:
    p = scenario.portal
    a = p.share("team-a", 500, owner="alice", name="alice/a")
    b = p.share("team-b", 500, owner="bob", name="bob/b")
    c = p.share("team-a", 500, owner="carol", name="carol/c")
    d = p.share("team-b", 500, owner="dave", name="dave/d")
    (g1,), (g2,) = p.devices_of(a), p.devices_of(c)
    assert p.devices_of(b) == [g1] and p.devices_of(d) == [g2] and g1 != g2
    scenario.start()

    def minute(k: int) -> list[tuple[str, dict[str, object]]]:
        crowded = 10 <= k < 20
        ua, ub = (85.0, 12.0) if crowded else (45.0, 45.0)
        uc, ud = (50.0, 12.0) if crowded else (45.0, 45.0)  # c uses exactly its share

        def proc(wid: str, util: float) -> dict[str, object]:
            return {"workload_id": wid, "sm_util_pct": util, "memory_used_mib": 4000.0}

        return [
            ("n2", t4(g1, min(100.0, ua + ub), [proc(a, ua), proc(b, ub)])),
            ("n2", t4(g2, uc + ud, [proc(c, uc), proc(d, ud)])),
        ]

    scenario.run(range(25), minute)
    # Crowded from minute 10's samples: pending at 11, firing after 5 min at 16, resolved at 21.
    assert scenario.times("noisy_neighbour", PENDING) == [11]
    assert scenario.times("noisy_neighbour", FIRING) == [16]
    assert scenario.times("noisy_neighbour", RESOLVED) == [21]
    # The offender's alert names the offender, the victim's the victim: never the other side.
    assert scenario.named("noisy_neighbour") == {(a,)}
    assert scenario.named("slowed_by_neighbour") == {(b,)}
    assert scenario.times("slowed_by_neighbour", FIRING) == [16]
    firing = [t.alert for t in scenario.log if t.alert.state is FIRING]
    assert sorted((x.key.rule, x.tenant, x.owner, x.key.scope) for x in firing) == [
        ("noisy_neighbour", "team-a", "alice", g1),
        ("slowed_by_neighbour", "team-b", "bob", g1),
    ]


def test_memory_over_share_fires_after_a_minute_and_not_at_exactly_the_share(
    scenario: Scenario,
) -> None:
    p = scenario.portal
    a = p.share("team-a", 500, owner="alice", name="alice/a")
    b = p.share("team-b", 500, owner="bob", name="bob/b")
    (g,) = p.devices_of(a)
    allowed = 15360.0 / 2  # half a T4
    scenario.start()

    def minute(k: int) -> list[tuple[str, dict[str, object]]]:
        over = 5 <= k < 10
        return [
            (
                "n2",
                t4(
                    g,
                    60.0,
                    [
                        {
                            "workload_id": a,
                            "sm_util_pct": 30.0,
                            "memory_used_mib": 9000.0 if over else 4000.0,
                        },
                        {"workload_id": b, "sm_util_pct": 30.0, "memory_used_mib": allowed},
                    ],
                    memory_used_mib=13000.0 if over else 11680.0,
                ),
            )
        ]

    scenario.run(range(12), minute)
    assert scenario.times("memory_over_share", PENDING) == [6]
    assert scenario.times("memory_over_share", FIRING) == [7]
    assert scenario.times("memory_over_share", RESOLVED) == [11]
    assert scenario.named("memory_over_share") == {(a,)}


def test_xid_fires_at_once_and_resolves_after_ten_quiet_minutes(scenario: Scenario) -> None:
    p = scenario.portal
    w = p.gpus("team-a", 1, owner="alice", name="alice/default")
    (g,) = p.devices_of(w)
    scenario.start()
    scenario.run(
        range(20), lambda k: [("n1", gpu(g, 90.0, xid_count=0 if k < 5 else 1, last_xid=79))]
    )
    assert scenario.times("xid", FIRING) == [6]
    assert scenario.times("xid", PENDING) == []
    assert scenario.times("xid", RESOLVED) == [16]
    assert scenario.named("xid") == {(w,)}


def test_thermal_throttling_fires_after_ten_minutes_and_resolves(scenario: Scenario) -> None:
    p = scenario.portal
    w = p.gpus("team-a", 1, owner="alice", name="alice/default")
    (g,) = p.devices_of(w)
    scenario.start()
    # 0x40 hardware thermal from minute 3 to 19; 0x1 (idle clocks) is never throttling.
    scenario.run(
        range(24),
        lambda k: [("n1", gpu(g, 90.0, throttle_reasons=0x41 if 3 <= k < 20 else 0x1))],
    )
    assert scenario.times("throttle", PENDING) == [4]
    assert scenario.times("throttle", FIRING) == [14]
    assert scenario.times("throttle", RESOLVED) == [21]
    assert scenario.named("throttle") == {(w,)}


def test_quota_pressure_and_a_long_queue_wait_fire_on_time_and_resolve(
    scenario: Scenario,
) -> None:
    p = scenario.portal
    p.alloc.set_quota("team-a", "H100-80GB", guaranteed=1, limit=1)
    first = p.gpus("team-a", 1, owner="alice", name="alice/one")
    req = DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({"H100-80GB"}))
    p.clock.advance(seconds=60)  # queued at T0 + 60 s, on team-a's limit
    waiting = p.alloc.request(WorkloadRequest("team-a", "alice", "alice/two", req)).id
    assert p.alloc.status(waiting).reason == "quota"
    scenario.start()
    scenario.run(range(34), lambda k: [])
    p.alloc.release(first)  # the waiting one starts: still 1 of 1 used
    assert p.alloc.status(waiting).state == "running"
    scenario.run(range(34, 35), lambda k: [])
    p.alloc.release(waiting)
    scenario.run(range(35, 37), lambda k: [])
    # team-a at 1 of 1 from the first evaluation: firing 15 min later (minute 16), resolved at
    # the first evaluation after both are released (minute 36).
    assert scenario.times("quota_pressure", PENDING) == [1]
    assert scenario.times("quota_pressure", FIRING) == [16]
    assert scenario.times("quota_pressure", RESOLVED) == [36]
    # Queued at minute 1: firing at 30 min waited (minute 31), resolved once it runs (35).
    assert scenario.times("long_queue_wait", FIRING) == [31]
    assert scenario.times("long_queue_wait", RESOLVED) == [35]
    assert scenario.named("long_queue_wait") == {(waiting,)}


def test_budget_burn_fires_an_hour_after_the_projection_first_exceeds_the_budget(
    scenario: Scenario,
) -> None:
    period = (int(T0), int(T0) + 30 * 86_400)

    def budgets(now: float) -> list[BudgetSample]:
        # 1 unit per hour: projected 720 over the 30-day period, against a budget of 500.
        spent = Decimal(int(now - T0)) / 3600
        return [BudgetSample("team-a", now, spent, Decimal(500), *period)]

    scenario.start(budgets=budgets)
    scenario.run(range(125), lambda k: [])
    # Judged once an hour of the period passed (minute 60); held an hour: firing at 120.
    assert scenario.times("budget_burn", PENDING) == [60]
    assert scenario.times("budget_burn", FIRING) == [120]
