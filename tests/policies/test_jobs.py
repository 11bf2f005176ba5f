"""Restart rules and rank layout of training jobs (``policies.jobs``): pure, with the
arithmetic shown."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.errors import InvalidRequest
from policies.jobs import (
    JobReason,
    RestartPolicy,
    after_failure,
    after_preemption,
    exit_code_of,
    rank_layout,
)


def test_backoff_doubles_from_backoff_s_up_to_the_cap() -> None:
    p = RestartPolicy(max_restarts=10, backoff_s=5, backoff_cap_s=60)
    # 5, 10, 20, 40, then 80 capped at 60.
    assert [p.delay_s(n) for n in range(1, 7)] == [5, 10, 20, 40, 60, 60]
    assert RestartPolicy(backoff_s=0, backoff_cap_s=0).delay_s(3) == 0
    assert p.delay_s(10_000) == 60  # no overflow


def test_failures_restart_until_max_restarts_then_end_with_backoff_limit() -> None:
    p = RestartPolicy(max_restarts=2, backoff_s=1, backoff_cap_s=10)
    assert after_failure(p, 0, 1).restart and after_failure(p, 0, 1).delay_s == 1
    assert after_failure(p, 1, 1).restart and after_failure(p, 1, 1).delay_s == 2
    last = after_failure(p, 2, 1)
    assert (last.restart, last.reason, last.counted) == (False, JobReason.BACKOFF_LIMIT, True)
    assert after_failure(p, 2, None).reason is JobReason.BACKOFF_LIMIT  # a lost node too


def test_a_listed_exit_code_fails_at_once_and_preemption_never_counts() -> None:
    p = RestartPolicy(max_restarts=5, fail_on_exit_codes=frozenset({2, 3}))
    v = after_failure(p, 0, 3)
    assert (v.restart, v.reason) == (False, JobReason.EXIT_CODE)
    assert after_failure(p, 0, 4).restart
    pre = after_preemption()
    assert (pre.restart, pre.counted, pre.delay_s) == (True, False, 0)


def test_a_death_by_signal_is_128_plus_the_signal() -> None:
    assert exit_code_of(None, 9) == 137
    assert exit_code_of(1, None) == 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_restarts": -1}, "restart.max_restarts"),
        ({"backoff_s": -1}, "restart.backoff_s"),
        ({"backoff_s": 10, "backoff_cap_s": 5}, "restart.backoff_cap_s"),
        ({"fail_on_exit_codes": frozenset({0})}, "restart.fail_on_exit_codes"),
        ({"fail_on_exit_codes": frozenset({256})}, "restart.fail_on_exit_codes"),
    ],
)
def test_bad_restart_policies_name_their_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        RestartPolicy(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


def test_ranks_follow_nodes_by_their_lowest_member() -> None:
    # Members 0 and 2 on a, 1 and 3 on b: a comes first (member 0), ranks 0-1 on a.
    slots = rank_layout([(0, "a"), (1, "b"), (2, "a"), (3, "b")])
    assert [(s.rank, s.member, s.node, s.node_rank, s.local_rank) for s in slots] == [
        (0, 0, "a", 0, 0),
        (1, 2, "a", 0, 1),
        (2, 1, "b", 1, 0),
        (3, 3, "b", 1, 1),
    ]
    assert {s.local_world_size for s in slots} == {2}
    with pytest.raises(InvalidRequest):
        rank_layout([(0, "a"), (0, "b")])


@given(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=64))
def test_every_node_holds_one_interval_of_ranks(nodes: list[str]) -> None:
    slots = rank_layout(list(enumerate(nodes)))
    assert [s.rank for s in slots] == list(range(len(nodes)))
    assert sorted(s.member for s in slots) == list(range(len(nodes)))
    runs = [node for node, _ in itertools.groupby(s.node for s in slots)]
    assert len(runs) == len(set(nodes))  # no node appears in two runs
    for s in slots:
        assert nodes[s.member] == s.node
        assert s.local_world_size == nodes.count(s.node)
