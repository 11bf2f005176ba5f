"""Waits by replaying the queue forward (policies.eta_sim): exact ends, quotas, unknown ends,
limits as upper bounds, and intervals calibrated when the run-length model is right."""

from __future__ import annotations

import random

import pytest

from policies import quota
from policies.errors import InvalidRequest
from policies.eta import RunLengths
from policies.eta_sim import Holder, Waiting, simulate

NOW = 10_000.0
FL = "H100-80GB"


def _book(capacity: int, limits: dict[str, int]) -> quota.QuotaBook:
    """One cohort; every tenant guaranteed nothing, so limits and capacity alone bind."""
    tenants = {
        t: quota.TenantQuota(t, {FL: quota.FlavorQuota(0, lim)}, cohort="c")
        for t, lim in limits.items()
    }
    return quota.QuotaBook(tenants=tenants, capacity={FL: capacity})


def _holder(tenant: str, amount: int, ran: float, limit: float | None) -> Holder:
    return Holder(tenant, ((FL, amount),), NOW - ran, (tenant, "job"), limit_s=limit)


def _wait(wid: str, tenant: str, need: int, limit: float | None = None) -> Waiting:
    return Waiting(wid, tenant, (FL,), need, (tenant, "job"), limit)


def test_exact_limits_give_exact_waits_that_every_sample_agrees_on() -> None:
    # 2 GPUs, both held: a ends at +100, b at +300 (limits 200 and 400, run 100 each; no
    # history, so a limit is taken as the end). Queue w1, w2, w3 of 1 GPU each:
    # w1 gets a's GPU at +100 and runs its limit 50 -> ends +150; w2 gets that one at +150;
    # w3 gets b's at +300.
    book = _book(2, {"a": 2, "b": 2})
    holders = [_holder("a", 1, 100, 200), _holder("b", 1, 100, 400)]
    queue = [_wait("w1", "a", 1, 50), _wait("w2", "a", 1, 1000), _wait("w3", "b", 1)]
    got = simulate(NOW, book, {("a", FL): 1, ("b", FL): 1}, holders, queue, RunLengths())
    waits = {w: got[w].interval for w in ("w1", "w2", "w3")}
    assert {w: (i.low, i.point, i.high) for w, i in waits.items() if i} == {
        "w1": (100.0, 100.0, 100.0),
        "w2": (150.0, 150.0, 150.0),
        "w3": (300.0, 300.0, 300.0),
    }
    assert got["w2"].by_limit == 2 and got["w2"].by_history == 0  # a's end, then w1's


def test_a_tenant_at_its_limit_waits_for_its_own_release_not_the_first_one() -> None:
    # Capacity 4, 3 free; tenant a is at its limit 1 (its holder ends at +500), b's ends at
    # +20. a's queued workload fits by capacity but only a's own release admits it: +500.
    book = _book(4, {"a": 1, "b": 4})
    holders = [_holder("a", 1, 0, 500), _holder("b", 0, 0, 20)]
    got = simulate(
        NOW, book, {("a", FL): 1}, holders, [_wait("w", "a", 1)], RunLengths(), samples=4
    )
    interval = got["w"].interval
    assert interval is not None and interval.point == 500.0


def test_a_workload_that_fits_by_the_counts_still_waits_for_a_release() -> None:
    # 1 of 2 GPUs free, yet the allocator left it queued (placement): the replay admits it at
    # the first release (+40), never at once ("under a minute" without any release in sight).
    book = _book(2, {"a": 2})
    got = simulate(
        NOW,
        book,
        {("a", FL): 1},
        [_holder("a", 1, 0, 40)],
        [_wait("w", "a", 1)],
        RunLengths(),
        samples=2,
    )
    interval = got["w"].interval
    assert interval is not None and interval.point == 40.0


def test_no_end_known_gives_no_estimate() -> None:
    book = _book(1, {"a": 1})
    got = simulate(
        NOW, book, {("a", FL): 1}, [_holder("a", 1, 0, None)], [_wait("w", "a", 1)], RunLengths()
    )
    assert got["w"].interval is None


def test_limits_are_upper_bounds_shortened_as_the_group_s_runs_are() -> None:
    # The group's runs all ended at half their limit: a holder with a 1000 s limit, started
    # now, ends at +500, not at its limit.
    history = RunLengths()
    for _ in range(10):
        history.add(("a", "job"), 300.0, limit_s=600.0)
    book = _book(1, {"a": 1})
    got = simulate(
        NOW, book, {("a", FL): 1}, [_holder("a", 1, 0, 1000)], [_wait("w", "a", 1)], history
    )
    interval = got["w"].interval
    assert interval is not None and interval.point == 500.0


def test_the_interval_holds_the_realized_wait_about_60_percent_of_the_time() -> None:
    # Runs of the group last 1..1000 s uniformly; one GPU, held by a run of unknown length
    # that has run 100 s. When reality draws from that same distribution, the p20-p80
    # interval must contain the realized wait about 60 % of the time (here 50-70 %).
    rng = random.Random(7)
    lengths = [float(rng.randint(1, 1000)) for _ in range(400)]
    history = RunLengths()
    for x in lengths:
        history.add(("a", "job"), x)
    book = _book(1, {"a": 1})
    got = simulate(
        NOW,
        book,
        {("a", FL): 1},
        [_holder("a", 1, 100, None)],
        [_wait("w", "a", 1)],
        history,
        samples=32,
    )
    interval = got["w"].interval
    assert interval is not None
    truth = [x - 100 for x in lengths if x > 100]
    inside = sum(interval.low <= t <= interval.high for t in truth) / len(truth)
    assert 0.5 <= inside <= 0.7, inside


def test_bad_sample_count() -> None:
    with pytest.raises(InvalidRequest, match="samples"):
        simulate(NOW, _book(1, {"a": 1}), {}, [], [], RunLengths(), samples=0)
