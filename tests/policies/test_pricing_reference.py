"""``cost_lines`` sums whole seconds per group and turns them into money once; here it is
compared, exactly, with the formulas applied piece by piece (``reference``: every piece between
two cuts priced on its own, as ``docs/cost.md`` states them), on random intervals, price
changes, periods with gaps, utilization segments and idle thresholds."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.flavors import Flavor
from policies.pricing import (
    CostLine,
    Period,
    PriceBook,
    PriceChange,
    PriceSchedule,
    UsageInterval,
    UtilizationSegment,
    cost_lines,
)

HORIZON = 3 * 86_400
FLAVORS = ("H100-80GB", "H100-80GB/3g.40gb", "T4/share")


def reference(
    intervals: Sequence[UsageInterval],
    book: PriceBook,
    periods: Sequence[Period],
    segments: Sequence[UtilizationSegment],
    threshold: float,
) -> list[CostLine]:
    acc: dict[tuple[Period, str, str, str], list[Fraction]] = {}
    for iv in intervals:
        sched = book.schedule(iv.flavor.model)
        mine = [s for s in segments if s.allocation_id == iv.allocation_id]
        cuts = {iv.start, iv.end, *sched.change_times(iv.start, iv.end)}
        for t in [x for p in periods for x in (p.start, p.end)] + [
            x for s in mine for x in (s.start, s.end)
        ]:
            if iv.start < t < iv.end:
                cuts.add(t)
        for lo, hi in itertools.pairwise(sorted(cuts)):
            period = next((p for p in periods if p.start <= lo < p.end), None)
            if period is None:
                continue
            hours = Fraction(hi - lo, 3600) * iv.gpu_equivalent
            cost = Fraction(sched.price_at(lo)) * hours
            seg = next((s for s in mine if s.start <= lo < s.end), None)
            row = acc.setdefault((period, iv.tenant, iv.owner, str(iv.flavor)), [Fraction(0)] * 4)
            row[0] += hours
            row[2] += cost
            if seg is not None:
                row[1] += hours * Fraction(seg.utilization_pct) / 100
                if Fraction(seg.utilization_pct) < Fraction(threshold):
                    row[3] += cost
    return [
        CostLine(*k, *acc[k]) for k in sorted(acc, key=lambda k: (k[0].start, k[1], k[2], k[3]))
    ]


@st.composite
def problems(
    draw: st.DrawFn,
) -> tuple[list[UsageInterval], PriceBook, list[Period], list[UtilizationSegment], float]:
    times = st.integers(min_value=0, max_value=HORIZON)
    intervals = []
    for i in range(draw(st.integers(min_value=1, max_value=6))):
        a, b = sorted((draw(times), draw(times)))
        intervals.append(
            UsageInterval(
                f"a{i}",
                f"w{i}",
                draw(st.sampled_from(("t1", "t2"))),
                draw(st.sampled_from(("u1", "u2"))),
                Flavor.parse(draw(st.sampled_from(FLAVORS))),
                draw(st.integers(min_value=1, max_value=500)),
                a,
                b,
            )
        )
    prices = st.decimals(min_value=0, max_value=10, places=2)
    book = PriceBook.of(
        *(
            PriceSchedule(
                model,
                tuple(
                    PriceChange(t, draw(prices))
                    for t in [0, *sorted(draw(st.sets(times, max_size=3)) - {0})]
                ),
            )
            for model in ("H100-80GB", "T4")
        )
    )
    cuts = sorted(draw(st.sets(times, min_size=2, max_size=6)))
    # Consecutive cuts make periods; some are left out, leaving gaps that are not charged.
    periods = [
        Period(a, b) for a, b in itertools.pairwise(cuts) if draw(st.booleans()) or a == cuts[0]
    ]
    segments = []
    utilizations = st.one_of(
        st.floats(min_value=0, max_value=100, allow_nan=False),
        st.integers(min_value=0, max_value=100),
        st.sampled_from((4.999999, 5.0, 5.000001)),
    )
    for iv in intervals:
        edges = sorted(draw(st.sets(times, max_size=6)))
        for a, b in itertools.pairwise(edges):
            if draw(st.booleans()):
                segments.append(UtilizationSegment(iv.allocation_id, a, b, draw(utilizations)))
    threshold = draw(st.sampled_from((0.0, 5.0, 50, 100.0)))
    return intervals, book, periods, segments, threshold


@settings(max_examples=300, deadline=None)
@given(problems())
def test_grouped_seconds_price_exactly_like_every_piece_on_its_own(
    problem: tuple[list[UsageInterval], PriceBook, list[Period], list[UtilizationSegment], float],
) -> None:
    intervals, book, periods, segments, threshold = problem
    got = cost_lines(intervals, book, periods, segments, threshold)
    assert got == reference(intervals, book, periods, segments, threshold)


def test_a_price_written_two_ways_is_one_price() -> None:
    # 4.00 and 4 are equal Decimals: grouped together, priced the same.
    book = PriceBook.of(
        PriceSchedule(
            "H100-80GB", (PriceChange(0, Decimal("4.00")), PriceChange(3600, Decimal("4")))
        )
    )
    iv = UsageInterval("a", "w", "t", "u", Flavor.parse("H100-80GB"), 1, 0, 7200)
    (line,) = cost_lines([iv], book, [Period(0, 7200)])
    assert line.cost == 8 and line.allocated_gpu_hours == 2
