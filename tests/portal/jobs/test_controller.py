"""The job controller over a real allocator and store (SQLite and PostgreSQL), with the
stand-in runner of ``conftest`` (see its docstring: switch to the real runner at merge)."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from dataclasses import replace

import pytest

from policies.errors import Conflict
from policies.jobs import JobState, RestartPolicy, TopologyMode
from policies.requests import TopologyRequirement, WorkloadKind
from portal.jobs.controller import JobController, attempt_key
from portal.store.records import AllocationRecord, WorkloadState
from tests.portal.allocator.conftest import gpus, hgx, wl
from tests.portal.jobs.conftest import H100, Rig, job, make_backend


def used(rig: Rig, tenant: str) -> int:
    return sum(u.used for u in rig.alloc.usage(tenant) if u.flavor == H100)


def test_a_gang_that_does_not_fit_binds_nothing_holds_no_quota_and_says_why(rig: Rig) -> None:
    # n4 cordoned: room for 3 of the 4 members (quota would allow all 4).
    rig.alloc.node_updated(replace(hgx("n4", "r2"), schedulable=False))
    view = rig.jobs.submit(job(members=4, gpus=8))
    for _ in range(30):  # 30 s of ticks
        rig.advance(1)
        view = rig.jobs.view(view.job.id)
        assert view.job.state is JobState.QUEUED
        assert view.workload is not None and view.workload.state is WorkloadState.QUEUED
        assert view.workload.allocations == ()
        assert view.workload.reason == "capacity"
        assert used(rig, "team-a") == 0
        assert rig.runner.launched == []
    assert view.workload is not None and view.workload.kind == WorkloadKind.JOB.value
    assert rig.alloc.allocations() == []
    rig.alloc.node_updated(hgx("n4", "r2"))
    rig.step()
    view = rig.jobs.view(view.job.id)
    assert view.job.state is JobState.RUNNING
    assert used(rig, "team-a") == 32
    (launched,) = rig.runner.launched
    assert sorted(m.rank for m in launched) == [0, 1, 2, 3]


def test_ranks_are_contiguous_per_node_and_pinned_to_their_devices(rig: Rig) -> None:
    view = rig.jobs.submit(job(members=4, gpus=4))
    rig.step()
    (launched,) = rig.runner.launched
    by_rank = sorted(launched, key=lambda m: m.rank)
    nodes = [m.node for m in by_rank]
    # Each node's ranks form one interval: the node changes at most (nodes - 1) times.
    changes = sum(1 for a, b in itertools.pairwise(nodes) if a != b)
    assert changes == len(set(nodes)) - 1
    assert Counter(nodes) == Counter(dict.fromkeys(set(nodes), 2))
    for node in set(nodes):
        devices = [d for m in by_rank if m.node == node for d in m.devices]
        assert len(devices) == len(set(devices)) == 8
    held = {(a.node, tuple(str(g) for g in a.gpus)) for a in view_allocations(rig, view.job.id)}
    assert {(m.node, m.devices) for m in launched} == held
    assert all(m.env["EPOCHS"] == "3" and m.env["WORLD_SIZE"] == "4" for m in launched)
    assert all(m.command == ("python", "train.py") and m.cwd == "/work" for m in launched)
    attempt = rig.jobs.attempts(view.job.id)[0]
    assert list(attempt.nodes) == list(dict.fromkeys(nodes))
    assert attempt.queue_wait_s == 0


def view_allocations(rig: Rig, job_id: str) -> tuple[AllocationRecord, ...]:
    w = rig.jobs.view(job_id).workload
    assert w is not None
    return w.allocations


def test_failures_restart_after_backoff_from_the_checkpoint_until_the_backoff_limit(
    rig: Rig,
) -> None:
    jid = rig.jobs.submit(job(members=2, gpus=8, checkpoint_dir=str(rig.ckpt))).job.id
    rig.step()
    rig.checkpoint(40)
    delays = []
    for attempt in (1, 2, 3):
        assert rig.jobs.get(jid).state is JobState.RUNNING
        rig.runner.exit(jid, attempt, 1, 137)
        rig.step()
        j = rig.jobs.get(jid)
        # The whole gang was stopped and released.
        assert rig.runner.stops[-1][:2] == (jid, attempt)
        assert rig.runner.running.get((jid, attempt), set()) == set()
        assert used(rig, "team-a") == 0
        if attempt == 3:
            break
        assert j.state is JobState.BACKOFF
        assert j.next_start_at is not None
        delays.append((j.next_start_at - rig.clock.now).total_seconds())
        rig.advance(delays[-1] - 1)
        assert rig.jobs.get(jid).state is JobState.BACKOFF  # not before its backoff
        rig.advance(1)
    assert delays == [5, 8]  # 5, then 10 capped at 8
    j = rig.jobs.get(jid)
    assert j.state is JobState.FAILED and j.reason == "backoff_limit"
    assert j.restarts == 2
    history = rig.jobs.attempts(jid)
    assert [a.exit_reason for a in history] == ["exit code 137", "exit code 137", "backoff limit"]
    assert [a.exit_code for a in history] == [137, 137, 137]
    assert [a.resume_step for a in history] == [None, 40, 40]
    assert all(a.counted for a in history)
    # Never recreated.
    for _ in range(5):
        rig.advance(60)
    assert len(rig.jobs.attempts(jid)) == 3
    assert len(rig.runner.launched) == 3
    assert not [w for w in rig.alloc.workloads() if w.tenant == "team-a"]


def test_relaunched_members_get_resume_from(rig: Rig) -> None:
    step7 = rig.checkpoint(7)
    rig.jobs.submit(job(members=1, gpus=1, checkpoint_dir=str(rig.ckpt)))
    rig.step()
    assert rig.runner.launched[0][0].env["GPUPORTAL_RESUME_FROM"] == str(step7)


def test_an_exit_code_listed_to_fail_ends_the_job_at_once(rig: Rig) -> None:
    policy = RestartPolicy(
        max_restarts=5, backoff_s=1, backoff_cap_s=1, fail_on_exit_codes=frozenset({2})
    )
    jid = rig.jobs.submit(job(members=2, gpus=1, restart=policy)).job.id
    rig.step()
    rig.runner.exit(jid, 1, 0, 2)
    rig.step()
    j = rig.jobs.get(jid)
    assert (j.state, j.reason) == (JobState.FAILED, "exit_code")
    assert [a.exit_reason for a in rig.jobs.attempts(jid)] == ["exit code 2"]


def test_a_job_completes_when_every_member_exits_0(rig: Rig) -> None:
    jid = rig.jobs.submit(job(members=2, gpus=1)).job.id
    rig.step()
    rig.runner.exit(jid, 1, 0, 0)
    rig.step()
    assert rig.jobs.get(jid).state is JobState.RUNNING  # one member still runs
    rig.runner.exit(jid, 1, 1, 0)
    rig.step()
    j = rig.jobs.get(jid)
    assert (j.state, j.reason) == (JobState.SUCCEEDED, "completed")
    assert rig.jobs.attempts(jid)[0].exit_reason == "completed"
    assert used(rig, "team-a") == 0


def test_preemption_stops_with_the_grace_and_does_not_count(rig: Rig) -> None:
    # team-a borrows all 32 GPUs; team-b then reclaims its guaranteed 16.
    policy = RestartPolicy(max_restarts=0, backoff_s=0, backoff_cap_s=0)
    jid = rig.jobs.submit(job(members=4, gpus=8, restart=policy)).job.id
    rig.step()
    assert rig.jobs.get(jid).state is JobState.RUNNING
    claimant = rig.alloc.request(wl("team-b", gpus(8), gang=2))
    assert claimant.state is WorkloadState.QUEUED
    rig.step()
    job_id, attempt, grace = rig.runner.stops[-1]
    assert (job_id, attempt) == (jid, 1)
    assert grace == rig.alloc.grace_for("job").total_seconds()
    j = rig.jobs.get(jid)
    assert (j.restarts, j.preemptions) == (0, 1)
    first = rig.jobs.attempts(jid)[0]
    assert first.exit_reason == "preempted by team-b reclaim"
    assert not first.counted
    # The claimant gets the devices; the job waits as attempt 2 and runs once they are back.
    assert rig.alloc.status(claimant.id).state is WorkloadState.RUNNING
    assert j.state is JobState.BACKOFF and j.next_start_at == rig.clock.now
    rig.step()
    j = rig.jobs.get(jid)
    assert j.state is JobState.QUEUED and j.attempt == 2
    rig.alloc.release(claimant.id)
    rig.step()
    assert rig.jobs.get(jid).state is JobState.RUNNING
    # With max_restarts 0 the preemption used nothing: the first failure ends it.
    rig.runner.exit(jid, 2, 3, 1)
    rig.step()
    j = rig.jobs.get(jid)
    assert (j.state, j.reason, j.restarts) == (JobState.FAILED, "backoff_limit", 0)


def test_a_lost_node_stops_the_gang_and_requeues(rig: Rig) -> None:
    jid = rig.jobs.submit(job(members=2, gpus=8)).job.id
    rig.step()
    node = rig.jobs.attempts(jid)[0].nodes[0]
    rig.alloc.node_removed(node)
    rig.step()
    j = rig.jobs.get(jid)
    assert j.state is JobState.BACKOFF and j.restarts == 1
    first = rig.jobs.attempts(jid)[0]
    assert (first.exit_reason, first.counted) == ("node lost", True)
    assert rig.runner.stops[-1] == (jid, 1, 0.0)
    rig.advance(5)
    again = rig.jobs.get(jid)
    assert again.state is JobState.RUNNING
    assert node not in rig.jobs.attempts(jid)[1].nodes


def test_cancel_stops_the_members_and_releases(rig: Rig) -> None:
    running = rig.jobs.submit(job(members=2, gpus=8)).job.id
    waiting = rig.jobs.submit(job(members=4, gpus=8)).job.id
    rig.step()
    assert rig.jobs.get(waiting).state is JobState.QUEUED
    for jid in (running, waiting):
        view = rig.jobs.cancel(jid)
        assert view.job.state is JobState.CANCELLED
        assert view.workload is not None and view.workload.state.terminal
        assert rig.jobs.attempts(jid)[-1].exit_reason == "cancelled"
    assert rig.runner.stops == [(running, 1, 10.0)]
    assert used(rig, "team-a") == 0
    assert rig.jobs.cancel(running).job.state is JobState.CANCELLED  # idempotent


def test_required_topology_waits_and_preferred_relaxes_and_says_so(rig: Rig) -> None:
    # Two free nodes in two racks: same-rack for 2 x 8 does not fit.
    rig.alloc.node_updated(replace(hgx("n2", "r1"), schedulable=False))
    rig.alloc.node_updated(replace(hgx("n3", "r2"), schedulable=False))
    free_racks = {s.node.rack for s in rig.alloc.inspect(lambda c: list(c)) if s.schedulable}
    assert len(free_racks) == 2
    strict = rig.jobs.submit(job(members=2, gpus=8, topology=TopologyRequirement.SAME_RACK))
    rig.step()
    view = rig.jobs.view(strict.job.id)
    assert view.job.state is JobState.QUEUED
    assert view.workload is not None and view.workload.reason == "topology"
    rig.jobs.cancel(strict.job.id)
    loose = rig.jobs.submit(
        job(
            members=2,
            gpus=8,
            topology=TopologyRequirement.SAME_RACK,
            mode=TopologyMode.PREFERRED,
        )
    )
    rig.step()
    view = rig.jobs.view(loose.job.id)
    assert view.job.state is JobState.RUNNING and view.job.topology_relaxed
    assert "same-rack (preferred) does not fit" in view.job.message
    assert rig.jobs.attempts(loose.job.id)[0].topology == "any"


def test_a_restarted_portal_adopts_running_members_or_requeues_lost_ones(rig: Rig) -> None:
    kept = rig.jobs.submit(job(members=1, gpus=8)).job.id
    lost = rig.jobs.submit(job(members=1, gpus=8)).job.id
    rig.step()
    rig.runner.adoptable = [(kept, 1)]
    again = JobController(rig.alloc, backend=make_backend(rig.runner))
    again.start()
    assert again.get(kept).state is JobState.RUNNING
    j = again.get(lost)
    assert (j.state, j.restarts, j.preemptions) == (JobState.BACKOFF, 0, 1)
    assert again.attempts(lost)[0].exit_reason == "members gone while the portal restarted"


def test_a_failed_launch_counts_and_releases(rig: Rig) -> None:
    rig.runner.fail_next_launch = True
    jid = rig.jobs.submit(job(members=2, gpus=8)).job.id
    j = rig.jobs.get(jid)
    assert j.state is JobState.BACKOFF and j.restarts == 1
    assert rig.jobs.attempts(jid)[0].exit_reason == "launch failed: no such program"
    assert used(rig, "team-a") == 0


def test_jobs_placed_together_launch_at_once_and_each_is_taken_once(rig: Rig) -> None:
    rig.runner.launch_concurrency = 4
    # Each launch waits until three are in flight: one after another, the barrier breaks.
    rig.runner.launch_gate = threading.Barrier(3)
    ids = ["batch-0", "batch-1", "batch-2"]
    results = rig.jobs.enqueue_many(
        [(job(members=1, gpus=8), i) for i in ids] + [(job(members=1, gpus=8), "batch-0")]
    )

    *taken, again = results
    assert [r.id for r in taken if not isinstance(r, Exception)] == ids
    assert isinstance(again, Conflict) and "batch-0" in again.message
    assert sorted(m[0].job_id for m in rig.runner.launched) == ids
    for i in ids:
        assert rig.jobs.get(i).state is JobState.RUNNING
        (attempt,) = rig.jobs.attempts(i)
        assert attempt.started_at is not None and attempt.world_size == 1
    assert used(rig, "team-a") == 24
    assert len(rig.jobs.jobs()) == 3


def test_a_failed_launch_among_concurrent_ones_ends_only_its_own_attempt(rig: Rig) -> None:
    rig.runner.launch_concurrency = 4
    rig.runner.fail_jobs = {"b"}
    rig.jobs.enqueue_many([(job(members=1, gpus=8), i) for i in ("a", "b", "c")])

    assert [rig.jobs.get(i).state for i in ("a", "b", "c")] == [
        JobState.RUNNING,
        JobState.BACKOFF,
        JobState.RUNNING,
    ]
    assert rig.jobs.attempts("b")[0].exit_reason == "launch failed: no such program"
    assert used(rig, "team-a") == 16
    # The jobs loop launches what it finds placed the same way: b's next attempt, alone.
    rig.runner.fail_jobs = set()
    rig.advance(10)
    assert rig.jobs.get("b").state is JobState.RUNNING and rig.jobs.get("b").attempt == 2
    assert used(rig, "team-a") == 24


@pytest.mark.parametrize("members", [1, 3])
def test_nodes_added_later_are_used(rig: Rig, members: int) -> None:
    rig.alloc.node_added(hgx("n5", "r3"))
    jid = rig.jobs.submit(job(members=members, gpus=8)).job.id
    rig.step()
    assert rig.jobs.get(jid).state is JobState.RUNNING


def test_gpu_hours_add_up_the_attempts(rig: Rig) -> None:
    jid = rig.jobs.submit(job(members=2, gpus=8)).job.id
    rig.step()
    rig.clock.advance(seconds=1800)  # 16 GPUs for half an hour: 8 GPU-hours
    assert rig.jobs.gpu_hours(jid) == pytest.approx(8)
    rig.runner.exit(jid, 1, 0, 1)
    rig.step()
    rig.advance(5)  # backoff, then attempt 2 runs another quarter hour
    rig.clock.advance(seconds=900)
    rig.runner.exit(jid, 2, 0, 0)
    rig.runner.exit(jid, 2, 1, 0)
    rig.step()
    rig.clock.advance(seconds=3600)  # ended: no more hours
    assert rig.jobs.gpu_hours(jid) == pytest.approx(8 + 4)


def test_a_stopped_attempt_keeps_its_devices_until_its_members_have_ended(rig: Rig) -> None:
    rig.runner.stop_ends_members = False  # the script checkpoints before it exits
    jid = rig.jobs.submit(job(members=4, gpus=8)).job.id
    rig.step()
    claimant = rig.alloc.request(wl("team-b", gpus(8), gang=2))
    rig.step()
    assert rig.runner.stops[-1][:2] == (jid, 1)
    assert rig.jobs.attempts(jid)[0].exit_reason == "preempted by team-b reclaim"
    # Still checkpointing: nothing else may start on its GPUs.
    for _ in range(3):
        rig.advance(1)
        assert used(rig, "team-a") == 32
        assert rig.alloc.status(claimant.id).state is WorkloadState.QUEUED
    for rank in range(4):
        rig.runner.exit(jid, 1, rank, 143)
    rig.step()
    assert rig.alloc.status(claimant.id).state is WorkloadState.RUNNING
    j = rig.jobs.get(jid)
    assert (j.restarts, j.preemptions) == (0, 1)  # the SIGTERM exits are not failures


def test_members_that_never_end_give_their_devices_back_after_the_grace(rig: Rig) -> None:
    rig.runner.stop_ends_members = False
    jid = rig.jobs.submit(job(members=2, gpus=8)).job.id
    rig.step()
    view = rig.jobs.cancel(jid)
    assert view.job.state is JobState.CANCELLED  # at once, and never restarted
    rig.advance(10)  # the stop grace
    assert used(rig, "team-a") == 16
    rig.advance(16)  # and the margin for the SIGKILL to be reported
    assert used(rig, "team-a") == 0


def test_a_restart_while_members_stop_drains_or_releases(rig: Rig) -> None:
    rig.runner.stop_ends_members = False
    still = rig.jobs.submit(job(members=1, gpus=8)).job.id
    gone = rig.jobs.submit(job(members=1, gpus=8)).job.id
    rig.step()
    rig.jobs.cancel(still)
    rig.jobs.cancel(gone)
    assert used(rig, "team-a") == 16
    rig.runner.adoptable = [(still, 1)]  # gone's member died with the portal
    again = JobController(rig.alloc, backend=make_backend(rig.runner))
    again.start()
    assert used(rig, "team-a") == 8
    rig.runner.exit(still, 1, 0, 143)
    again.step()
    assert used(rig, "team-a") == 0


def test_the_first_member_to_fail_is_the_cause(rig: Rig) -> None:
    jid = rig.jobs.submit(job(members=2, gpus=8)).job.id
    rig.step()
    # Rank 1 is killed; rank 0's collective then fails: both seen in one round.
    rig.runner.exit(jid, 1, 1, 137)
    rig.runner.exit(jid, 1, 0, 1)
    rig.step()
    first = rig.jobs.attempts(jid)[0]
    assert (first.exit_reason, first.exit_code) == ("exit code 137", 137)
    assert "rank 1 exited 137" in rig.jobs.get(jid).message


def test_an_attempt_the_portal_died_before_recording_is_released_at_start(rig: Rig) -> None:
    # What a controller killed between its request and its commit leaves: the workload of an
    # attempt no job records, found by its key; a kind-job workload asked for directly stays.
    orphan = rig.alloc.request(
        wl("team-a", gpus(4), kind=WorkloadKind.JOB), idempotency_key=attempt_key("j-gone", 1)
    )
    direct = rig.alloc.request(wl("team-a", gpus(2), kind=WorkloadKind.JOB))
    assert used(rig, "team-a") == 6
    again = JobController(rig.alloc, backend=make_backend(rig.runner))
    again.start()
    assert rig.alloc.status(orphan.id).state is WorkloadState.RELEASED
    assert rig.alloc.status(orphan.id).reason == "job not recorded"
    assert rig.alloc.status(direct.id).state is WorkloadState.RUNNING
    # The controller asks with that key itself: a retried request finds the same workload.
    jid = rig.jobs.submit(job(members=1, gpus=1)).job.id
    (first,) = rig.jobs.attempts(jid)
    owner = rig.jobs.get(jid).owner
    same = rig.alloc.request(
        wl("team-a", gpus(1), owner=owner, kind=WorkloadKind.JOB),
        idempotency_key=attempt_key(jid, 1),
    )
    assert same.id == first.workload_id
