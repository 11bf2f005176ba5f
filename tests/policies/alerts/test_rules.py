"""Each rule in a scripted scenario: fires, names the workloads and resolves at exact minutes."""

from __future__ import annotations

from decimal import Decimal

from policies.alerts import (
    AllocationContext,
    BudgetBurnRule,
    BudgetSample,
    DeviceSample,
    EccRule,
    Engine,
    EngineState,
    IdleRule,
    LongQueueWaitRule,
    MemoryOverShareRule,
    NoisyNeighbourRule,
    NoisyNeighbourSettings,
    NoisyScope,
    QueueSample,
    QuotaPressureRule,
    ShareKind,
    SlowedByNeighbourRule,
    Snapshot,
    TenantUsageSample,
    ThrottleRule,
    Transition,
    XidRule,
    default_rules,
)
from policies.alerts.engine import AlertState, Rule
from policies.alerts.throttle import HW_THERMAL

from .scenario import T0, minute, run, share, whole

P, F, R, GONE = AlertState.PENDING, AlertState.FIRING, AlertState.RESOLVED, AlertState.INACTIVE


def test_idle_fires_after_30_minutes_below_5_percent_and_resolves_when_used() -> None:
    # Busy until minute 10, 2 % from 10 to 49, busy again at 50: pending 10, firing 10 + 30.
    def snap(m: int) -> Snapshot:
        util = 2.0 if 10 <= m < 50 else 60.0
        return Snapshot(devices=(DeviceSample("g0", minute(m), util, allocation=whole("w1")),))

    seen, _ = run([IdleRule()], range(60), snap)
    assert seen == [
        (10, None, P, "g0", "w1", ("w1",)),
        (40, P, F, "g0", "w1", ("w1",)),
        (50, F, R, "g0", "w1", ("w1",)),
    ]


def test_idle_judges_a_share_by_its_own_share_and_ignores_unallocated_gpus() -> None:
    # 4 % of the GPU is 16 % of a 250-milli share: not idle. An unallocated GPU is never idle.
    def snap(m: int) -> Snapshot:
        return Snapshot(
            devices=(
                DeviceSample("g0/w1", minute(m), 4.0, allocation=share("w1", 250), parent="g0"),
                DeviceSample("g1", minute(m), 0.0),
            )
        )

    assert run([IdleRule()], range(40), snap)[0] == []


def test_idle_flap_resets_pending() -> None:
    # Idle 0-19, busy at 20 (pending dropped), idle again from 21: firing only at 21 + 30.
    def snap(m: int) -> Snapshot:
        util = 60.0 if m == 20 else 1.0
        return Snapshot(devices=(DeviceSample("g0", minute(m), util, allocation=whole("w1")),))

    seen, _ = run([IdleRule()], range(55), snap)
    assert [(m, prev, cur) for m, prev, cur, *_ in seen] == [
        (0, None, P),
        (20, P, GONE),
        (21, None, P),
        (51, P, F),
    ]


def _shared_gpu(m: int, a_activity: float, b_activity: float) -> Snapshot:
    return Snapshot(
        devices=(
            DeviceSample(
                "p0/a", minute(m), a_activity, activity_pct=a_activity,
                allocation=share("w-a", 500), parent="p0",
            ),
            DeviceSample(
                "p0/b", minute(m), b_activity, activity_pct=b_activity,
                allocation=share("w-b", 500, tenant="vision"), parent="p0",
            ),
        )
    )  # fmt: skip


def test_noisy_neighbour_tells_the_offender_and_the_victim_each_without_the_other() -> None:
    # Both at 45 % for ten minutes (B's baseline 45). From 10: A at 85 % of the GPU with 50 %
    # allocated (> 1.5 x 0.5 = 0.75 and 35 points > 20), B at 12 % < 0.7 x 45 = 31.5.
    # Pending 10, firing 10 + 5, resolved when A calms down at 30: one alert for A (scoped to
    # A's tenant and owner, naming A only) and one for B (B's, naming B only).
    def snap(m: int) -> Snapshot:
        if 10 <= m < 30:
            return _shared_gpu(m, 85.0, 12.0)
        return _shared_gpu(m, 45.0, 45.0)

    rules: list[Rule] = [NoisyNeighbourRule(), SlowedByNeighbourRule()]
    seen, _ = run(rules, range(40), snap)
    assert seen == [
        (10, None, P, "p0", "w-a", ("w-a",)),
        (10, None, P, "p0", "w-b", ("w-b",)),
        (15, P, F, "p0", "w-a", ("w-a",)),
        (15, P, F, "p0", "w-b", ("w-b",)),
        (30, F, R, "p0", "w-a", ("w-a",)),
        (30, F, R, "p0", "w-b", ("w-b",)),
    ]
    _, at_20 = run(rules, range(21), snap)
    offender, victim = sorted(at_20.alerts.values(), key=lambda a: a.key.rule)
    assert (offender.key.rule, offender.tenant, offender.owner) == (
        "noisy_neighbour",
        "ml",
        "w-a-owner",
    )
    assert (victim.key.rule, victim.tenant, victim.owner) == (
        "slowed_by_neighbour",
        "vision",
        "w-b-owner",
    )
    assert "w-b" not in offender.summary and "vision" not in offender.summary
    assert "slowing 1 other workload" in offender.summary
    assert "w-a" not in victim.summary and "ml" not in victim.summary
    assert "fell from 45 % to 12 %" in victim.summary and "another GPU" in victim.summary


def test_no_noisy_neighbour_for_a_workload_using_exactly_its_share() -> None:
    # A uses exactly its 50 % while B drops: nobody crowds B.
    def snap(m: int) -> Snapshot:
        return _shared_gpu(m, 50.0, 45.0 if m < 10 else 5.0)

    assert run([NoisyNeighbourRule()], range(30), snap)[0] == []


def test_no_noisy_neighbour_without_a_victim() -> None:
    # A takes 85 % but B keeps its pace: busy, not noisy.
    def snap(m: int) -> Snapshot:
        return _shared_gpu(m, 45.0 if m < 10 else 85.0, 14.0)

    assert run([NoisyNeighbourRule()], range(30), snap)[0] == []


def test_memory_over_share() -> None:
    # 250 milli of a 16000 MiB T4 may use 4000 MiB: exactly 4000 is fine, 4001 from minute 3
    # to 5 is not: pending 3, firing 4 (for 1 min), resolved 6.
    def snap(m: int) -> Snapshot:
        used = 4001.0 if 3 <= m < 6 else 4000.0
        s = DeviceSample(
            "t4/w1", minute(m), 30.0, memory_used_mib=used, memory_total_mib=16000.0,
            allocation=share("w1", 250), parent="t4",
        )  # fmt: skip
        return Snapshot(devices=(s,))

    seen, _ = run([MemoryOverShareRule()], range(10), snap)
    assert seen == [
        (3, None, P, "t4", "w1", ("w1",)),
        (4, P, F, "t4", "w1", ("w1",)),
        (6, F, R, "t4", "w1", ("w1",)),
    ]


def test_xid_fires_at_once_and_resolves_after_the_hold() -> None:
    # The counter rises at minute 3: firing at 3, resolved at 3 + 10 (no further rise).
    def snap(m: int) -> Snapshot:
        xid = 1 if m >= 3 else 0
        return Snapshot(
            devices=(DeviceSample("g0", minute(m), 50.0, xid_count=xid, allocation=whole("w1")),)
        )

    seen, _ = run([XidRule()], range(20), snap)
    assert seen == [(3, None, F, "g0", "g0", ("w1",)), (13, F, R, "g0", "g0", ("w1",))]


def test_ecc_counter_reset_is_not_an_error() -> None:
    # 5 -> 0 at minute 2 is a driver reload; 0 -> 1 at minute 4 is a new error.
    counts = {0: 5, 1: 5, 2: 0, 3: 0}

    def snap(m: int) -> Snapshot:
        return Snapshot(
            devices=(DeviceSample("g0", minute(m), 50.0, ecc_uncorrectable=counts.get(m, 1)),)
        )

    seen, _ = run([EccRule()], range(6), snap)
    assert seen == [(4, None, F, "g0", "g0", ())]


def test_throttle() -> None:
    # Hardware thermal slowdown from 2 to 13: pending 2, firing 12, resolved 14.
    # The idle reason (0x1) alone is not throttling.
    def snap(m: int) -> Snapshot:
        reasons = HW_THERMAL if 2 <= m < 14 else 0x1
        return Snapshot(devices=(DeviceSample("g0", minute(m), 90.0, throttle_reasons=reasons),))

    seen, _ = run([ThrottleRule()], range(20), snap)
    assert [(m, prev, cur) for m, prev, cur, *_ in seen] == [(2, None, P), (12, P, F), (14, F, R)]


def test_quota_pressure() -> None:
    # 9 of 10 (90 %) from 0, 8 of 10 from 20: pending 0, firing 15, resolved 20.
    def snap(m: int) -> Snapshot:
        used = 9.0 if m < 20 else 8.0
        return Snapshot(tenants=(TenantUsageSample("ml", "H100-80GB", minute(m), used, 10.0),))

    seen, _ = run([QuotaPressureRule()], range(25), snap)
    assert seen == [
        (0, None, P, "ml", "H100-80GB", ()),
        (15, P, F, "ml", "H100-80GB", ()),
        (20, F, R, "ml", "H100-80GB", ()),
    ]


def test_long_queue_wait() -> None:
    # Queued at T0; firing at 30 min of waiting, resolved when it leaves the queue at 35.
    def snap(m: int) -> Snapshot:
        if m >= 35:
            return Snapshot()
        return Snapshot(queue=(QueueSample("w9", "ml", "ann", T0, minute(m)),))

    seen, _ = run([LongQueueWaitRule()], range(40), snap)
    assert seen == [(30, None, F, "ml", "w9", ("w9",)), (35, F, R, "ml", "w9", ("w9",))]


def test_budget_burn() -> None:
    # 0.50 spent per hour of a 30-day period projects to 0.5 x 720 = 360.00 > 300.00 budget.
    # Evaluated from one hour in: pending at hour 1, firing at hour 2 (for 1 h).
    # From hour 4 the spend stays at 1.50: 1.5 / 4 h x 720 h = 270 <= 300: resolved at 4.
    end = int(T0) + 30 * 24 * 3600

    def snap(m: int) -> Snapshot:
        hours = m / 60
        spent = Decimal(str(min(hours, 3) * 0.5))
        return Snapshot(budgets=(BudgetSample("ml", minute(m), spent, Decimal(300), int(T0), end),))

    seen, _ = run([BudgetBurnRule()], range(0, 300, 60), snap)
    assert [(m, prev, cur) for m, prev, cur, *_ in seen] == [
        (60, None, P),
        (120, P, F),
        (240, F, R),
    ]


def _node(m: int, x_activity: float, y_activity: float, domain: str = "") -> Snapshot:
    def alloc(w: str) -> AllocationContext:
        return AllocationContext(w, "ml", f"{w}-owner", node="n1", domain=domain)

    return Snapshot(
        devices=(
            DeviceSample("g0", minute(m), x_activity, activity_pct=x_activity,
                         allocation=alloc("w-x")),
            DeviceSample("g1", minute(m), y_activity, activity_pct=y_activity,
                         allocation=alloc("w-y")),
        )
    )  # fmt: skip


def test_noisy_neighbour_on_a_node_of_whole_gpus() -> None:
    # One GPU each (a = 0.5). From 10: w-x drives 95 / (95 + 20) = 0.83 of the node's activity
    # (> 0.75, 33 points > 20) while w-y fell to 20 < 0.7 x 40 = 28: pending 10, firing 15.
    def snap(m: int) -> Snapshot:
        return _node(m, 95.0, 20.0) if m >= 10 else _node(m, 40.0, 40.0)

    seen, _ = run([NoisyNeighbourRule()], range(20), snap)
    assert seen == [
        (10, None, P, "node:n1", "w-x", ("w-x",)),
        (15, P, F, "node:n1", "w-x", ("w-x",)),
    ]


def test_noisy_neighbour_in_an_nvlink_domain_only_when_asked() -> None:
    def snap(m: int) -> Snapshot:
        return _node(m, 95.0, 20.0, "nvl0") if m >= 10 else _node(m, 40.0, 40.0, "nvl0")

    rule = NoisyNeighbourRule(NoisyNeighbourSettings(scopes=frozenset({NoisyScope.DOMAIN})))
    seen, _ = run([rule], range(12), snap)
    assert seen == [(10, None, P, "domain:n1/nvl0", "w-x", ("w-x",))]


def test_a_mig_instance_using_all_of_itself_is_not_noisy() -> None:
    # 100 % of a 3g instance is 3/7 of the parent: exactly its share, whatever the 4g does.
    def snap(m: int) -> Snapshot:
        def mig(w: str, slices: int, act: float) -> DeviceSample:
            alloc = AllocationContext(
                w, "ml", "o", ShareKind.MIG, mig_slices=slices, mig_total_slices=7
            )
            return DeviceSample(
                f"h0/{w}", minute(m), act, activity_pct=act, allocation=alloc, parent="h0"
            )

        return Snapshot(devices=(mig("w3", 3, 100.0), mig("w4", 4, 50.0 if m < 5 else 5.0)))

    assert run([NoisyNeighbourRule()], range(20), snap)[0] == []


def test_replay_in_pieces_equals_one_run() -> None:
    # The state is a value: stopping, keeping it and going on gives the same alerts.
    def snap(m: int) -> Snapshot:
        util = 2.0 if 10 <= m < 50 else 60.0
        return Snapshot(
            devices=(
                DeviceSample("g0", minute(m), util, allocation=whole("w1"), xid_count=m // 20),
            ),
            queue=(QueueSample("w9", "ml", "ann", T0, minute(m)),),
        )

    engine = Engine(default_rules())
    whole_run: list[Transition] = []
    state = EngineState()
    for m in range(60):
        state, ts = engine.step(state, snap(m), minute(m))
        whole_run.extend(ts)
    kept = EngineState()
    pieces: list[Transition] = []
    for chunk in (range(0, 25), range(25, 60)):
        for m in chunk:
            kept, ts = Engine(default_rules()).step(kept, snap(m), minute(m))
            pieces.extend(ts)
    assert pieces == whole_run
    assert {t.alert.key.rule for t in whole_run} == {"idle", "xid", "long_queue_wait"}
