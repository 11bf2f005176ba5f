"""The pure rules of services: replica bounds, model references, and the autoscaler's
decision, with the arithmetic shown."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.errors import InvalidRequest
from policies.services import ModelRef, Reading, Replicas, ScalingRule, desired_replicas

DIGEST = "sha256:" + "0" * 64
RULE = ScalingRule(target=4, up_window_s=5, down_window_s=30, idle_s=60)
BOUNDS = Replicas(min=1, max=8)


def steady(value: float, now: float, span: float, every: float = 1.0) -> list[Reading]:
    """Readings of ``value`` every ``every`` s over the last ``span`` s (oldest first)."""
    n = int(span / every)
    return [Reading(now - (n - i) * every, value) for i in range(n + 1)]


@pytest.mark.parametrize(
    ("bounds", "field"),
    [
        ({"min": 3, "max": 2}, "replicas.max"),
        ({"min": 0, "max": 0}, "replicas.max"),
        ({"min": 1, "max": 2, "warm": 3}, "replicas.warm"),
        ({"min": -1, "max": 2}, "replicas.min"),
        ({"min": 1, "max": 10_000}, "replicas.max"),
    ],
)
def test_replica_bounds_name_the_field(bounds: dict[str, int], field: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        Replicas(**bounds)
    assert e.value.field == field


@pytest.mark.parametrize(
    "uri",
    ["ftp://x/y", "file://host/abs", "file:///", "relative/dir", "https://", "s3://bucket",
     "https://h/a b", "", "hf://"],
)  # fmt: skip
def test_malformed_model_uris_are_refused(uri: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        ModelRef(uri, DIGEST)
    assert e.value.field == "model.uri"


@pytest.mark.parametrize(
    "uri", ["file:///models/tiny", "https://h/m.tar", "s3://b/k", "gs://b/k", "hf://org/name"]
)
def test_well_formed_model_uris_are_taken(uri: str) -> None:
    assert ModelRef(uri, DIGEST).uri == uri


@pytest.mark.parametrize("digest", ["sha256:" + "A" * 64, "sha256:abc", "md5:" + "0" * 32, ""])
def test_a_digest_is_sha256_and_64_lowercase_hex_digits(digest: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        ModelRef("file:///m", digest)
    assert e.value.field == "model.digest"


def test_up_after_the_whole_up_window_is_above_target() -> None:
    # 2 replicas, 10 waiting per replica for 5 s: 20 waiting at 4 each -> ceil(20/4) = 5.
    assert desired_replicas(RULE, BOUNDS, 2, steady(10, 100, 5), 100, 1) == 5
    # Above for 3 s only: not yet.
    assert desired_replicas(RULE, BOUNDS, 2, steady(10, 100, 3), 100, 1) == 2
    # One reading of the window at the target: no.
    dip = steady(10, 100, 5)
    dip[2] = Reading(dip[2].at, 4)
    assert desired_replicas(RULE, BOUNDS, 2, dip, 100, 1) == 2


def test_up_is_capped_at_max() -> None:
    # 8 replicas' worth would be ceil(2 * 40 / 4) = 20: max is 8.
    assert desired_replicas(RULE, BOUNDS, 2, steady(40, 100, 5), 100, 1) == 8


def test_down_only_after_the_whole_down_window_is_below_target() -> None:
    # 4 replicas at 1 waiting each for 30 s: ceil(4 * 1 / 4) = 1.
    assert desired_replicas(RULE, BOUNDS, 4, steady(1, 100, 30), 100, 1) == 1
    # At 3 per replica: ceil(4 * 3 / 4) = 3.
    assert desired_replicas(RULE, BOUNDS, 4, steady(3, 100, 30), 100, 1) == 3
    # Below for 20 s of the 30: stays.
    assert desired_replicas(RULE, BOUNDS, 4, steady(1, 100, 20), 100, 1) == 4


def test_a_square_wave_shorter_than_the_down_window_never_scales_down() -> None:
    # 10 s high, 10 s low: every 30 s window holds a high half.
    readings = [Reading(float(t), 10.0 if (t // 10) % 2 == 0 else 0.0) for t in range(0, 101)]
    decisions = {desired_replicas(RULE, BOUNDS, 2, readings[: t + 1], t, 1) for t in range(40, 101)}
    assert min(decisions) >= 2


def test_scale_to_zero_after_the_idle_time_only_with_min_zero() -> None:
    zero = Replicas(min=0, max=4)
    assert desired_replicas(RULE, zero, 2, steady(0, 100, 30), 100, 60) == 0
    assert desired_replicas(RULE, zero, 2, steady(0, 100, 30), 100, 59) == 1
    assert desired_replicas(RULE, BOUNDS, 2, steady(0, 100, 30), 100, 600) == 1
    # At zero, a recent request brings one back; an old one does not.
    assert desired_replicas(RULE, zero, 0, [], 100, 0.5) == 1
    assert desired_replicas(RULE, zero, 0, [], 100, 600) == 0


@given(
    current=st.integers(0, 8),
    values=st.lists(st.floats(0, 100), min_size=0, max_size=40),
    idle=st.floats(0, 1000),
    lo=st.integers(0, 4),
    span=st.integers(0, 4),
)
def test_the_answer_stays_within_min_and_max(
    current: int, values: list[float], idle: float, lo: int, span: int
) -> None:
    bounds = Replicas(min=lo, max=lo + span + (0 if lo + span else 1))
    readings = [Reading(float(i), v) for i, v in enumerate(values)]
    want = desired_replicas(RULE, bounds, current, readings, float(len(values)), idle)
    assert bounds.min <= want <= bounds.max
