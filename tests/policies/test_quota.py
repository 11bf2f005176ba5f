"""Quota rules: tables with the arithmetic in comments, then properties over random books."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.errors import InvalidRequest, NotFound
from policies.flavors import Flavor
from policies.quota import (
    FlavorQuota,
    FlavorUsage,
    QueueReason,
    QuotaBook,
    TenantQuota,
    Usage,
    admit,
    budget_exhausted,
    gpu_equivalent,
    over_quota,
    own_limit_refuses,
    pool_usage,
    reclaim_plan,
    usage_summary,
)

H100 = "H100-80GB"
MIG = "A100-40GB/1g.5gb"
SHARE = "T4/share"


def tenant(
    name: str, cohort: str | None = None, weight: float = 1.0, **quotas: tuple[int, int]
) -> TenantQuota:
    flavors = {"h100": H100, "mig": MIG, "share": SHARE}
    return TenantQuota(
        name,
        {flavors[k]: FlavorQuota(g, lim) for k, (g, lim) in quotas.items()},
        cohort=cohort,
        weight=weight,
    )


def book(*tenants: TenantQuota, capacity: int = 8) -> QuotaBook:
    return QuotaBook({t.tenant: t for t in tenants}, {H100: capacity})


# Two tenants in cohort "lab" (guaranteed 2, limit 4 each), "solo" without a cohort
# (guaranteed 2, limit 4); capacity 8, so the unguaranteed pool is 8 - (2+2+2) = 2.
LAB = book(
    tenant("team-a", "lab", h100=(2, 4)),
    tenant("team-b", "lab", h100=(2, 4)),
    tenant("solo", h100=(2, 4)),
)


@dataclass(frozen=True)
class AdmitCase:
    name: str
    usage: dict[str, int]
    who: str
    amount: int
    ok: bool
    borrowed: int = 0
    reason: QueueReason | None = None
    reclaimable: int = 0
    shortfall: int = 0


ADMIT_CASES = [
    # 0 + 2 <= guaranteed 2: no borrowing.
    AdmitCase("within guaranteed", {}, "team-a", 2, True),
    # 0 + 4 = limit 4; 2 borrowed: the cohort lends team-b's unused 2, nothing drawn from the pool.
    AdmitCase("borrow from cohort", {}, "team-a", 4, True, borrowed=2),
    # 4 + 1 > limit 4.
    AdmitCase("above limit", {"team-a": 4}, "team-a", 1, False, 1, QueueReason.QUOTA, 0, 1),
    # team-b holds 2: lab used 2+2=4 = lab guaranteed 4, so team-a's 2 more draw 2 from the pool
    # (pool 2, drawn 0): ok.
    AdmitCase("borrow from pool", {"team-a": 2, "team-b": 2}, "team-a", 2, True, borrowed=2),
    # solo already draws 2 (holds 4, guaranteed 2): pool 2 fully drawn; lab 2+2 = 4, team-a's
    # 1 more would draw 1: refused, and borrowing never reclaims.
    AdmitCase(
        "pool exhausted",
        {"team-a": 2, "team-b": 2, "solo": 4},
        "team-a",
        1,
        False,
        1,
        QueueReason.QUOTA,
        0,
        1,
    ),
    # solo has no cohort: above guaranteed it borrows from the pool only. team-a and team-b
    # draw 2 (lab 6 > 4), so the pool is empty although team-a... holds its own.
    AdmitCase(
        "no cohort, pool drawn by the lab",
        {"team-a": 4, "team-b": 2},
        "solo",
        3,
        False,
        1,
        QueueReason.QUOTA,
        0,
        1,
    ),
    # team-b borrows team-a's 2 (lab 0+4 = 4, no draw); solo draws 2. team-a asks its 2:
    # lab 6 > 4 draws 2, pool drawn 4 > 2: short 2, reclaimable 2 from team-b.
    AdmitCase(
        "guaranteed lent out",
        {"team-b": 4, "solo": 4},
        "team-a",
        2,
        False,
        0,
        QueueReason.QUOTA,
        2,
        2,
    ),
    # Same, but the pool is free: team-b's borrowing moves onto the pool, nothing to reclaim.
    AdmitCase("guaranteed lent, pool free", {"team-b": 4}, "team-a", 2, True),
]


@pytest.mark.parametrize("case", ADMIT_CASES, ids=lambda c: c.name)
def test_admit_table(case: AdmitCase) -> None:
    usage = {(t, H100): u for t, u in case.usage.items()}
    got = admit(LAB, usage, case.who, H100, case.amount)
    assert (got.ok, got.borrowed, got.reason, got.reclaimable, got.shortfall) == (
        case.ok,
        case.borrowed,
        case.reason,
        case.reclaimable,
        case.shortfall,
    ), got.message


def test_limit_message_names_tenant_flavor_use_and_limit() -> None:
    got = admit(LAB, {("team-a", H100): 4}, "team-a", H100, 1)
    assert got.message == "team-a quota for H100-80GB: 4/4 gpus in use, 1 requested (limit 4)"


def test_no_quota_for_flavor_is_a_quota_reason() -> None:
    b = QuotaBook({"a": tenant("a", h100=(1, 1)), "b": tenant("b", mig=(1, 1))}, {H100: 1, MIG: 7})
    got = admit(b, {}, "a", MIG, 1)
    assert not got.ok and got.reason is QueueReason.QUOTA
    assert got.message.startswith("a has no quota for A100-40GB/1g.5gb")


def test_unknown_tenant_and_flavor_list_the_known_names() -> None:
    with pytest.raises(NotFound, match=r"unknown tenant 'nope'; known tenants: solo, team-a"):
        admit(LAB, {}, "nope", H100, 1)
    with pytest.raises(NotFound, match=r"unknown flavor 'A30-24GB'; known flavors: H100-80GB"):
        admit(LAB, {}, "team-a", "A30-24GB", 1)


@pytest.mark.parametrize("amount", [0, -1, 10**9 + 1, True])
def test_bad_amount(amount: int) -> None:
    with pytest.raises(InvalidRequest, match="requested amount"):
        admit(LAB, {}, "team-a", H100, amount)


def test_reclaim_plan_takes_from_the_cohort_borrower() -> None:
    # As "guaranteed lent out": team-b gives back 2, then team-a's 2 fit.
    usage = {("team-b", H100): 4, ("solo", H100): 4}
    plan = reclaim_plan(LAB, usage, None, "team-a", H100, 2)
    assert plan == {"team-b": 2}
    usage[("team-b", H100)] -= 2
    assert admit(LAB, usage, "team-a", H100, 2).ok


def test_reclaim_plan_prefers_biggest_borrower_relative_to_weight() -> None:
    # Cohort of three, capacity 6 = guaranteed 6: no pool. a (g 4) asks 4; b borrows 2
    # (weight 1: 2/1 = 2), c borrows 2 (weight 4: 2/4 = 0.5). Short 4 - 0 = ... lab used
    # 0+3+3 = 6, +4 = 10, draws 4: b gives 2 first, then c 2.
    b = QuotaBook(
        {
            "a": tenant("a", "lab", h100=(4, 4)),
            "b": tenant("b", "lab", 1.0, h100=(1, 3)),
            "c": tenant("c", "lab", 4.0, h100=(1, 3)),
        },
        {H100: 6},
    )
    usage = {("b", H100): 3, ("c", H100): 3}
    assert reclaim_plan(b, usage, None, "a", H100, 3) == {"b": 2, "c": 1}
    # Only what the caller allows is reclaimed: b's work is already being preempted.
    assert reclaim_plan(b, usage, {"c": 2}, "a", H100, 2) == {"c": 2}
    assert reclaim_plan(b, usage, {"c": 1}, "a", H100, 2) == {}


def test_borrowing_request_never_reclaims() -> None:
    # team-a 0 + 3 > guaranteed 2: it would borrow 1, so no reclaim even though team-b borrows.
    usage = {("team-b", H100): 4, ("solo", H100): 4}
    got = admit(LAB, usage, "team-a", H100, 3)
    assert not got.ok and got.reclaimable == 0
    assert reclaim_plan(LAB, usage, None, "team-a", H100, 3) == {}


def test_capacity_below_guarantees_waits_for_capacity() -> None:
    # A node is down: capacity 3 < guaranteed 6. team-a 2 + team-b 1 fill it.
    b = LAB.with_capacity({H100: 3})
    got = admit(b, {("team-a", H100): 2, ("team-b", H100): 1}, "solo", H100, 1)
    assert (got.ok, got.reason, got.reclaimable) == (False, QueueReason.CAPACITY, 0)
    assert (
        got.message == "H100-80GB: 0/3 gpus free, 1 requested; "
        "0 of the missing 1 can be reclaimed from borrowers"
    )


def test_lowering_a_quota_kills_nothing_but_blocks_and_exposes() -> None:
    # Capacity 6 = guaranteed 6, no pool. team-a takes 4 (borrows team-b's unused 2).
    tight = LAB.with_capacity({H100: 6})
    assert admit(tight, {}, "team-a", H100, 4).ok
    usage = {("team-a", H100): 4}
    # The admin lowers team-a to guaranteed 1, limit 2: nothing stops, new work is refused.
    lowered = tight.with_tenant(tenant("team-a", "lab", h100=(1, 2)))
    assert over_quota(lowered, usage) == [("team-a", H100, 2)]
    assert not admit(lowered, usage, "team-a", H100, 1).ok
    # Pool 6 - 5 = 1; lab 4 - 3 = 1 drawn. team-b asks its 2: lab 6 - 3 = 3 drawn > 1, short 2;
    # team-a holds 3 above its new guaranteed, so it gives back 2.
    got = admit(lowered, usage, "team-b", H100, 2)
    assert (got.ok, got.shortfall, got.reclaimable) == (False, 2, 2)
    assert reclaim_plan(lowered, usage, None, "team-b", H100, 2) == {"team-a": 2}


def test_capacity_shortfall_reclaims_borrowing_that_draws_nothing() -> None:
    # A node is down: capacity 5 < guaranteed 6, so no pool. team-b holds 3 (1 borrowed from
    # team-a's unused), solo 2: 5/5 in use. team-a asks 1: lab 3 + 1 = 4 <= 4 draws nothing,
    # but no capacity is free; team-b's borrowed 1 frees it.
    b = LAB.with_capacity({H100: 5})
    usage = {("team-b", H100): 3, ("solo", H100): 2}
    got = admit(b, usage, "team-a", H100, 1)
    assert (got.ok, got.reason, got.shortfall, got.reclaimable) == (
        False,
        QueueReason.CAPACITY,
        1,
        1,
    )
    assert reclaim_plan(b, usage, None, "team-a", H100, 1) == {"team-b": 1}
    usage[("team-b", H100)] = 2
    assert admit(b, usage, "team-a", H100, 1).ok


def test_usage_summary_reports_lent() -> None:
    # team-b borrows 2 of team-a's unused 2: team-a has lent 2.
    usage = {("team-b", H100): 4}
    assert usage_summary(LAB, usage, "team-a") == [FlavorUsage(H100, 2, 4, 0, 0, 2)]
    assert usage_summary(LAB, usage, "team-b") == [FlavorUsage(H100, 2, 4, 4, 2, 0)]
    assert usage_summary(LAB, usage, "solo") == [FlavorUsage(H100, 2, 4, 0, 0, 0)]


def test_pool_usage() -> None:
    usage = {("team-a", H100): 4, ("team-b", H100): 1, ("solo", H100): 3}
    # lab 5 - 4 = 1 drawn, solo 3 - 2 = 1 drawn; pool 8 - 6 = 2.
    assert pool_usage(LAB, usage, H100).drawn == 2
    assert pool_usage(LAB, usage, H100).unguaranteed == 2


@pytest.mark.parametrize(
    ("flavor", "amount", "expected"),
    [
        (H100, 3, 3.0),
        ("H100-80GB/3g.40gb", 2, 6 / 7),  # 2 × 3 compute slices / 7
        ("A30-24GB/2g.12gb", 1, 0.5),  # 2 of 4 slices
        (SHARE, 250, 0.25),  # 250 milli-GPU
    ],
)
def test_gpu_equivalent(flavor: str, amount: int, expected: float) -> None:
    assert gpu_equivalent(Flavor.parse(flavor), amount) == pytest.approx(expected)


def test_budget() -> None:
    assert not budget_exhausted(FlavorQuota(1, 1), 1e9)
    assert not budget_exhausted(FlavorQuota(1, 1, 10.0), 9.5)
    assert budget_exhausted(FlavorQuota(1, 1, 10.0), 10.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"guaranteed": -1, "limit": 1}, "invalid guaranteed quota -1: expected an integer from 0"),
        ({"guaranteed": 0, "limit": 10**9 + 1}, "invalid quota limit 1000000001: expected an"),
        ({"guaranteed": 3, "limit": 2}, "invalid quota limit 2: expected at least the guaranteed"),
        ({"guaranteed": 1.5, "limit": 2}, "invalid guaranteed quota 1.5"),
        ({"guaranteed": 0, "limit": 1, "budget_gpu_hours": -1.0}, "invalid budget_gpu_hours -1.0"),
        (
            {"guaranteed": 0, "limit": 1, "budget_gpu_hours": float("nan")},
            "invalid budget_gpu_hours nan",
        ),
    ],
)
def test_bad_flavor_quota(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        FlavorQuota(**kwargs)  # type: ignore[arg-type]
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    "name", ["Team-A", "équipe", "a" * 64, "", "-a", "a-", "a_b", "a.b", "a\n"]
)
def test_bad_tenant_names(name: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        TenantQuota(name, {})
    assert str(err.value) == (
        f"invalid tenant {name!r}: expected a DNS-1123 label, Kubernetes namespace-compatible: "
        "1 to 63 characters of lowercase a-z, 0-9 or '-', "
        "starting and ending with a letter or digit"
    )


def test_longest_tenant_name_is_accepted() -> None:
    assert TenantQuota("a" * 63, {}).tenant == "a" * 63


@pytest.mark.parametrize(
    ("flavor", "message"),
    [
        ("", "invalid flavor ''"),
        ("H100-80GB/", "invalid flavor H100-80GB/"),
        ("H100-80GB/9g.99gb", "invalid MIG profile '9g.99gb' for H100-80GB"),
        ("T4/1g.5gb", "invalid MIG-capable model T4"),
        ("H100 80GB", "invalid flavor H100 80GB"),
    ],
)
def test_unknown_flavor_strings(flavor: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        TenantQuota("a", {flavor: FlavorQuota(0, 0)})
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("weight", [0, -1, 1000.5, float("inf"), float("nan")])
def test_bad_weight(weight: float) -> None:
    with pytest.raises(InvalidRequest, match=r"expected a number > 0 and <= 1000"):
        TenantQuota("a", {}, weight=weight)


def test_bad_capacity() -> None:
    with pytest.raises(InvalidRequest, match="invalid capacity of H100-80GB -1"):
        QuotaBook({}, {H100: -1})
    with pytest.raises(InvalidRequest, match="invalid tenant entry 'b'"):
        QuotaBook({"b": tenant("a")}, {})


# --- properties ----------------------------------------------------------------------------

FLAVORS = [H100, MIG, SHARE]


@st.composite
def books(draw: st.DrawFn) -> QuotaBook:
    flavors = draw(st.lists(st.sampled_from(FLAVORS), min_size=1, max_size=3, unique=True))
    n = draw(st.integers(2, 5))
    tenants = {}
    for i in range(n):
        quotas = {}
        for f in flavors:
            if draw(st.booleans()) or i == 0:
                g = draw(st.integers(0, 5))
                quotas[f] = FlavorQuota(g, g + draw(st.integers(0, 5)))
        cohort = draw(st.sampled_from([None, "c1", "c2"]))
        weight = draw(st.sampled_from([0.5, 1.0, 3.0]))
        tenants[f"t{i}"] = TenantQuota(f"t{i}", quotas, cohort, weight)
    capacity = {}
    for f in flavors:
        guaranteed = sum(t.quotas[f].guaranteed for t in tenants.values() if f in t.quotas)
        capacity[f] = guaranteed + draw(st.integers(0, 6))
    return QuotaBook(tenants, capacity)


def check_guaranteed_obtainable(b: QuotaBook, usage: dict[tuple[str, str], int]) -> None:
    for (t, f), held in list(usage.items()) + [((t, f), 0) for t in b.tenants for f in b.flavors]:
        q = b.tenants[t].quotas.get(f)
        used = usage.get((t, f), 0)
        if q is None or used >= q.guaranteed:
            continue
        del held
        for amount in {1, q.guaranteed - used}:
            got = admit(b, usage, t, f, amount)
            if got.ok:
                continue
            assert got.reclaimable >= got.shortfall, got.message
            plan = reclaim_plan(b, usage, None, t, f, amount)
            after = dict(usage)
            for victim, give in plan.items():
                assert victim != t
                victim_q = b.tenants[victim].quotas.get(f)
                g = victim_q.guaranteed if victim_q else 0
                assert 0 < give <= after[(victim, f)] - g  # only borrowed quota
                after[(victim, f)] -= give
            assert admit(b, after, t, f, amount).ok, (plan, got.message)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(b=books(), data=st.data())
def test_invariants_over_random_operations(b: QuotaBook, data: st.DataObject) -> None:
    usage: dict[tuple[str, str], int] = {}
    names = sorted(b.tenants)
    valid = True  # no admin change has over-committed the pool since the start
    for _ in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(["admit", "admit", "admit", "release", "quota"]))
        t = data.draw(st.sampled_from(names))
        f = data.draw(st.sampled_from(b.flavors))
        if op == "admit":
            amount = data.draw(st.integers(1, 6))
            before = pool_usage(b, usage, f)
            got = admit(b, usage, t, f, amount)
            if got.ok:
                usage[(t, f)] = usage.get((t, f), 0) + amount
                after = pool_usage(b, usage, f)
                assert usage[(t, f)] <= b.tenants[t].quotas[f].limit
                assert after.drawn <= max(before.drawn, after.unguaranteed)
                assert after.used <= after.capacity
                if valid:
                    assert after.drawn <= after.unguaranteed
        elif op == "release" and usage.get((t, f), 0):
            usage[(t, f)] -= data.draw(st.integers(1, usage[(t, f)]))
        elif op == "quota":
            g = data.draw(st.integers(0, 5))
            new = b.with_tenant(
                TenantQuota(
                    t,
                    {**b.tenants[t].quotas, f: FlavorQuota(g, g + data.draw(st.integers(0, 3)))},
                    b.tenants[t].cohort,
                    b.tenants[t].weight,
                )
            )
            pool = pool_usage(new, usage, f)
            if pool.guaranteed > pool.capacity:
                continue  # guarantees above capacity are not promised (see the docs)
            b = new
            valid = valid and all(
                pool_usage(b, usage, x).drawn <= pool_usage(b, usage, x).unguaranteed
                for x in b.flavors
            )
        check_guaranteed_obtainable(b, usage)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(b=books(), data=st.data())
def test_own_limit_refusal_holds_whatever_the_others_hold(
    b: QuotaBook, data: st.DataObject
) -> None:
    # The allocator skips retrying work this refuses when only other tenants' usage changed:
    # then admit must refuse it, with the same message, for any usage of the others.
    names = sorted(b.tenants)
    t = data.draw(st.sampled_from(names))
    f = data.draw(st.sampled_from(b.flavors))
    amount = data.draw(st.integers(1, 6))
    mine = data.draw(st.integers(0, 10))
    answers = set()
    for _ in range(4):
        usage = {(o, x): data.draw(st.integers(0, 6)) for o in names for x in b.flavors}
        usage[(t, f)] = mine
        got = admit(b, usage, t, f, amount)
        if own_limit_refuses(b, usage, t, f, amount):
            assert not got.ok and got.reason is QueueReason.QUOTA
            answers.add(got.message)
        else:
            assert "in use" not in got.message and "no quota" not in got.message
    assert len(answers) <= 1


def test_usage_type_alias_is_a_mapping() -> None:
    u: Usage = {("team-a", H100): 1}
    assert admit(LAB, u, "team-a", H100, 1).ok


def test_docs_worked_example_two_tenants_lending() -> None:
    # docs/quota.md: cohort lab, team-a and team-b each guaranteed 2, limit 4; capacity 4.
    lab = QuotaBook({t: tenant(t, "lab", h100=(2, 4)) for t in ("team-a", "team-b")}, {H100: 4})
    usage: dict[tuple[str, str], int] = {}
    got = admit(lab, usage, "team-b", H100, 4)
    assert (got.ok, got.borrowed) == (True, 2)
    usage[("team-b", H100)] = 4
    assert admit(lab, usage, "team-b", H100, 1).message.startswith("team-b quota for H100-80GB")
    assert reclaim_plan(lab, usage, None, "team-a", H100, 2) == {"team-b": 2}
    usage[("team-b", H100)] = 2
    assert admit(lab, usage, "team-a", H100, 2).ok
    usage[("team-a", H100)] = 2
    more = admit(lab, usage, "team-a", H100, 1)
    assert (more.ok, more.reason, more.reclaimable) == (False, QueueReason.QUOTA, 0)
    # With 6 GPUs, 2 are unguaranteed: team-a's 2 fit at once, nobody is preempted.
    wide = lab.with_capacity({H100: 6})
    assert admit(wide, {("team-b", H100): 4}, "team-a", H100, 2).ok
