"""The real training example as an elastic 2-4 member job on the local backend: a real
allocator and store, the local runner, examples/train/train.py (JAX on CPU, gloo over
loopback). It starts at 2 while a neighbour holds the rest, grows to 4 once the neighbour
finishes, and shrinks back to 2 when the lender reclaims its guarantee, resuming from its
newest checkpoint at each resize; the attempt history says each resize and world size.

The GPUs are the only fake part: the utilization the policy reads comes from the test (busy
once the running attempt has written a checkpoint of its own, so a resize never comes before
the job trained at its size).
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path

import pytest

from policies.elastic import ElasticSettings, Sample
from policies.flavors import FlavorKind
from policies.jobs import JobState
from policies.requests import DeviceRequest
from portal.allocator import Allocator
from portal.jobs.backend import local_backend
from portal.jobs.checkpoints import newest_complete_checkpoint
from portal.jobs.controller import JobController
from portal.jobs.elastic import resized
from portal.jobs.spec import JobSpec
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import gpus, hgx, wl
from tests.portal.jobs.conftest import H100, LiveJobs
from tests.portal.jobs.test_example_train import EXAMPLE, RESUMED, START_S

pytestmark = pytest.mark.slow


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveJobs]:
    if importlib.util.find_spec("jax") is None:
        pytest.fail("examples/train needs jax: install the dev extra (pip install -e '.[dev]')")
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store)
    alloc.start([hgx("n1", gpus=4)])
    # team-b lends team-a its 2 guaranteed GPUs while it does not use them.
    alloc.set_tenant("team-a", cohort="lab")
    alloc.set_tenant("team-b", cohort="lab")
    alloc.set_quota("team-a", H100, guaranteed=2, limit=4)
    alloc.set_quota("team-b", H100, guaranteed=2, limit=4)
    jobs = JobController(alloc, backend=local_backend(tmp_path / "state"))
    jobs.start()
    yield LiveJobs(alloc, jobs, tmp_path)
    for j in jobs.jobs():
        jobs.cancel(j.job.id)
    store.close()


def test_grows_to_4_when_a_neighbour_ends_and_shrinks_to_2_on_reclaim(live: LiveJobs) -> None:
    ckpt = live.tmp / "ckpt"
    neighbour = live.alloc.request(wl("team-b", gpus(1), gang=2))
    assert neighbour.state is WorkloadState.RUNNING
    spec = JobSpec(
        tenant="team-a",
        owner="alice",
        name="train",
        members=2,
        max_members=4,
        devices=DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({H100})),
        command=(
            sys.executable,
            str(EXAMPLE),
            "--steps=100000",
            "--checkpoint-every=5",
            "--step-seconds=0.05",
        ),
        cwd=str(live.tmp),
        env=(("JAX_PLATFORMS", "cpu"),),
        checkpoint_dir=str(ckpt),
    )
    jid = live.jobs.submit(spec).job.id

    def trained_since_start() -> bool:
        """The running attempt wrote a checkpoint of its own."""
        j = live.jobs.get(jid)
        attempt = live.jobs.attempts(jid)[-1]
        newest = newest_complete_checkpoint(ckpt)
        return (
            j.state is JobState.RUNNING
            and newest is not None
            and newest[1] > (attempt.resume_step or 0)
            and f"checkpoint step {newest[1]}" in live.log(jid, j.attempt, 0)
        )

    def gauge(ids: Sequence[str], since: datetime) -> list[Sample]:
        now = live.alloc.clock().timestamp()
        busy = 0.95 if trained_since_start() else 0.3
        return [Sample(since.timestamp(), busy), Sample(now, busy)]

    elastic = live.jobs.elastic
    elastic.utilization = gauge
    elastic.retry_s = 0.5
    elastic.set_settings("team-a", ElasticSettings(window_s=0, idle_s=3600))

    def world() -> int:
        j = live.jobs.get(jid)
        return elastic.world(j) if j.state is JobState.RUNNING else 0

    live.until("2 members to train", trained_since_start, START_S)
    assert world() == 2 and live.jobs.get(jid).attempt == 1  # no free capacity: no growth
    live.alloc.release(neighbour.id)
    live.until("the job to grow to 4", lambda: world() == 4, 2 * START_S)
    live.until("4 members to train", trained_since_start, START_S)
    claim = live.alloc.request(wl("team-b", gpus(1), gang=2))
    live.until("the job to shrink to 2", lambda: world() == 2, START_S)
    live.until(
        "the lender's workload to run",
        lambda: live.alloc.status(claim.id).state is WorkloadState.RUNNING,
        START_S,
    )
    live.until("2 members to train again", trained_since_start, START_S)
    j = live.jobs.get(jid)
    assert (j.restarts, j.preemptions) == (0, 0)  # the gang was never evicted
    history = live.jobs.attempts(jid)
    assert [(a.exit_reason, a.world_size) for a in history] == [
        (resized(3), 2),
        (resized(4), 3),
        (resized(2), 4),
        ("", 2),
    ]
    assert len({a.workload_id for a in history}) == 1
    for before, after in itertools.pairwise(history):
        written = [
            int(s) for s in re.findall(r"checkpoint step (\d+)", live.log(jid, before.number, 0))
        ]
        assert after.resume_step is not None and after.resume_step >= max(written) > 0
        assert after.world_size is not None
        for rank in range(after.world_size):
            found = re.search(RESUMED, live.log(jid, after.number, rank))
            assert found and int(found.group(1)) == after.resume_step, (after.number, rank)
    live.jobs.cancel(jid)
    live.until("every device back", lambda: live.alloc.workloads("team-a") == [], 60)
