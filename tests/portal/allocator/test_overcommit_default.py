"""Guarantees past capacity are refused at the allocator itself, not only at the API: a caller
that sets quotas in-process (a seed, the demo, a script) over-commits only when it says so."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from policies.errors import Forbidden, InvalidRequest
from policies.inventory import Node
from portal.allocator import Allocator
from tests.portal.allocator.conftest import hgx

MakeAllocator = Callable[[list[Node]], Allocator]
H100 = "H100-80GB"


def _started(make_allocator: MakeAllocator) -> Allocator:
    alloc = make_allocator([hgx("n1")])  # 8 H100s
    alloc.set_tenant("team-a")
    alloc.set_tenant("team-b")
    return alloc


def _quotas(alloc: Allocator) -> list[tuple[str, str, int, int, int]]:
    return [(q.tenant, q.flavor, q.guaranteed, q.limit, q.version) for q in alloc.quotas()]


def test_guarantees_past_capacity_are_refused_by_default_and_change_nothing(
    make_allocator: MakeAllocator,
) -> None:
    alloc = _started(make_allocator)
    alloc.set_quota("team-b", H100, guaranteed=3, limit=8)
    before = _quotas(alloc)
    with pytest.raises(InvalidRequest) as refused:
        alloc.set_quota("team-a", H100, guaranteed=6, limit=8)
    # What, which value, what is valid: the field, 6, and the most that still fits (8 - 3).
    assert (refused.value.field, refused.value.value) == ("guaranteed", 6)
    assert refused.value.valid.startswith("at most 5: ")
    assert "add up to 9 on a capacity of 8" in str(refused.value)
    assert "overcommit" in str(refused.value)
    assert _quotas(alloc) == before
    # Within capacity it is saved as before.
    alloc.set_quota("team-a", H100, guaranteed=5, limit=8)
    assert ("team-a", H100, 5, 8, 1) in _quotas(alloc)


def test_overcommit_is_an_explicit_opt_in_and_survives_a_restart(
    make_allocator: MakeAllocator,
) -> None:
    alloc = _started(make_allocator)
    alloc.set_quota("team-b", H100, guaranteed=3, limit=8)
    alloc.set_quota("team-a", H100, guaranteed=6, limit=8, overcommit=True)
    saved = _quotas(alloc)
    assert ("team-a", H100, 6, 8, 1) in saved
    again = make_allocator([hgx("n1")])  # the same database, read back
    assert _quotas(again) == saved


def test_a_tenant_admins_edit_may_not_opt_in_to_overcommit(make_allocator: MakeAllocator) -> None:
    alloc = _started(make_allocator)
    alloc.set_quota("team-a", H100, guaranteed=1, limit=2, ceiling_guaranteed=8, ceiling_limit=8)
    before = _quotas(alloc)
    with pytest.raises(Forbidden, match=r"only a platform admin may .* over-commit"):
        alloc.set_quota("team-a", H100, guaranteed=2, limit=2, within_ceiling=True, overcommit=True)
    assert _quotas(alloc) == before
