"""Fair share: the documented worked example, decay arithmetic, queue order."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.errors import InvalidRequest
from policies.fairness import accumulate, decayed, dominant_share, queue_order
from policies.flavors import Flavor
from policies.quota import gpu_equivalent


def test_worked_example_from_the_module_docstring() -> None:
    h100, small = "H100-80GB", "A100-40GB/1g.5gb"
    capacity = {
        h100: gpu_equivalent(Flavor.parse(h100), 8),  # 8 GEQ
        small: gpu_equivalent(Flavor.parse(small), 14),  # 14 × 1/7 = 2 GEQ
    }
    used = {
        h100: gpu_equivalent(Flavor.parse(h100), 2),  # 2/8 = 0.25
        small: gpu_equivalent(Flavor.parse(small), 7),  # 1 GEQ, 1/2 = 0.5 (dominant)
    }
    # 4.0 × 0.5 + 2.0 × (1 - 0.5) = 3.0 after one half-life.
    history = accumulate(
        4.0, last_at=0.0, now=3600.0, current_gpu_equivalents=2.0, half_life_s=3600
    )
    assert history == pytest.approx(3.0)
    # (0.5 × 0.5 + 0.5 × 3.0/10) / 2 = (0.25 + 0.15) / 2 = 0.2
    assert dominant_share(used, capacity, weight=2.0, history=history) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("value", "elapsed", "half_life", "expected"),
    [
        (8.0, 0.0, 60.0, 8.0),  # no time, no decay
        (8.0, 60.0, 60.0, 4.0),  # one half-life
        (8.0, 180.0, 60.0, 1.0),  # three: 8 / 2³
        (8.0, -30.0, 60.0, 8.0),  # the clock stepped back: treated as no time
    ],
)
def test_decayed(value: float, elapsed: float, half_life: float, expected: float) -> None:
    assert decayed(value, 100.0, 100.0 + elapsed, half_life) == pytest.approx(expected)


@pytest.mark.parametrize("half_life", [0, -1, float("inf"), float("nan")])
def test_bad_half_life(half_life: float) -> None:
    with pytest.raises(
        InvalidRequest, match=r"invalid half_life_s .*: expected a number of seconds > 0"
    ):
        decayed(1.0, 0.0, 1.0, half_life)


def test_dominant_share_edges() -> None:
    # A flavor with no capacity but some use counts as full: share 1 / weight 1.
    assert dominant_share({"x": 1.0}, {"x": 0.0}, 1.0, history_weight=0.0) == 1.0
    assert dominant_share({}, {}, 1.0) == 0.0
    with pytest.raises(InvalidRequest, match="invalid weight 0"):
        dominant_share({}, {}, 0.0)
    with pytest.raises(InvalidRequest, match=r"invalid history_weight 1\.5"):
        dominant_share({}, {}, 1.0, history_weight=1.5)


@given(
    v=st.floats(0, 1e6),
    c=st.floats(0, 1e3),
    t1=st.floats(0, 1e5),
    t2=st.floats(0, 1e5),
    h=st.floats(1, 1e5),
)
def test_accumulate_splits_over_time(v: float, c: float, t1: float, t2: float, h: float) -> None:
    # Folding in two steps equals one step: the update is exact, not an Euler step.
    one = accumulate(v, 0.0, t1 + t2, c, h)
    two = accumulate(accumulate(v, 0.0, t1, c, h), t1, t1 + t2, c, h)
    assert math.isclose(one, two, rel_tol=1e-9, abs_tol=1e-6)
    # Idle time is plain decay; the history stays between the old value and the usage.
    assert accumulate(v, 0.0, t1, 0.0, h) == pytest.approx(decayed(v, 0.0, t1, h))
    assert min(v, c) - 1e-6 <= one <= max(v, c) + 1e-6


@dataclass(frozen=True)
class Item:
    priority: int
    tenant: str
    enqueued_at: float
    seq: int


def test_queue_order() -> None:
    shares = {"heavy": 0.9, "light": 0.1}
    a = Item(0, "heavy", 1.0, 1)
    b = Item(0, "light", 5.0, 2)  # lower share beats earlier enqueue
    c = Item(10, "heavy", 9.0, 3)  # higher priority beats everything
    d = Item(0, "light", 5.0, 0)  # same share and time: seq decides
    e = Item(0, "new", 7.0, 4)  # unknown tenant: share 0
    assert queue_order([a, b, c, d, e], shares) == [c, e, d, b, a]
