"""``commit_all``: several change sets in one transaction (pipelined on PostgreSQL), each applied
in order, and one refused row anywhere refuses the whole batch with the error ``commit`` gives."""

from __future__ import annotations

import pytest

from policies.errors import Conflict, NotFound
from portal.store.records import ChangeSet, WorkloadState
from portal.store.writer import Store
from tests.portal.store.builders import allocation, at, event, quota, workload


def _first(wid: str = "w1") -> ChangeSet:
    """A decision: a workload started on GPUs 0-1 of node-7, with its event and usage."""
    return ChangeSet(
        quotas=[quota("acme", "H100-80GB", limit=9, version=2)],
        workloads=[workload(wid)],
        allocations=[allocation(f"a-{wid}", wid, (0, 1))],
        events=[event("allocated", workload_id=wid)],
        usage_history={"acme": (2.0, at(1))},
    )


@pytest.fixture
def ready(acme: Store) -> Store:
    """acme with a quota, and workload w0 holding GPU 5 on node-7 (allocation a0)."""
    acme.commit(
        ChangeSet(
            quotas=[quota("acme", "H100-80GB", limit=8)],
            workloads=[workload("w0")],
            allocations=[allocation("a0", "w0", (5,))],
        )
    )
    return acme


def test_later_change_sets_see_the_earlier_ones(ready: Store) -> None:
    """One batch: start w1, then release it and hand its GPU on, then a second version of the
    same quota: each change set on top of the one before, as the allocator decided them."""
    handed_on = ChangeSet(
        workloads=[
            workload("w1", state=WorkloadState.RELEASED, version=2),
            workload("w2"),
        ],
        released=[("a-w1", at(2))],
        allocations=[allocation("a-w2", "w2", (1,))],
        events=[event("released", workload_id="w1"), event("allocated", workload_id="w2")],
        usage_history={"acme": (1.0, at(2))},
    )
    again = ChangeSet(quotas=[quota("acme", "H100-80GB", limit=10, version=3)])
    ready.commit_all([_first(), handed_on, again])
    state = ready.load()
    assert {a.id for a in state.allocations} == {"a0", "a-w2"}
    assert [(q.limit, q.version) for q in state.quotas] == [(10, 3)]
    assert state.usage_history["acme"][0] == 1.0
    assert [e.kind for e in ready.events()] == ["allocated", "released", "allocated"]


@pytest.mark.parametrize("where", ["stale version", "held GPU", "unknown release"])
def test_one_refused_row_refuses_the_whole_batch(ready: Store, where: str) -> None:
    before = ready.load()
    bad = {
        # An UPDATE that matches no row: no database error, the store's own check refuses it.
        "stale version": ChangeSet(quotas=[quota("acme", "H100-80GB", limit=11, version=5)]),
        # The claims' primary key refuses it: a database error in the middle of the batch.
        "held GPU": ChangeSet(
            workloads=[workload("w9")], allocations=[allocation("a9", "w9", (4, 5))]
        ),
        "unknown release": ChangeSet(released=[("no-such-allocation", at(3))]),
    }[where]
    after = ChangeSet(workloads=[workload("w3")], events=[event("queued", workload_id="w3")])
    expected: tuple[type[Exception], str] = {
        "stale version": (Conflict, "stale quota acme/H100-80GB: writing version 5 needs"),
        "held GPU": (Conflict, "GPU 5 on node-7 is already held by allocation 'a0'"),
        "unknown release": (NotFound, "no-such-allocation"),
    }[where]
    with pytest.raises(expected[0], match=expected[1]):
        ready.commit_all([_first(), bad, after])
    assert ready.load() == before
    assert ready.events() == []
    assert ready.workload("w1") is None and ready.workload("w3") is None
    # The store (and its pooled connection) is fine afterwards: the good part commits.
    ready.commit_all([_first(), after])
    assert {a.id for a in ready.load().allocations} == {"a0", "a-w1"}
    assert [e.kind for e in ready.events()] == ["allocated", "queued"]
