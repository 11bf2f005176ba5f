"""The real training job through the whole job path: examples/train/train.py (JAX, gloo over
loopback) submitted as a 2-member job to the job controller over a real allocator and store,
run by the local runner. Killing one member restarts the gang from the newest complete
checkpoint within 10 s, and the attempt history says why."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.jobs import JobState, RestartPolicy
from policies.requests import DeviceRequest
from portal.allocator import Allocator
from portal.jobs.backend import local_backend
from portal.jobs.checkpoints import newest_complete_checkpoint
from portal.jobs.controller import JobController
from portal.jobs.spec import JobSpec
from portal.store.writer import Store
from tests.portal.allocator.conftest import hgx
from tests.portal.jobs.conftest import H100, LiveJobs
from tests.portal.jobs.test_example_train import EVERY, EXAMPLE, RESUMED, START_S, STEPS

pytestmark = pytest.mark.slow


Train = LiveJobs


@pytest.fixture
def train(tmp_path: Path) -> Iterator[Train]:
    if importlib.util.find_spec("jax") is None:
        pytest.fail("examples/train needs jax: install the dev extra (pip install -e '.[dev]')")
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store)
    alloc.start([hgx("n1")])
    alloc.set_tenant("team-a")
    alloc.set_quota("team-a", H100, guaranteed=8, limit=8)
    jobs = JobController(alloc, backend=local_backend(tmp_path / "state"))
    jobs.start()
    yield Train(alloc, jobs, tmp_path)
    for j in jobs.jobs():
        jobs.cancel(j.job.id)
    store.close()


def test_killing_a_member_restarts_both_from_the_last_complete_checkpoint(train: Train) -> None:
    spec = JobSpec(
        tenant="team-a",
        owner="alice",
        name="train",
        members=2,
        devices=DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({H100})),
        command=(
            sys.executable,
            str(EXAMPLE),
            f"--steps={STEPS}",
            f"--checkpoint-every={EVERY}",
            "--step-seconds=0.05",
        ),
        cwd=str(train.tmp),
        env=(("JAX_PLATFORMS", "cpu"), ("GPUPORTAL_TEST_RUN", str(train.tmp))),
        checkpoint_dir=str(train.tmp / "ckpt"),
        restart=RestartPolicy(max_restarts=2, backoff_s=0, backoff_cap_s=0),
    )
    jid = train.jobs.submit(spec).job.id

    def checkpoints(attempt: int) -> list[int]:
        found = re.findall(r"checkpoint step (\d+)", train.log(jid, attempt, 0))
        return [int(s) for s in found]

    train.until("two checkpoints", lambda: len(checkpoints(1)) >= 2, START_S)
    pid = re.search(r"pid (\d+)", train.log(jid, 1, 1))
    assert pid, train.log(jid, 1, 1)
    os.kill(int(pid.group(1)), signal.SIGKILL)
    killed = time.monotonic()
    train.until("attempt 2 to run", lambda: train.jobs.get(jid).attempt == 2, 10)
    train.until(
        "attempt 2's members to start",
        lambda: train.jobs.get(jid).state is JobState.RUNNING,
        10 - (time.monotonic() - killed),
    )
    relaunched_s = time.monotonic() - killed
    first = train.jobs.attempts(jid)[0]
    assert (first.exit_reason, first.exit_code, first.counted) == ("exit code 137", 137, True)
    last_written = max(checkpoints(1))
    second = train.jobs.attempts(jid)[1]
    assert second.resume_step is not None and second.resume_step >= last_written > 0

    def resumed() -> list[int]:
        found = [re.search(RESUMED, train.log(jid, 2, rank)) for rank in (0, 1)]
        return [int(m.group(1)) for m in found if m]

    train.until("both members resumed", lambda: len(resumed()) == 2, START_S)
    assert resumed() == [second.resume_step, second.resume_step]
    print(f"both members relaunched {relaunched_s:.1f} s after the kill")
    assert relaunched_s < 10
    train.until("the job to end", lambda: train.jobs.get(jid).state.terminal, START_S)
    j = train.jobs.get(jid)
    assert (j.state, j.restarts) == (JobState.SUCCEEDED, 1)
    newest = newest_complete_checkpoint(train.tmp / "ckpt")
    assert newest is not None and newest[1] == STEPS
    assert train.alloc.workloads() == []
