"""The job controller with the real local runner: real member processes, pinned, with the
rendezvous environment; a failed member restarts the gang from the newest complete checkpoint,
a preemption sends SIGTERM and frees the devices once the members have checkpointed."""

from __future__ import annotations

import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.jobs import JobState, RestartPolicy
from policies.requests import DeviceRequest
from portal.allocator import Allocator
from portal.jobs.backend import local_backend
from portal.jobs.controller import JobController
from portal.jobs.spec import JobSpec
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import gpus, hgx, wl
from tests.portal.jobs.conftest import H100, LiveJobs

# A member: writes checkpoints step-1..3 (rank 0 marks each complete, after a barrier-free
# write of its own part: enough for the contract's order here), rank 1 fails once in its
# first attempt; on SIGTERM it checkpoints and exits.
SCRIPT = textwrap.dedent(
    """
    import os, pathlib, signal, sys, time
    from portal.jobs.checkpoints import mark_complete, step_path
    rank = int(os.environ["RANK"])
    attempt = os.environ["GPUPORTAL_ATTEMPT"]
    root = pathlib.Path(os.environ["GPUPORTAL_CHECKPOINT_DIR"])
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} attempt {attempt} "
          f"devices {os.environ['CUDA_VISIBLE_DEVICES']} "
          f"resume {os.environ['GPUPORTAL_RESUME_FROM'] or '-'}", flush=True)
    def on_term(signum, frame):
        print(f"rank {rank} got SIGTERM: checkpointing", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    print(f"rank {rank} ready", flush=True)  # the handler is in place from here on
    mode = sys.argv[1]
    if mode == "fail-once":
        for step in (1, 2, 3):
            if rank == 0:
                folder = step_path(root, step)
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "state").write_text(str(step))
                mark_complete(folder)
        if rank == 1 and attempt == "1":
            time.sleep(0.5)
            sys.exit(3)
        time.sleep(0.2 if attempt != "1" else 30)
    elif mode == "short":
        time.sleep(1.5)
    else:
        time.sleep(60)
    """
)


class Local(LiveJobs):
    def spec(self, mode: str, members: int = 2, count: int = 4, tenant: str = "team-a") -> JobSpec:
        script = self.tmp / "member.py"
        script.write_text(SCRIPT)
        return JobSpec(
            tenant=tenant,
            owner="alice",
            name=mode,
            members=members,
            devices=DeviceRequest(FlavorKind.GPU, count=count, models=frozenset({H100})),
            command=(sys.executable, str(script), mode),
            cwd=str(self.tmp),
            env=(("PYTHONPATH", str(Path(__file__).resolve().parents[3])),),
            checkpoint_dir=str(self.tmp / "ckpt"),
            restart=RestartPolicy(max_restarts=1, backoff_s=0, backoff_cap_s=0),
        )


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store)  # the real clock: real processes
    alloc.start([hgx("n1")])
    alloc.set_tenant("team-a", cohort="lab")
    alloc.set_tenant("team-b", cohort="lab")
    alloc.set_quota("team-a", H100, guaranteed=0, limit=8)
    alloc.set_quota("team-b", H100, guaranteed=8, limit=8)
    jobs = JobController(alloc, backend=local_backend(tmp_path / "state"))
    jobs.start()
    yield Local(alloc, jobs, tmp_path)
    for j in jobs.jobs():
        jobs.cancel(j.job.id)
    store.close()


def test_a_failed_member_restarts_the_gang_from_the_newest_complete_checkpoint(
    local: Local,
) -> None:
    jid = local.jobs.submit(local.spec("fail-once")).job.id
    local.until("the job to end", lambda: local.jobs.get(jid).state.terminal)
    j = local.jobs.get(jid)
    assert (j.state, j.restarts) == (JobState.SUCCEEDED, 1)
    first, second = local.jobs.attempts(jid)
    assert (first.exit_reason, first.exit_code, first.counted) == ("exit code 3", 3, True)
    assert (second.exit_reason, second.resume_step) == ("completed", 3)
    # Rank 0 of attempt 1 was still running: the gang was stopped with SIGTERM.
    assert "rank 0 got SIGTERM" in local.log(jid, 1, 0)
    starts = [local.log(jid, 2, rank).splitlines()[0] for rank in (0, 1)]
    assert starts[0].startswith("rank 0 of 2 attempt 2 devices ")
    devices = [line.split(" devices ")[1].split(" ")[0] for line in starts]
    assert sorted(d for ds in devices for d in ds.split(",")) == [str(i) for i in range(8)]
    assert all(line.endswith(str(local.tmp / "ckpt" / "step-3")) for line in starts)
    assert local.alloc.workloads() == []


def test_preemption_sends_sigterm_and_frees_the_devices_once_the_members_ended(
    local: Local,
) -> None:
    jid = local.jobs.submit(local.spec("sleep", members=2, count=4)).job.id
    local.until("it to run", lambda: local.jobs.get(jid).state is JobState.RUNNING)
    # Both handlers must be in place: a SIGTERM before that kills a member without a word.
    local.until(
        "the members to start",
        lambda: all(f"rank {r} ready" in local.log(jid, 1, r) for r in (0, 1)),
    )
    claimant = local.alloc.request(wl("team-b", gpus(8)))
    local.until(
        "the claimant to run",
        lambda: local.alloc.status(claimant.id).state is WorkloadState.RUNNING,
    )
    assert all("got SIGTERM" in local.log(jid, 1, rank) for rank in (0, 1))
    (first, *_rest) = local.jobs.attempts(jid)
    assert (first.exit_reason, first.counted) == ("preempted by team-b reclaim", False)
    # A preempted attempt passes through backoff (no delay: it is not counted) to the queue.
    local.until("it to queue again", lambda: local.jobs.get(jid).state is JobState.QUEUED)
    j = local.jobs.get(jid)
    assert (j.restarts, j.preemptions) == (0, 1)
    local.alloc.release(claimant.id)
    local.until("attempt 2 to run", lambda: local.jobs.get(jid).state is JobState.RUNNING)
    assert local.jobs.get(jid).attempt == 2


def test_a_job_that_finished_while_the_portal_was_down_is_recorded_as_finished(
    local: Local,
) -> None:
    """Members outlive the portal; when they all end before it is back, the restarted
    controller learns how they ended (the runner's exit records) instead of calling the
    attempt lost and running the job again."""
    jid = local.jobs.submit(local.spec("short")).job.id
    local.until("the members to start", lambda: local.jobs.get(jid).state is JobState.RUNNING)
    # The portal goes away (nothing steps the controller) while the members finish.
    time.sleep(3.0)
    again = JobController(local.alloc, backend=local_backend(local.tmp / "state"))
    again.start()
    local.jobs = again
    local.until("the job to end", lambda: again.get(jid).state.terminal)
    j = again.get(jid)
    assert (j.state, j.restarts, j.attempt) == (JobState.SUCCEEDED, 0, 1)
    assert [a.exit_reason for a in again.attempts(jid)] == ["completed"]
