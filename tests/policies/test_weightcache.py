"""The eviction rule both weight caches apply (``policies.weightcache``), with the arithmetic
of each case in its comments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.weightcache import Held, make_room, no_room

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def held(digest: str, size: int, minutes: int, in_use: bool = False) -> Held:
    return Held(digest, size, T0 + timedelta(minutes=minutes), in_use)


@pytest.mark.parametrize(
    ("entries", "size", "cap", "evict", "fits"),
    [
        # 300 + 200 <= 500: nothing to evict.
        ([held("a", 300, 1)], 200, 500, (), True),
        # "c" is in use: even with "a" and "b" gone, 300 + 300 = 600 > 500. Refused, and
        # nothing is evicted for it.
        ([held("a", 300, 1), held("b", 300, 2), held("c", 300, 3, True)], 300, 500, (), False),
        # Same with cap 700: a goes -> 600 + 300 = 900 > 700; b goes -> 300 + 300 = 600.
        ([held("a", 300, 1), held("b", 300, 2), held("c", 300, 3, True)], 300, 700,
         ("a", "b"), True),
        # Least recently used first, not first fetched: "b" was used before "a".
        ([held("a", 400, 5), held("b", 400, 2)], 300, 800, ("b",), True),
        # The in-use oldest entry is spared; the next oldest goes: 400+400+300 > 900 -> b.
        ([held("a", 400, 1, True), held("b", 400, 2), held("c", 100, 3)], 300, 900,
         ("b",), True),
        # Larger than the cap by itself: refused, nothing evicted.
        ([held("a", 100, 1)], 1001, 1000, (), False),
    ],
)  # fmt: skip
def test_least_recently_used_unused_entries_go_and_no_more_than_needed(
    entries: list[Held], size: int, cap: int, evict: tuple[str, ...], fits: bool
) -> None:
    room = make_room(entries, size, cap)
    assert (room.evict, room.fits) == (evict, fits)
    assert room.pinned == sum(e.size for e in entries if e.in_use)


def test_no_room_names_where_the_sizes_and_the_remedy() -> None:
    room = make_room([held("a", 600, 1, True)], 500, 1000)
    err = no_room("tenant t on node n", 500, room, 1000, "stop a service")
    assert str(err.message) == (
        "weight cache of tenant t on node n: 500 bytes do not fit, 600 bytes of 1000 are "
        "used by running replicas or being fetched; stop a service"
    )


entries_strategy = st.lists(
    st.builds(
        held,
        st.sampled_from("abcdefgh"),
        st.integers(0, 500),
        st.integers(0, 50),
        st.booleans(),
    ),
    max_size=8,
    unique_by=lambda e: e.digest,
)


@given(entries_strategy, st.integers(0, 1000), st.integers(1, 2000))
def test_the_rule_evicts_only_unused_oldest_first_and_just_enough(
    entries: list[Held], size: int, cap: int
) -> None:
    room = make_room(entries, size, cap)
    by_digest = {e.digest: e for e in entries}
    left = sum(e.size for e in entries) - sum(by_digest[d].size for d in room.evict)
    unused = sorted((e for e in entries if not e.in_use), key=lambda e: (e.last_used, e.digest))
    if room.fits:
        assert left + size <= cap
        # The oldest unused entries, in order, and not one more than needed.
        assert list(room.evict) == [e.digest for e in unused[: len(room.evict)]]
        if room.evict:
            assert left + by_digest[room.evict[-1]].size + size > cap
    else:
        # Not even every unused entry gone would do: nothing is evicted.
        assert room.evict == ()
        assert sum(e.size for e in entries if e.in_use) + size > cap
