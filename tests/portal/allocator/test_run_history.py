"""The live allocator learns how long each tenant's runs of each kind take, and a queued
workload's status reads its ETA interval from that history when the holders it waits for
declared no end — also after a restart, which reads the history back from the database."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from policies.inventory import Node
from policies.requests import WorkloadKind
from portal.allocator import Allocator
from portal.allocator.memory import run_length
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, wl

Make = Callable[[list[Node]], Allocator]

LENGTHS = (300, 600, 900, 1200, 1500, 1800)


def _tenants(a: Allocator) -> None:
    """team-b may borrow but has no guarantee to reclaim: it waits for team-a's releases."""
    for t, guaranteed in (("team-a", 8), ("team-b", 0)):
        a.set_tenant(t, cohort="c")
        a.set_quota(t, "H100-80GB", guaranteed=guaranteed, limit=8)


def _run_history(a: Allocator, clock: ManualClock) -> None:
    """team-a's jobs, each holding the whole node, without a declared end."""
    for length in LENGTHS:
        job = a.request(wl("team-a", gpus(8), name=f"run{length}", kind=WorkloadKind.JOB))
        assert job.state is WorkloadState.RUNNING
        clock.advance(seconds=length)
        a.release(job.id)
        clock.advance(seconds=1)


def test_a_queued_status_reads_its_interval_from_past_run_lengths(
    make_allocator: Make, clock: ManualClock
) -> None:
    a = make_allocator([hgx("n1")])
    _tenants(a)
    _run_history(a, clock)
    holder = a.request(wl("team-a", gpus(8), name="holder", kind=WorkloadKind.JOB))
    clock.advance(seconds=100)
    answer = a.request(wl("team-b", gpus(1), name="waiter"))
    assert answer.state is WorkloadState.QUEUED
    # The answer to the request carries the declared-ends point alone: nobody declared one.
    assert answer.eta_s is None and answer.eta_low_s is None

    # Runs longer than the holder's 100 s so far: all six; it has 200 / 800 / 1400 s left
    # at p20 / p50 / p80 (nearest rank).
    status = a.status(answer.id)
    assert (status.eta_low_s, status.eta_s, status.eta_high_s) == pytest.approx(
        (500.0, 800.0, 1400.0)
    )
    assert "past run lengths" in status.eta_reason
    (entry,) = a.queue()
    assert (entry.eta_low_s, entry.eta_s, entry.eta_high_s) == pytest.approx((500.0, 800.0, 1400.0))

    restarted = make_allocator([hgx("n1")])
    again = restarted.status(answer.id)
    assert (again.eta_low_s, again.eta_s, again.eta_high_s) == pytest.approx((500.0, 800.0, 1400.0))
    assert restarted.status(holder.id).state is WorkloadState.RUNNING


def test_status_reads_follow_changes_and_the_clock(
    make_allocator: Make, clock: ManualClock
) -> None:
    a = make_allocator([hgx("n1")])
    _tenants(a)
    _run_history(a, clock)
    a.request(wl("team-a", gpus(8), name="holder", kind=WorkloadKind.JOB))
    clock.advance(seconds=100)
    first = a.request(wl("team-b", gpus(1), name="first"))
    second = a.request(wl("team-b", gpus(7), name="second"))
    assert a.status(second.id).eta_reason.startswith("1 workload ahead of you")
    a.release(first.id)  # cancelled: the queue changed at the same instant
    assert a.status(second.id).eta_reason.startswith("nothing ahead of you")

    # The holder has now run 300 s: of the runs that outlived that (600..1800 s) the
    # remaining times are 300 / 900 / 1200 s at p20 / p50 / p80.
    clock.advance(seconds=200)
    later = a.status(second.id)
    assert (later.eta_low_s, later.eta_s, later.eta_high_s) == pytest.approx((300.0, 900.0, 1200.0))


def test_runs_cut_short_from_outside_teach_nothing(
    make_allocator: Make, clock: ManualClock
) -> None:
    a = make_allocator([hgx("n1")])
    a.set_tenant("team-a")
    a.set_quota("team-a", "H100-80GB", guaranteed=8, limit=8)
    job = a.request(wl("team-a", gpus(1), kind=WorkloadKind.JOB))
    clock.advance(seconds=30)
    ended = a.release(job.id)
    assert run_length(ended) == pytest.approx(30.0)
    for reason in ("preempted", "node-lost", "workload-gone", "conflict-at-start"):
        assert run_length(replace(ended, reason=reason)) is None
    assert run_length(replace(ended, started_at=None)) is None
