"""``commit``: one transaction per change set, optimistic versions, tenant deletion."""

from __future__ import annotations

import pytest

from policies.errors import Conflict, NotFound
from portal.store.records import ChangeSet, WorkloadState
from portal.store.writer import Store
from tests.portal.store.builders import allocation, at, event, quota, tenant, workload


def test_a_conflict_at_the_end_leaves_nothing_behind(acme: Store) -> None:
    acme.commit(ChangeSet(quotas=[quota("acme", "H100-80GB", limit=8)]))
    before = acme.load()
    doomed = ChangeSet(
        tenants=[tenant("beta")],
        quotas=[quota("beta", "H100-80GB"), quota("acme", "H100-80GB", limit=9, version=2)],
        workloads=[workload("w1")],
        allocations=[allocation("a1", "w1", (0, 1))],
        events=[event("allocated")],
        usage_history={"acme": (3.0, at(1))},
        released=[("no-such-allocation", at(1))],  # applied after everything above
    )
    with pytest.raises(NotFound, match="no-such-allocation"):
        acme.commit(doomed)
    assert acme.load() == before
    assert acme.events() == []
    assert acme.workload("w1") is None
    # The devices were not claimed either: the same allocation commits fine now.
    doomed.released = []
    acme.commit(doomed)
    assert [a.id for a in acme.load().allocations] == ["a1"]


def test_two_writers_read_v1_and_write_v2_one_wins(db_url: str) -> None:
    with Store.open(db_url) as first, Store.open(db_url) as second:
        first.commit(ChangeSet(tenants=[tenant()], quotas=[quota(limit=8)]))
        (q1,) = first.load().quotas
        (q2,) = second.load().quotas
        assert q1.version == q2.version == 1

        first.commit(ChangeSet(quotas=[quota(limit=10, version=q1.version + 1)]))
        with pytest.raises(Conflict) as err:
            second.commit(ChangeSet(quotas=[quota(limit=12, version=q2.version + 1)]))
        assert "quota acme/H100-80GB" in err.value.message
        assert "needs stored version 1, found stored version 2" in err.value.message
        (stored,) = second.load().quotas
        assert (stored.limit, stored.version) == (10, 2)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (1, "needs no stored row (version 1 creates one), found stored version 1"),
        (3, "needs stored version 2, found stored version 1"),
    ],
)
def test_stale_tenant_versions_are_rejected(acme: Store, version: int, expected: str) -> None:
    with pytest.raises(Conflict) as err:
        acme.commit(ChangeSet(tenants=[tenant("acme", weight=3.0, version=version)]))
    assert "tenant 'acme'" in err.value.message
    assert expected in err.value.message
    assert acme.load().tenants == [tenant("acme")]


def test_updating_a_missing_row_is_a_conflict(store: Store) -> None:
    with pytest.raises(Conflict, match=r"workload 'w9'.*found no stored row"):
        store.commit(ChangeSet(workloads=[workload("w9", version=2)]))


def test_versions_advance_one_at_a_time(acme: Store) -> None:
    for version in (2, 3, 4):
        acme.commit(ChangeSet(tenants=[tenant("acme", weight=float(version), version=version)]))
    assert acme.load().tenants == [tenant("acme", weight=4.0, version=4)]


def test_deleting_a_tenant_with_live_workloads_is_a_conflict(acme: Store) -> None:
    acme.commit(ChangeSet(quotas=[quota()], workloads=[workload("w1"), workload("w2")]))
    with pytest.raises(
        Conflict, match=r"tenant 'acme' still has non-terminal workloads \(w1, w2\)"
    ):
        acme.commit(ChangeSet(deleted_tenants=["acme"]))
    assert [t.name for t in acme.load().tenants] == ["acme"]


def test_deleting_a_tenant_cascades_to_quotas_and_keeps_history(acme: Store) -> None:
    acme.commit(
        ChangeSet(
            quotas=[quota("acme", "H100-80GB"), quota("acme", "A100-80GB")],
            workloads=[workload("w1")],
            usage_history={"acme": (1.0, at(0))},
        )
    )
    # Ending the last workload and deleting the tenant in one change set is fine.
    acme.commit(
        ChangeSet(
            workloads=[workload("w1", state=WorkloadState.CANCELLED, version=2)],
            deleted_tenants=["acme"],
        )
    )
    state = acme.load()
    assert (state.tenants, state.quotas, state.usage_history) == ([], [], {})
    assert acme.workload("w1") is not None  # history outlives the tenant


def test_deleting_unknown_rows_is_not_found(acme: Store) -> None:
    with pytest.raises(NotFound, match="unknown tenant 'ghost'"):
        acme.commit(ChangeSet(deleted_tenants=["ghost"]))
    with pytest.raises(NotFound, match="unknown quota 'acme/H100-80GB'"):
        acme.commit(ChangeSet(deleted_quotas=[("acme", "H100-80GB")]))


def test_deleting_a_quota(acme: Store) -> None:
    acme.commit(ChangeSet(quotas=[quota("acme", "H100-80GB"), quota("acme", "A100-80GB")]))
    acme.commit(ChangeSet(deleted_quotas=[("acme", "H100-80GB")]))
    assert [q.flavor for q in acme.load().quotas] == ["A100-80GB"]


def test_a_quota_for_an_unknown_tenant_is_rejected(store: Store) -> None:
    with pytest.raises(Conflict, match="rejected"):
        store.commit(ChangeSet(quotas=[quota("ghost")]))
    assert store.load().quotas == []


def test_an_allocation_of_an_unknown_workload_is_not_found(acme: Store) -> None:
    with pytest.raises(NotFound, match="unknown workload 'w-missing'"):
        acme.commit(ChangeSet(allocations=[allocation("a1", "w-missing")]))


def test_an_empty_change_set_is_a_no_op(store: Store) -> None:
    store.commit(ChangeSet())
    assert store.load().tenants == []
