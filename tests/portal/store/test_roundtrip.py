"""Every record type survives a commit and a read back unchanged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from policies.errors import InvalidRequest
from portal.store.records import ChangeSet, WorkloadState
from portal.store.writer import Store
from tests.portal.store.builders import (
    allocation,
    at,
    event,
    mig,
    quota,
    share,
    tenant,
    workload,
)


def test_every_record_round_trips(store: Store) -> None:
    t = tenant("acme", cohort="research", weight=2.5, pools=("a100", "h100"))
    q = quota("acme", "H100-80GB/3g.40gb", guaranteed=2, limit=7, budget_gpu_hours=120.5)
    w = workload(
        "w1",
        request={"members": [{"kind": "mig", "profile": "3g.40gb"}], "nested": {"x": [1, 2.5]}},
        gang_size=2,
        priority=7,
        state=WorkloadState.PREEMPTING,
        reason="borrowed",
        message="grace until 12:30",
        idempotency_key="spawn-1",
        started_at=at(1),
        expected_duration_s=3600.0,
        preempt_deadline=at(30),
    )
    a = allocation(
        "a1",
        "w1",
        (2, 3),
        gpu_uuids=("GPU-aa", "GPU-bb"),
        gpu_memory_mib=81920,
        cpu_milli=8000,
        memory_mib=65536,
        borrowed=True,
        created_at=at(1),
    )
    m = mig("a2", "w1", 4, "3g.40gb", 4)
    s = share("a3", "w1", 5, 250)
    e = event("allocated", 1, data={"gpus": [2, 3], "score": 97.5})
    store.commit(
        ChangeSet(
            tenants=[t],
            quotas=[q],
            workloads=[w],
            allocations=[a, m, s],
            events=[e],
            usage_history={"acme": (12.25, at(2))},
        )
    )

    state = store.load()
    assert state.tenants == [t]
    assert state.quotas == [q]
    assert state.workloads == [w]
    by_id = {x.id: x for x in state.allocations}
    assert by_id == {"a1": a, "a2": m, "a3": s}
    assert state.usage_history == {"acme": (12.25, at(2))}
    assert store.events() == [e]
    assert store.workload("w1") == w
    assert store.workload_by_idempotency_key("acme", "ada", "spawn-1") == w


def test_timestamps_come_back_aware_utc_whatever_zone_went_in(store: Store) -> None:
    paris = timezone(timedelta(hours=1))
    store.commit(
        ChangeSet(
            tenants=[tenant()],
            workloads=[workload(created_at=datetime(2025, 3, 1, 13, 0, tzinfo=paris))],
        )
    )
    got = store.workload("w1")
    assert got is not None
    assert got.created_at == datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    assert got.created_at.tzinfo is UTC


def test_naive_timestamp_is_rejected_and_changes_nothing(store: Store) -> None:
    with pytest.raises(InvalidRequest, match="timezone-aware"):
        store.commit(
            ChangeSet(tenants=[tenant()], workloads=[workload(created_at=datetime(2025, 3, 1))])
        )
    assert store.load().tenants == []


def test_allocation_without_created_at_gets_the_commit_time(acme: Store) -> None:
    before = datetime.now(UTC)
    acme.commit(ChangeSet(workloads=[workload()], allocations=[allocation(created_at=None)]))
    (a,) = acme.load().allocations
    assert a.created_at is not None
    assert before <= a.created_at <= datetime.now(UTC)


def test_load_skips_terminal_workloads_and_released_allocations(acme: Store) -> None:
    acme.commit(
        ChangeSet(
            workloads=[workload("w1"), workload("w2"), workload("w3", state=WorkloadState.QUEUED)],
            allocations=[allocation("a1", "w1", (0,)), allocation("a2", "w2", (1,))],
        )
    )
    acme.commit(
        ChangeSet(
            workloads=[workload("w2", state=WorkloadState.RELEASED, ended_at=at(5), version=2)],
            released=[("a2", at(5))],
        )
    )
    state = acme.load()
    assert [w.id for w in state.workloads] == ["w1", "w3"]
    assert [a.id for a in state.allocations] == ["a1"]
    released = acme.workload("w2")
    assert released is not None and released.state is WorkloadState.RELEASED


def test_events_since_and_limit_in_commit_order(acme: Store) -> None:
    acme.commit(ChangeSet(events=[event("e0", 0), event("e1", 1)]))
    acme.commit(ChangeSet(events=[event("e2", 2), event("e3", 3, tenant="other")]))
    assert [e.kind for e in acme.events()] == ["e0", "e1", "e2", "e3"]
    assert [e.kind for e in acme.events(since=at(1))] == ["e1", "e2", "e3"]
    assert [e.kind for e in acme.events(since=at(1), limit=2)] == ["e1", "e2"]
    assert [e.kind for e in acme.events(tenant="other")] == ["e3"]


def test_allocations_between_includes_released_ones_that_overlap(acme: Store) -> None:
    acme.commit(
        ChangeSet(
            workloads=[workload()],
            allocations=[
                allocation("early", gpus=(0,), created_at=at(0)),
                allocation("spans", gpus=(1,), created_at=at(5)),
                allocation("open", gpus=(2,), created_at=at(20)),
                allocation("late", gpus=(3,), created_at=at(60)),
            ],
        )
    )
    acme.commit(ChangeSet(released=[("early", at(10)), ("spans", at(40))]))
    got = acme.allocations_between(at(10), at(30))
    # "early" ended exactly when the window starts, "late" starts after it ends.
    assert [a.id for a in got] == ["spans", "open"]
    assert got[0].released_at == at(40)
    assert got[1].released_at is None


def test_usage_history_is_upserted(acme: Store) -> None:
    acme.commit(ChangeSet(usage_history={"acme": (1.0, at(0)), "beta": (2.0, at(0))}))
    acme.commit(ChangeSet(usage_history={"acme": (0.5, at(10))}))
    assert acme.load().usage_history == {"acme": (0.5, at(10)), "beta": (2.0, at(0))}


def test_meta_records_schema_and_app_version(store: Store) -> None:
    meta = store.meta()
    assert meta["schema_version"] == "1"
    assert meta["app_version"]


def test_unknown_workload_is_none(store: Store) -> None:
    assert store.workload("nope") is None
    assert store.workload_by_idempotency_key("acme", "ada", "nope") is None
