"""Pricing: a day of allocations priced by hand, to the cent."""

from __future__ import annotations

import calendar
import itertools
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.errors import InvalidRequest, NotFound
from policies.flavors import Flavor
from policies.pricing import (
    CHARGEBACK_COLUMNS,
    GroupBy,
    Period,
    PriceBook,
    PriceChange,
    PriceSchedule,
    UsageInterval,
    UtilizationSegment,
    chargeback_csv,
    cost_lines,
    projected_spend,
    share_fraction,
    to_cents,
    totals,
)

DAY = calendar.timegm((2026, 3, 2, 0, 0, 0))
H = 3600


def at(hour: int, minute: int = 0, second: int = 0, day: int = 0) -> int:
    return DAY + day * 86400 + hour * H + minute * 60 + second


H100 = Flavor.parse("H100-80GB")
MIG3G = Flavor.parse("H100-80GB/3g.40gb")
T4S = Flavor.parse("T4/share")

# H100: 4.00 per GPU-hour until 13:00, 3.00 from 13:00. T4: 0.35, then 0.55 from 13:00.
PRICES = PriceBook.of(
    PriceSchedule(
        "H100-80GB",
        (PriceChange(at(0, day=-30), Decimal("4.00")), PriceChange(at(13), Decimal("3.00"))),
    ),
    PriceSchedule(
        "T4", (PriceChange(at(0, day=-30), Decimal("0.35")), PriceChange(at(13), Decimal("0.55")))
    ),
)
DAY1 = Period(at(0), at(0, day=1))
DAY2 = Period(at(0, day=1), at(0, day=2))


def iv(
    aid: str, tenant: str, owner: str, flavor: Flavor, amount: int, start: int, end: int
) -> UsageInterval:
    return UsageInterval(aid, f"w-{aid}", tenant, owner, flavor, amount, start, end)


INTERVALS = [
    iv("a", "ml", "alice", H100, 1, at(8), at(14, 30)),
    iv("b", "ml", "bob", MIG3G, 1, at(10), at(15, 30)),
    iv("c", "vision", "carol", T4S, 250, at(12), at(13, 20, 45)),
    iv("d", "ml", "dave", H100, 2, at(23), at(1, day=1)),
]
UTIL = [
    UtilizationSegment("a", at(8), at(9), 2.0),
    UtilizationSegment("a", at(9), at(14, 30), 80.0),
    UtilizationSegment("b", at(10), at(15, 30), 50.0),
    UtilizationSegment("c", at(12), at(13), 0.0),
    UtilizationSegment("c", at(13), at(13, 20, 45), 5.0),  # 5 % is not below 5 %: not idle
]


def test_day_of_allocations_matches_the_hand_computation() -> None:
    # Hand computation (price x share x amount x hours):
    # a  alice H100 x1 08:00-14:30: 5 h x 4.00 + 1.5 h x 3.00 = 20.00 + 4.50 = 24.50
    #    idle 08:00-09:00 (2 % < 5 %): 1 h x 4.00 = 4.00
    #    used 1 h x 0.02 + 5.5 h x 0.80 = 4.42 of 6.5 GPU-h -> efficiency 0.68
    # b  bob 3g.40gb (3/7 of an H100) 10:00-15:30: 3 h x 4 x 3/7 + 2.5 h x 3 x 3/7
    #    = 36/7 + 22.5/7 = 58.5/7 = 8.357142... -> 8.36; used 5.5 x 3/7 x 0.5, efficiency 0.5
    # c  carol T4 250 milli (1/4) 12:00-13:20:45: 1 h x 0.35 / 4 = 0.0875
    #    + 1245 s / 3600 x 0.55 / 4 = 0.047552083... = 0.135052083... -> 0.14
    #    idle 12:00-13:00 (0 %): 0.0875 -> 0.09 (not a tie: 8.75 cents rounds up)
    # d  dave H100 x2 23:00-01:00, split at midnight: day 1 1 h x 2 x 3.00 = 6.00, day 2 6.00
    # Tenant ml day 1: 24.50 + 58.5/7 + 6.00 = 38.857142... -> 38.86; vision day 1: 0.14.
    lines = cost_lines(INTERVALS, PRICES, [DAY1, DAY2], UTIL)
    by_owner = {(ln.period.start, ln.owner): ln for ln in lines}
    a = by_owner[(DAY1.start, "alice")]
    assert to_cents(a.cost) == Decimal("24.50")
    assert to_cents(a.idle_cost) == Decimal("4.00")
    assert a.used_gpu_hours == Fraction("4.42")
    assert a.allocated_gpu_hours == Fraction("6.5")
    assert a.efficiency == pytest.approx(0.68)
    b = by_owner[(DAY1.start, "bob")]
    assert b.cost == Fraction(585, 70)
    assert to_cents(b.cost) == Decimal("8.36")
    assert b.idle_cost == 0
    assert b.efficiency == pytest.approx(0.5)
    c = by_owner[(DAY1.start, "carol")]
    assert c.cost == Fraction(35, 400) + Fraction(1245, 3600) * Fraction(55, 400)
    assert to_cents(c.cost) == Decimal("0.14")
    assert to_cents(c.idle_cost) == Decimal("0.09")
    assert to_cents(by_owner[(DAY1.start, "dave")].cost) == Decimal("6.00")
    assert to_cents(by_owner[(DAY2.start, "dave")].cost) == Decimal("6.00")

    tenants = totals(lines, [GroupBy.PERIOD, GroupBy.TENANT])
    assert to_cents(tenants[(str(DAY1.start), "ml")].cost) == Decimal("38.86")
    assert to_cents(tenants[(str(DAY1.start), "vision")].cost) == Decimal("0.14")
    assert to_cents(tenants[(str(DAY2.start), "ml")].cost) == Decimal("6.00")
    flavors = totals(lines, [GroupBy.FLAVOR])
    assert to_cents(flavors[("H100-80GB",)].cost) == Decimal("36.50")


def test_chargeback_csv_text() -> None:
    lines = cost_lines(INTERVALS, PRICES, [DAY1, DAY2], UTIL)
    rows = chargeback_csv(lines).splitlines()
    assert rows[0] == ",".join(CHARGEBACK_COLUMNS)
    assert rows[1] == (
        "2026-03-02T00:00:00Z,2026-03-03T00:00:00Z,ml,alice,H100-80GB,"
        "6.5000,4.4200,0.6800,24.50,4.00,USD"
    )
    assert rows[2].startswith("2026-03-02T00:00:00Z,2026-03-03T00:00:00Z,ml,bob,H100-80GB/3g.40gb,")
    assert rows[2].endswith(",8.36,0.00,USD")
    assert rows[-1] == (
        "2026-03-03T00:00:00Z,2026-03-04T00:00:00Z,ml,dave,H100-80GB,2.0000,0.0000,0.0000,6.00,0.00,USD"
    )
    assert len(rows) == 6


def test_time_outside_every_period_is_not_charged() -> None:
    lines = cost_lines([INTERVALS[3]], PRICES, [DAY1])
    assert [to_cents(ln.cost) for ln in lines] == [Decimal("6.00")]


def test_share_fractions() -> None:
    assert share_fraction(H100) == 1
    assert share_fraction(MIG3G) == Fraction(3, 7)
    assert share_fraction(T4S) * 250 == Fraction(1, 4)


def test_rounding_is_half_to_even() -> None:
    assert to_cents(Fraction(1, 8)) == Decimal("0.12")
    assert to_cents(Fraction(3, 8)) == Decimal("0.38")
    assert to_cents(Decimal("2.345")) == Decimal("2.34")


def test_budget_burn_projection() -> None:
    # 120.00 spent in the first 10 of 30 days -> 360.00 by the end.
    month = Period(at(0), at(0, day=30))
    assert projected_spend(Decimal("120.00"), month, at(0, day=10)) == 360
    assert projected_spend(Decimal("120.00"), month, at(0, day=40)) == 120
    with pytest.raises(InvalidRequest, match="period start"):
        projected_spend(Decimal("1"), month, at(0))


def test_bad_input_is_rejected() -> None:
    with pytest.raises(InvalidRequest, match="strictly increasing"):
        PriceSchedule("T4", (PriceChange(5, Decimal(1)), PriceChange(5, Decimal(2))))
    with pytest.raises(InvalidRequest, match="Decimal >= 0"):
        PriceChange(0, Decimal("-1"))
    with pytest.raises(InvalidRequest, match="percentage"):
        UtilizationSegment("a", 0, 1, float("nan"))
    with pytest.raises(InvalidRequest, match="do not overlap"):
        cost_lines(
            [],
            PRICES,
            [DAY1],
            [UtilizationSegment("a", 0, 10, 1), UtilizationSegment("a", 5, 9, 1)],
        )
    with pytest.raises(NotFound, match="priced GPU model 'A100-40GB'"):
        cost_lines([iv("x", "t", "o", Flavor.parse("A100-40GB"), 1, at(1), at(2))], PRICES, [DAY1])
    with pytest.raises(InvalidRequest, match="time"):
        PRICES.schedule("T4").price_at(at(0, day=-31))
    with pytest.raises(InvalidRequest, match=r"allocation start 1\.5: expected whole epoch"):
        UsageInterval("a", "w", "t", "o", H100, 1, 1.5, 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="idle threshold"):
        cost_lines([], PRICES, [DAY1], idle_threshold_pct=101.0)


@given(st.lists(st.integers(min_value=0, max_value=86400), min_size=1, max_size=6))
def test_splitting_never_changes_the_total(cuts: list[int]) -> None:
    # The same hold cut into pieces costs exactly the same as in one piece.
    whole = iv("a", "t", "o", MIG3G, 2, at(0), at(0, day=1))
    points = sorted({at(0), at(0, day=1), *(at(0) + c for c in cuts)})
    pieces = [iv("a", "t", "o", MIG3G, 2, lo, hi) for lo, hi in itertools.pairwise(points)]
    one = totals(cost_lines([whole], PRICES, [DAY1]), [])[()].cost
    many = totals(cost_lines(pieces, PRICES, [DAY1]), [])[()].cost
    assert one == many
