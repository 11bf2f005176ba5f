"""``Portal().jobs`` against the real API over real HTTP, with the job controller driven by a
background loop as in the service (stand-in runner: see ``tests/portal/jobs/conftest.py``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from policies.errors import Forbidden, InvalidRequest
from policies.jobs import JobState
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.client import AsyncPortal, Portal
from portal.jobs.controller import JobController
from tests.portal.api.conftest import TOKENS
from tests.portal.client.conftest import PREFIX, serving
from tests.portal.jobs.conftest import FakeRunner, make_backend


@dataclass
class JobServer:
    url: str
    runner: FakeRunner
    controller: JobController

    def write_log(self, job_id: str, attempt: int, rank: int, text: str) -> None:
        path = self.runner.log_path(job_id, attempt, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(text)


@pytest.fixture
def job_server(allocator: Allocator, tmp_path: Path) -> Iterator[JobServer]:
    runner = FakeRunner(tmp_path)  # STAND-IN runner
    controller = JobController(allocator, backend=make_backend(runner))
    controller.start()
    app = create_app(allocator, StaticAuthenticator(TOKENS), job_controller=controller)
    stop = threading.Event()

    def loop() -> None:  # the service's jobs loop, faster
        while not stop.wait(0.02):
            allocator.tick()
            controller.step()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        with serving(Starlette(routes=[Mount(PREFIX, app=app)])) as port:
            yield JobServer(f"http://127.0.0.1:{port}{PREFIX}/", runner, controller)
    finally:
        stop.set()
        thread.join(5)


def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_submit_follow_logs_across_a_restart_wait_and_read_attempts(
    job_server: JobServer,
) -> None:
    with Portal(job_server.url, "alice") as portal:
        job = portal.jobs.submit(
            "team-a",
            ["python", "train.py"],
            members=2,
            flavor="H100-80GB",
            backoff_s=0,
            backoff_cap_s=0,
        )
        assert job.info.members == 2 and job.info.workload is not None
        assert job.info.workload.kind == "job"
        until(lambda: job.refresh().state is JobState.RUNNING)
        job_server.write_log(job.id, 1, 0, "epoch 1\n")
        chunks: list[str] = []
        follower = threading.Thread(
            target=lambda: chunks.extend(job.logs(follow=True, poll_s=0.02))
        )
        follower.start()
        until(lambda: "".join(chunks) == "epoch 1\n")
        job_server.runner.exit(job.id, 1, 1, 1)
        until(lambda: job.refresh().attempt == 2 and job.info.state is JobState.RUNNING)
        job_server.write_log(job.id, 2, 0, "resumed\n")
        until(lambda: "".join(chunks).endswith("resumed\n"))
        job_server.runner.exit(job.id, 2, 0, 0)
        job_server.runner.exit(job.id, 2, 1, 0)
        done = job.wait(timeout_s=10, poll_s=0.02)
        follower.join(10)
        assert not follower.is_alive()  # following stops when the job ends
        assert done.state is JobState.SUCCEEDED
        assert "".join(chunks) == "epoch 1\nresumed\n"
        assert [(a.number, a.exit_reason, a.counted) for a in job.attempts()] == [
            (1, "exit code 1", True),
            (2, "completed", False),
        ]
        assert "".join(job.logs(attempt=1)) == "epoch 1\n"
        cost = job.cost()  # unpriced here: the money is 0, the model named
        assert [(a.number, a.exit_reason) for a in cost.attempts] == [
            (1, "exit code 1"),
            (2, "completed"),
        ]
        assert (cost.cost, cost.unpriced_models) == ("0.00", ["H100-80GB"])
        assert [j.id for j in portal.jobs.list()] == [job.id]


def test_another_tenant_gets_forbidden_and_bad_input_names_the_field(
    job_server: JobServer,
) -> None:
    with Portal(job_server.url, "alice") as alice, Portal(job_server.url, "bob") as bob:
        job = alice.jobs.submit("team-a", ["sleep", "60"], flavor="H100-80GB")
        for attempt in (
            lambda: bob.jobs.get(job.id),
            lambda: bob.jobs.cancel(job.id),
            lambda: bob.jobs.attempts(job.id),
            lambda: bob.jobs.read_logs(job.id, None, 0, 0),
            lambda: bob.jobs.cost(job.id),
        ):
            with pytest.raises(Forbidden):
                attempt()
        with pytest.raises(InvalidRequest) as bad:
            alice.jobs.submit("team-a", ["x"], members=0, flavor="H100-80GB")
        assert bad.value.field == "members"
        assert job.cancel().state is JobState.CANCELLED


async def test_the_async_client_submits_follows_and_waits(job_server: JobServer) -> None:
    async with AsyncPortal(job_server.url, "alice") as portal:
        job = await portal.jobs.submit(
            "team-a", ["python", "train.py"], members=2, flavor="H100-80GB"
        )
        assert job.workload is not None and job.workload.kind == "job"
        while (await portal.jobs.get(job.id)).state is not JobState.RUNNING:
            await asyncio.sleep(0.02)
        job_server.write_log(job.id, 1, 0, "step 1\n")
        assert [c async for c in portal.jobs.logs(job.id)] == ["step 1\n"]
        waiter = asyncio.create_task(portal.jobs.wait(job.id, timeout_s=10, poll_s=0.02))
        await asyncio.sleep(0.2)
        assert not waiter.done()  # it runs
        job_server.runner.exit(job.id, 1, 0, 0)
        job_server.runner.exit(job.id, 1, 1, 0)
        chunks = [c async for c in portal.jobs.logs(job.id, follow=True, poll_s=0.02)]
        assert chunks == ["step 1\n"]  # and following stopped: the job ended
        done = await waiter
        assert done.state is JobState.SUCCEEDED
        assert [a.exit_reason for a in await portal.jobs.attempts(job.id)] == ["completed"]
        cost = await portal.jobs.cost(job.id)
        attempts = await portal.jobs.attempts(job.id)
        assert [a.workload_id for a in cost.attempts] == [a.workload_id for a in attempts]
        assert [j.id for j in await portal.jobs.list()] == [job.id]
