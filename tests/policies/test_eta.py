"""ETA: walk the expected ends until everything ahead plus this item fits."""

from __future__ import annotations

import math

import pytest

from policies.errors import InvalidRequest
from policies.eta import estimate_wait

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
