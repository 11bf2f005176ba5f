"""ETA: walk the expected ends until everything ahead plus this item fits."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.errors import InvalidRequest
from policies.eta import ReleaseCurve, ReleaseTimeline, estimate_wait

NOW = 1000.0


@pytest.mark.parametrize(
    ("ahead", "ends", "free", "need", "expected"),
    [
        # 2 free >= 0 ahead + 2: now.
        ([], [], 2, 2, 0.0),
        # 1 free; need 2: the end at 1300 frees 1 -> 2 >= 2: 300 s.
        ([], [(1300.0, 1), (1100.0, 0)], 1, 2, 300.0),
        # 3 ahead + 1 = 4; 0 free: 1100 frees 2 (2), 1200 frees 1 (3), 1500 frees 4 (7): 500 s.
        ([2, 1], [(1500.0, 4), (1100.0, 2), (1200.0, 1)], 0, 1, 500.0),
        # Overdue work counts as ending now.
        ([], [(900.0, 2)], 0, 2, 0.0),
        # Work without an expected end frees nothing: cannot estimate.
        ([], [(math.inf, 8), (math.nan, 8)], 0, 1, None),
        # Known ends free only 3 of the 4 needed.
        ([3], [(1100.0, 3)], 0, 1, None),
    ],
)
def test_estimate_wait(
    ahead: list[int], ends: list[tuple[float, int]], free: int, need: int, expected: float | None
) -> None:
    assert estimate_wait(ahead, ends, free, need, NOW) == expected


def test_bad_amounts() -> None:
    with pytest.raises(InvalidRequest, match=r"invalid amounts need=-1 free_now=0 ahead=\[\]"):
        estimate_wait([], [], 0, -1, NOW)
    with pytest.raises(InvalidRequest, match="invalid running amount -2"):
        estimate_wait([], [(1100.0, -2)], 0, 1, NOW)


def test_a_release_curve_answers_like_the_walk_for_every_amount_ahead() -> None:
    # Ends at +100 (2), +50 (3), never (5), already past (1): sorted past (1), +50 (3),
    # +100 (2) → released 1, 4, 6. With 1 free and need 2: ahead 0 → free covers 1 of 2,
    # short 1 → the past end, 0 s; ahead 2 → short 3 → +50; ahead 4 → short 5 → +100;
    # ahead 6 → short 7 > 6 → never.
    ends = [(NOW + 100, 2), (NOW + 50, 3), (math.inf, 5), (NOW - 10, 1)]
    curve = ReleaseCurve(ends)
    for ahead, want in [(0, 0.0), (2, 50.0), (4, 100.0), (6, None)]:
        assert curve.wait(ahead, 1, 2, NOW) == want
        assert estimate_wait([ahead], ends, 1, 2, NOW) == want
    with pytest.raises(InvalidRequest, match="ahead=-1"):
        curve.wait(-1, 1, 2, NOW)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([NOW - 50, NOW + 10, NOW + 10, NOW + 300, math.inf, math.nan]),
            st.integers(0, 4),
            st.booleans(),
        ),
        max_size=25,
    ),
    st.integers(0, 12),
    st.integers(0, 5),
    st.integers(0, 6),
)
def test_a_timeline_answers_like_a_curve_of_the_same_ends_as_holders_come_and_go(
    changes: list[tuple[float, int, bool]], ahead: int, free: int, need: int
) -> None:
    """Holders are added and some removed again (``True``); after every change the
    incremental timeline answers every question exactly as a curve built from scratch."""
    timeline = ReleaseTimeline()
    held: dict[str, tuple[float, int]] = {}
    for i, (end, amount, leave_again) in enumerate(changes):
        timeline.add(end, f"w{i}", amount)
        held[f"w{i}"] = (end, amount)
        if leave_again:
            gone = sorted(held)[len(held) // 2]
            timeline.remove(*held[gone][:1], gone, held[gone][1])
            del held[gone]
        curve = ReleaseCurve(list(held.values()))
        assert timeline.wait(ahead, free, need, NOW) == curve.wait(ahead, free, need, NOW)
        assert timeline.curve().wait(ahead, free, need, NOW) == curve.wait(ahead, free, need, NOW)


def test_a_timeline_refuses_to_remove_what_it_does_not_hold() -> None:
    timeline = ReleaseTimeline()
    timeline.add(NOW + 10, "w1", 2)
    with pytest.raises(KeyError):
        timeline.remove(NOW + 10, "w1", 3)
    with pytest.raises(InvalidRequest, match="invalid running amount -1"):
        timeline.add(NOW, "w2", -1)
    assert timeline.wait(0, 0, 2, NOW) == 10.0
