"""The database itself refuses to hand a GPU or MIG slice out twice."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from policies.errors import Conflict, InvalidRequest
from portal.store.reader import CLAIMS
from portal.store.records import ChangeSet, WorkloadState
from portal.store.writer import Store
from tests.portal.store.builders import allocation, at, mig, share, workload


@pytest.fixture
def busy(acme: Store) -> Store:
    """acme with workload w1 holding GPU 3 on node-7 (allocation a1)."""
    acme.commit(
        ChangeSet(
            workloads=[workload("w1"), workload("w2")], allocations=[allocation("a1", "w1", (3,))]
        )
    )
    return acme


def test_a_held_gpu_cannot_be_claimed_again(busy: Store) -> None:
    with pytest.raises(Conflict) as err:
        busy.commit(ChangeSet(allocations=[allocation("a2", "w2", (2, 3))]))
    assert err.value.message.startswith(
        "GPU 3 on node-7 is already held by allocation 'a1' (workload 'w1')"
    )
    assert [a.id for a in busy.load().allocations] == ["a1"]


def test_the_same_gpu_on_another_node_is_free(busy: Store) -> None:
    busy.commit(ChangeSet(allocations=[allocation("a2", "w2", (3,), node="node-8")]))
    assert len(busy.load().allocations) == 2


def test_release_then_reclaim(busy: Store) -> None:
    busy.commit(ChangeSet(released=[("a1", at(5))]))
    busy.commit(ChangeSet(allocations=[allocation("a2", "w2", (3,))]))
    assert [a.id for a in busy.load().allocations] == ["a2"]


def test_release_and_reclaim_in_one_change_set(busy: Store) -> None:
    """A preemption frees a GPU and hands it on in one decision."""
    busy.commit(
        ChangeSet(
            workloads=[workload("w1", state=WorkloadState.RELEASED, version=2)],
            released=[("a1", at(5))],
            allocations=[allocation("a2", "w2", (3,))],
        )
    )
    assert [a.id for a in busy.load().allocations] == ["a2"]


def test_releasing_twice_is_a_conflict(busy: Store) -> None:
    busy.commit(ChangeSet(released=[("a1", at(5))]))
    with pytest.raises(Conflict, match="'a1' was already released at 2025-03-01T12:05:00"):
        busy.commit(ChangeSet(released=[("a1", at(6))]))


def test_two_new_allocations_on_one_gpu_in_one_change_set(busy: Store) -> None:
    with pytest.raises(Conflict, match="GPU 5 on node-7 is claimed twice in one change"):
        busy.commit(
            ChangeSet(allocations=[allocation("a2", "w2", (4, 5)), allocation("a3", "w2", (5, 6))])
        )
    assert [a.id for a in busy.load().allocations] == ["a1"]


def test_mig_instances_share_a_gpu_without_overlapping(busy: Store) -> None:
    # 3g.40gb at 0 covers memory slices 0-3, at 4 covers 4-7: both fit on GPU 0.
    busy.commit(
        ChangeSet(allocations=[mig("m1", "w2", 0, "3g.40gb", 0), mig("m2", "w2", 0, "3g.40gb", 4)])
    )
    # 1g.10gb at 2 overlaps m1.
    with pytest.raises(Conflict, match="GPU 0 on node-7 is already held by allocation 'm1'"):
        busy.commit(ChangeSet(allocations=[mig("m3", "w2", 0, "1g.10gb", 2)]))


def test_a_whole_gpu_and_a_mig_instance_exclude_each_other(busy: Store) -> None:
    with pytest.raises(Conflict, match="GPU 3 on node-7 is already held by allocation 'a1'"):
        busy.commit(ChangeSet(allocations=[mig("m1", "w2", 3, "1g.10gb", 6)]))
    busy.commit(ChangeSet(allocations=[mig("m1", "w2", 4, "1g.10gb", 6)]))
    with pytest.raises(Conflict, match="GPU 4 on node-7 is already held by allocation 'm1'"):
        busy.commit(ChangeSet(allocations=[allocation("a2", "w2", (4,))]))


def test_fractional_shares_do_not_claim_exclusively(busy: Store) -> None:
    busy.commit(ChangeSet(allocations=[share("s1", "w2", 5, 300), share("s2", "w2", 5, 500)]))
    assert {a.id for a in busy.load().allocations} == {"a1", "s1", "s2"}


def test_an_impossible_mig_placement_is_invalid(busy: Store) -> None:
    with pytest.raises(InvalidRequest, match=r"3g.40gb@2 in allocation m1"):
        busy.commit(ChangeSet(allocations=[mig("m1", "w2", 0, "3g.40gb", 2)]))


def test_the_claim_is_enforced_by_the_database_not_the_store(busy: Store) -> None:
    """A second writer that bypasses the Store still cannot claim GPU 3."""
    with busy.engine.begin() as conn, pytest.raises(IntegrityError):
        conn.execute(CLAIMS.insert().values(node="node-7", gpu=3, slot=0, allocation_id="a1"))


def test_idempotency_keys_are_unique_per_tenant_and_owner(acme: Store) -> None:
    acme.commit(ChangeSet(workloads=[workload("w1", idempotency_key="k")]))
    # Same key for another owner, and any number of workloads without a key, are fine.
    acme.commit(
        ChangeSet(
            workloads=[
                workload("w2", owner="bob", idempotency_key="k"),
                workload("w3"),
                workload("w4"),
            ]
        )
    )
    with pytest.raises(Conflict) as err:
        acme.commit(ChangeSet(workloads=[workload("w5", idempotency_key="k")]))
    assert err.value.message == (
        "idempotency key 'k' of 'ada' in tenant 'acme' is already used by workload 'w1'; "
        "workload 'w5' needs another key"
    )
    found = acme.workload_by_idempotency_key("acme", "ada", "k")
    assert found is not None and found.id == "w1"


ODD = ("NULL", 'a"b', "c\\d", "{e,f}", " g ", "h'i", "")


@pytest.mark.parametrize("odd", ODD)
def test_claims_of_any_node_and_allocation_name_are_stored_and_released(
    busy: Store, odd: str
) -> None:
    """PostgreSQL commits claims as array literals: names that mean something in one (NULL,
    quotes, backslashes, braces, commas, spaces) are stored as they are and released again."""
    alloc_id, node = odd or "a2", odd or "node-8"
    busy.commit(ChangeSet(allocations=[allocation(alloc_id, "w2", (0, 5), node=node)]))
    with busy.engine.connect() as conn:
        rows = conn.execute(
            select(CLAIMS.c.node, CLAIMS.c.gpu, CLAIMS.c.slot).where(
                CLAIMS.c.allocation_id == alloc_id
            )
        ).all()
    # An H100 has eight MIG memory slices: a whole GPU claims them all.
    assert sorted(rows) == [(node, gpu, slot) for gpu in (0, 5) for slot in range(8)]
    with pytest.raises(Conflict, match="already held"):
        busy.commit(ChangeSet(allocations=[allocation("a3", "w1", (5,), node=node)]))
    busy.commit(ChangeSet(released=[(alloc_id, at(5))]))
    busy.commit(ChangeSet(allocations=[allocation("a3", "w1", (5,), node=node)]))
    assert sorted(a.id for a in busy.load().allocations) == ["a1", "a3"]
