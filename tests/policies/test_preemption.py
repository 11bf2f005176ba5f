"""Victim selection: cheapest first, then minimal; notices by workload kind."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.errors import InvalidRequest
from policies.preemption import (
    PreemptionAction,
    PreemptionNotice,
    PreemptionPolicy,
    RunningItem,
    select_victims,
)
from policies.requests import WorkloadKind

F = "H100-80GB"


def run(
    wid: str, tenant: str, amount: int, priority: int = 0, started: float = 0.0, seq: int = 0
) -> RunningItem:
    return RunningItem(wid, tenant, F, amount, priority, started, borrowed=amount, seq=seq)


@pytest.mark.parametrize(
    ("candidates", "need", "expected"),
    [
        # Lowest priority first: p-1 (1) covers 1.
        ([run("hi", "b", 1, 5), run("lo", "b", 1, -1)], {"b": 1}, ["lo"]),
        # Same priority: youngest first (started 20 > 10).
        ([run("old", "b", 1, 0, 10.0), run("young", "b", 1, 0, 20.0)], {"b": 1}, ["young"]),
        # Started together (one scheduling cycle): the latest requested first, whatever the
        # ids say ("a" < "z" would pick "a" if the id decided).
        ([run("z", "b", 1, 0, 5.0, seq=1), run("a", "b", 1, 0, 5.0, seq=2)], {"b": 1}, ["a"]),
        # A later start beats a later request: started 6 (seq 1) before started 5 (seq 9).
        ([run("s5", "b", 1, 0, 5.0, seq=9), run("s6", "b", 1, 0, 6.0, seq=1)], {"b": 1}, ["s6"]),
        # Order a(1), b(1), c(4) reaches 1 + 1 + 4 = 6 >= 4 at c; sparing b leaves 5 >= 4,
        # then sparing a leaves 4 >= 4: only c.
        ([run("a", "b", 1, 0), run("b", "b", 1, 1), run("c", "b", 4, 2)], {"b": 4}, ["c"]),
        # Need 3 from 2+2: both are needed (2 < 3).
        ([run("x", "b", 2, 0), run("y", "b", 2, 1)], {"b": 3}, ["x", "y"]),
        # Two tenants, listed by tenant name; other flavors and tenants are ignored.
        (
            [
                run("c1", "c", 2),
                run("b1", "b", 1),
                RunningItem("gpu2", "b", "A100-80GB", 8, -9, 0.0),
                run("z1", "z", 9, -9),
            ],
            {"c": 2, "b": 1},
            ["b1", "c1"],
        ),
        # Not enough: None.
        ([run("x", "b", 2)], {"b": 3}, None),
        ([], {"b": 1}, None),
        # Nothing needed: nothing chosen.
        ([run("x", "b", 2)], {"b": 0}, []),
    ],
)
def test_select_victims(
    candidates: list[RunningItem], need: dict[str, int], expected: list[str] | None
) -> None:
    assert select_victims(candidates, need, F) == expected


items = st.builds(
    RunningItem,
    workload_id=st.uuids().map(str),
    tenant=st.sampled_from(["a", "b", "c"]),
    flavor=st.sampled_from([F, "T4/share"]),
    amount=st.integers(0, 8),
    priority=st.integers(-2, 2),
    started_at=st.floats(0, 100),
    borrowed=st.integers(0, 8),
    seq=st.integers(0, 20),
)


@given(
    candidates=st.lists(items, max_size=12, unique_by=lambda i: i.workload_id),
    need=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 20)),
)
def test_victims_sufficient_and_minimal(
    candidates: list[RunningItem], need: dict[str, int]
) -> None:
    got = select_victims(candidates, need, F)
    eligible = {t: [i for i in candidates if i.tenant == t and i.flavor == F] for t in need}
    if got is None:
        assert any(sum(i.amount for i in eligible[t]) < n for t, n in need.items())
        return
    by_id = {i.workload_id: i for i in candidates}
    assert len(set(got)) == len(got)
    for t, n in need.items():
        chosen = [by_id[w] for w in got if by_id[w].tenant == t]
        assert all(i.flavor == F for i in chosen)
        total = sum(i.amount for i in chosen)
        assert total >= max(n, 0)  # sufficient
        for i in chosen:  # minimal: every victim is needed
            assert total - i.amount < n
    assert all(by_id[w].tenant in need for w in got)


@given(
    amounts=st.lists(st.integers(1, 6), min_size=1, max_size=7),
    n=st.integers(1, 20),
)
def test_no_proper_subset_suffices(amounts: list[int], n: int) -> None:
    candidates = [run(f"w{k}", "b", a, priority=k) for k, a in enumerate(amounts)]
    got = select_victims(candidates, {"b": n}, F)
    if got is None:
        assert sum(amounts) < n
        return
    chosen = [c.amount for c in candidates if c.workload_id in got]
    for r in range(len(chosen)):
        for subset in itertools.combinations(chosen, r):
            assert sum(subset) < n


def test_notices_by_kind() -> None:
    policy = PreemptionPolicy()
    assert policy.notice("nb", WorkloadKind.NOTEBOOK, 100.0) == PreemptionNotice(
        "nb", WorkloadKind.NOTEBOOK, PreemptionAction.WARN, 300.0, 400.0
    )
    job = policy.notice("j", WorkloadKind.JOB, 100.0, "reclaimed by team-a")
    assert (job.action, job.grace_s, job.deadline_at, job.reason) == (
        PreemptionAction.SIGNAL,
        120.0,
        220.0,
        "reclaimed by team-a",
    )
    assert PreemptionPolicy(job_grace_s=0).notice("j", WorkloadKind.JOB, 5.0).deadline_at == 5.0
    assert policy.notice("s", WorkloadKind.INFERENCE, 0.0).action is PreemptionAction.DRAIN


@pytest.mark.parametrize("grace", [-1, 86_401, True, "300"])
def test_bad_grace(grace: object) -> None:
    with pytest.raises(
        InvalidRequest, match=r"notebook_grace_s .*expected seconds from 0 to 86400"
    ):
        PreemptionPolicy(notebook_grace_s=grace)  # type: ignore[arg-type]


@given(
    starts=st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=1, max_size=8),
    warm=st.lists(st.booleans(), min_size=8, max_size=8),
    n=st.integers(1, 8),
)
def test_replicas_of_a_service_go_warm_first_then_newest_first(
    starts: list[float], warm: list[bool], n: int
) -> None:
    """One service's replicas (one device each, requested in order ``seq``, started at
    ``starts``; warm ones at the pool's priority -1000): the ``n`` victims are exactly the
    first ``n`` in the order warm first, then latest started, then latest requested."""
    replicas = [
        run(f"r{k}", "b", 1, -1000 if warm[k] else 0, started, seq=k + 1)
        for k, started in enumerate(starts)
    ]
    got = select_victims(replicas, {"b": n}, F)
    if n > len(replicas):
        assert got is None
        return
    expected = sorted(
        replicas, key=lambda r: (not warm[int(r.workload_id[1:])], -r.started_at, -r.seq)
    )
    assert got == [r.workload_id for r in expected[:n]]
