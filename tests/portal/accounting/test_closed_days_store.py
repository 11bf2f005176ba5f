"""The kept blocks: where a window is cut, which blocks may be kept, the LRU bound, a longer
part of the day in progress replacing a shorter one, and a new pricing basis dropping all."""

from __future__ import annotations

from fractions import Fraction

import pytest

from policies.errors import InvalidRequest
from policies.pricing import CostLine, Period
from portal.accounting.closed_days import DAY_S, HOUR_S, ClosedDays, blocks, can_keep

D = 20_000 * DAY_S  # a UTC midnight


def line(p: Period) -> CostLine:
    one = Fraction(1)
    return CostLine(p, "t", "u", "H100-80GB", one, one, one, one)


def test_a_window_is_cut_at_midnights_and_at_the_last_ended_hour() -> None:
    # 10:30 on day 0 .. 16:20 on day 2; ended until 15:45 on day 2: the last day is also cut
    # at 15:00, so 00:00-15:00 of it can be kept.
    start, end = D + 10 * HOUR_S + 1800, D + 2 * DAY_S + 16 * HOUR_S + 1200
    ended = D + 2 * DAY_S + 15 * HOUR_S + 2700
    got = blocks(start, end, ended)
    assert got == [
        Period(start, D + DAY_S),
        Period(D + DAY_S, D + 2 * DAY_S),
        Period(D + 2 * DAY_S, D + 2 * DAY_S + 15 * HOUR_S),
        Period(D + 2 * DAY_S + 15 * HOUR_S, end),
    ]
    assert [can_keep(b, ended) for b in got] == [False, True, True, False]


def test_nothing_is_kept_past_what_ended() -> None:
    assert not can_keep(Period(D, D + DAY_S), D + DAY_S - 1)
    assert can_keep(Period(D, D + DAY_S), D + DAY_S)
    assert blocks(D, D + HOUR_S, D + 3 * HOUR_S) == [Period(D, D + HOUR_S)]


def test_least_recently_used_blocks_go_first() -> None:
    kept = ClosedDays(max_days=2)
    days = [Period(D + i * DAY_S, D + (i + 1) * DAY_S) for i in range(3)]
    kept.put(days[0], 3600, [line(days[0])])
    kept.put(days[1], 3600, [line(days[1])])
    assert kept.get(days[0], 3600) is not None  # day 0 is now the most recently used
    kept.put(days[2], 3600, [line(days[2])])
    assert len(kept) == 2
    assert kept.get(days[1], 3600) is None
    assert kept.get(days[0], 3600) is not None


def test_a_longer_part_of_a_day_replaces_the_shorter_one() -> None:
    kept = ClosedDays()
    short, longer = Period(D, D + 3 * HOUR_S), Period(D, D + 4 * HOUR_S)
    kept.put(short, 3600, [line(short)], version=(1, 2, 3))
    kept.put(short, 60, [line(short)])
    kept.put(longer, 3600, [line(longer)], version=(1, 2, 4))
    assert kept.get(short, 3600) is None
    assert kept.get(short, 60) is not None  # another resolution is another question
    found = kept.get(longer, 3600)
    assert found is not None and found.version == (1, 2, 4)


def test_a_new_pricing_basis_drops_every_block() -> None:
    kept = ClosedDays()
    kept.bind(("prices", 5.0))
    kept.put(Period(D, D + DAY_S), 0, [])
    kept.bind(("prices", 5.0))
    assert len(kept) == 1
    kept.bind(("other prices", 5.0))
    assert len(kept) == 0


def test_at_least_one_block_is_kept() -> None:
    with pytest.raises(InvalidRequest, match="closed days kept"):
        ClosedDays(max_days=0)
