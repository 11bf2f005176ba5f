"""Training jobs from Python: ``Portal().jobs.submit(...)`` returns a ``Job`` handle.

::

    job = Portal().jobs.submit(
        "team-a", ["python", "train.py"], members=2, flavor="H100-80GB", count=8,
        checkpoint_dir="/data/ckpt/run1",
    )
    for chunk in job.logs(follow=True):   # rank 0, across restarts, until the job ends
        print(chunk, end="")
    job.wait().state                      # succeeded, failed or cancelled
    [(a.number, a.exit_reason) for a in job.attempts()]
    job.cost().cost                       # money so far, whole cents (also per attempt)

The operations (``submit``, ``get``...) are built as the other client calls are
(``portal.client.core``); ``Job`` adds waiting and following, which poll.
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from policies.jobs import JobState
from portal.client import core
from portal.client.core import API, Call, Op, _filters, _seg

if TYPE_CHECKING:
    from portal.api.jobs import AttemptOut, JobCostOut, JobOut, LogOut
    from portal.api.schemas import DevicesIn
    from portal.client.aio import AsyncPortal
    from portal.client.sync import Portal


# ------------------------------------------------------------------ operations (no I/O)


def submit(body: Mapping[str, Any]) -> Op[JobOut]:
    from portal.api.jobs import JobOut

    # Not retried: a job has no idempotency key, and a lost answer may have created one.
    return (yield from core.one(Call("POST", f"{API}/jobs", body=dict(body)), JobOut))


def get(job_id: str) -> Op[JobOut]:
    from portal.api.jobs import JobOut

    call = Call("GET", f"{API}/jobs/{_seg(job_id)}", idempotent=True)
    return (yield from core.one(call, JobOut))


def listed(page_size: int, tenant: str | None, state: JobState | str | None) -> Op[list[JobOut]]:
    from portal.api.jobs import JobOut

    params = _filters(tenant=tenant, state=None if state is None else str(state))
    return (yield from core.every_page(f"{API}/jobs", JobOut, page_size, params))


def cancel(job_id: str) -> Op[JobOut]:
    from portal.api.jobs import JobOut

    call = Call("DELETE", f"{API}/jobs/{_seg(job_id)}", idempotent=True)
    return (yield from core.one(call, JobOut))


def attempts(job_id: str, page_size: int) -> Op[list[AttemptOut]]:
    from portal.api.jobs import AttemptOut

    path = f"{API}/jobs/{_seg(job_id)}/attempts"
    return (yield from core.every_page(path, AttemptOut, page_size))


def cost(job_id: str) -> Op[JobCostOut]:
    from portal.api.jobs import JobCostOut

    call = Call("GET", f"{API}/jobs/{_seg(job_id)}/cost", idempotent=True)
    return (yield from core.one(call, JobCostOut))


def logs(job_id: str, attempt: int | None, rank: int, offset: int) -> Op[LogOut]:
    from portal.api.jobs import LogOut

    params = _filters(attempt=attempt, rank=rank, offset=offset)
    call = Call("GET", f"{API}/jobs/{_seg(job_id)}/logs", params, idempotent=True)
    return (yield from core.one(call, LogOut))


def body(
    tenant: str,
    command: Sequence[str],
    *,
    members: int,
    devices: DevicesIn,
    max_members: int | None = None,
    name: str | None,
    cwd: str | None,
    image: str | None,
    env: Mapping[str, str] | None,
    checkpoint_dir: str | None,
    topology: str,
    topology_mode: str,
    max_restarts: int,
    backoff_s: float,
    backoff_cap_s: float,
    fail_on_exit_codes: Sequence[int],
    priority: int,
    expected_duration_s: float | None,
) -> dict[str, Any]:
    """The ``POST /jobs`` body; the server checks every value and names the one wrong."""
    return {
        "tenant": tenant,
        "name": name or (command[0].rsplit("/", 1)[-1] if command else "job"),
        # An elastic job: from members up to max_members.
        "members": members if max_members is None else {"min": members, "max": max_members},
        "devices": devices.model_dump(mode="json"),
        "topology": {"level": topology, "mode": topology_mode},
        "command": list(command),
        "cwd": cwd,
        "image": image,
        "env": dict(env or {}),
        "checkpoint_dir": checkpoint_dir,
        "restart": {
            "max_restarts": max_restarts,
            "backoff_s": backoff_s,
            "backoff_cap_s": backoff_cap_s,
            "fail_on_exit_codes": list(fail_on_exit_codes),
        },
        "priority": priority,
        "expected_duration_s": expected_duration_s,
    }


def next_log_attempt(job: JobOut, log: LogOut) -> int | None:
    """Which attempt a follower reads next once ``log`` says its attempt is done: the next
    one when the job restarted, None when the job ended (stop following)."""
    if job.state.terminal and job.attempt <= log.attempt:
        return None
    return log.attempt + 1 if job.attempt > log.attempt else log.attempt


# ------------------------------------------------------------------ the blocking API


class Jobs:
    """``Portal().jobs``: submit, read, list and cancel training jobs."""

    def __init__(self, portal: Portal) -> None:
        self._portal = portal

    def submit(
        self,
        tenant: str,
        command: Sequence[str] = (),
        *,
        members: int = 1,
        max_members: int | None = None,
        flavor: str | None = None,
        count: int = 1,
        milli: int = 0,
        gpu_memory_mib: int = 0,
        devices: DevicesIn | None = None,
        name: str | None = None,
        cwd: str | None = None,
        image: str | None = None,
        env: Mapping[str, str] | None = None,
        checkpoint_dir: str | None = None,
        topology: str = "any",
        topology_mode: str = "required",
        max_restarts: int = 3,
        backoff_s: float = 10.0,
        backoff_cap_s: float = 300.0,
        fail_on_exit_codes: Sequence[int] = (),
        priority: int = 0,
        expected_duration_s: float | None = None,
    ) -> Job:
        """Submit a job of ``members`` ranks (with ``max_members``: an elastic job growing
        from ``members`` to that many) charged to ``tenant``, each with ``count`` GPUs
        of ``flavor`` (or one MIG instance, a share, or any ``devices``), running ``command``
        (local backend) or ``image`` (Kubernetes). ``topology``: any, same-node, nvlink or
        same-rack; ``topology_mode``: required (wait for it) or preferred (relax to any).
        Restarts: ``max_restarts`` failures retried after ``backoff_s`` doubling up to
        ``backoff_cap_s``; exit codes in ``fail_on_exit_codes`` fail at once; preemptions
        never count."""
        want = core.devices_for(
            flavor, count=count, milli=milli, gpu_memory_mib=gpu_memory_mib, devices=devices
        )
        sent = body(
            tenant,
            command,
            members=members,
            max_members=max_members,
            devices=want,
            name=name,
            cwd=cwd,
            image=image,
            env=env,
            checkpoint_dir=checkpoint_dir,
            topology=topology,
            topology_mode=topology_mode,
            max_restarts=max_restarts,
            backoff_s=backoff_s,
            backoff_cap_s=backoff_cap_s,
            fail_on_exit_codes=fail_on_exit_codes,
            priority=priority,
            expected_duration_s=expected_duration_s,
        )
        return Job(self, self._portal._run(submit(sent)))

    def get(self, job_id: str) -> Job:
        """A handle on one job, ended ones included."""
        return Job(self, self._portal._run(get(job_id)))

    def list(self, tenant: str | None = None, state: JobState | str | None = None) -> list[Job]:
        """Every job the token may read, in submission order."""
        page_size = self._portal._page_size
        return [Job(self, j) for j in self._portal._run(listed(page_size, tenant, state))]

    def cancel(self, job_id: str) -> JobOut:
        """Stop its members and release its devices (idempotent)."""
        return self._portal._run(cancel(job_id))

    def attempts(self, job_id: str) -> builtins.list[AttemptOut]:
        return self._portal._run(attempts(job_id, self._portal._page_size))

    def cost(self, job_id: str) -> JobCostOut:
        """GPU-hours and money of the job and of each attempt (running ones up to now)."""
        return self._portal._run(cost(job_id))

    def read_logs(self, job_id: str, attempt: int | None, rank: int, offset: int) -> LogOut:
        return self._portal._run(logs(job_id, attempt, rank, offset))


class Job:
    """One job: ``info`` is its last answer (``refresh`` asks again)."""

    def __init__(self, jobs: Jobs, info: JobOut) -> None:
        self._jobs = jobs
        self.info = info

    def __repr__(self) -> str:
        return f"Job({self.id!r}, state={self.info.state.value!r})"

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def state(self) -> JobState:
        return self.info.state

    def refresh(self) -> JobOut:
        self.info = self._jobs._portal._run(get(self.id))
        return self.info

    def wait(self, *, timeout_s: float | None = None, poll_s: float = 2.0) -> JobOut:
        """Poll until the job ends (succeeded, failed, cancelled) or ``timeout_s`` passes;
        returns its last answer, so check ``state``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            info = self.refresh()
            if info.state.terminal:
                return info
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return info
            time.sleep(poll_s if left is None else min(poll_s, left))

    def attempts(self) -> list[AttemptOut]:
        """Every attempt, oldest first: start, end, nodes, exit reason, resume step."""
        return self._jobs.attempts(self.id)

    def cancel(self) -> JobOut:
        self.info = self._jobs.cancel(self.id)
        return self.info

    def cost(self) -> JobCostOut:
        """What it cost so far: ``cost`` (whole cents, in ``currency``), ``gpu_hours``, and
        the same per attempt."""
        return self._jobs.cost(self.id)

    def logs(
        self,
        *,
        rank: int = 0,
        attempt: int | None = None,
        follow: bool = False,
        poll_s: float = 1.0,
    ) -> Iterator[str]:
        """A member's log as chunks of text. Without ``follow``: what is there now, of
        ``attempt`` (default: the current one). With ``follow``: keeps reading as it grows,
        moves on to the next attempt when the job restarts, and stops when the job ends."""
        number = attempt
        offset = 0
        while True:
            log = self._jobs.read_logs(self.id, number, rank, offset)
            number = log.attempt
            if log.text:
                yield log.text
            offset = log.next_offset
            if not follow:
                return
            if log.next_offset > log.offset:
                continue  # more may be there already
            if log.done:
                following = next_log_attempt(self.refresh(), log)
                if following is None:
                    return
                if following != number:
                    number, offset = following, 0
                    continue
            time.sleep(poll_s)


# ------------------------------------------------------------------ the async API


class AsyncJobs:
    """``AsyncPortal().jobs``: the calls of ``Jobs`` as coroutines, answering the API's
    records (``JobOut``); ``wait`` and ``logs`` poll as ``Job``'s do."""

    def __init__(self, portal: AsyncPortal) -> None:
        self._portal = portal

    async def submit(
        self,
        tenant: str,
        command: Sequence[str] = (),
        *,
        members: int = 1,
        max_members: int | None = None,
        flavor: str | None = None,
        count: int = 1,
        milli: int = 0,
        gpu_memory_mib: int = 0,
        devices: DevicesIn | None = None,
        name: str | None = None,
        cwd: str | None = None,
        image: str | None = None,
        env: Mapping[str, str] | None = None,
        checkpoint_dir: str | None = None,
        topology: str = "any",
        topology_mode: str = "required",
        max_restarts: int = 3,
        backoff_s: float = 10.0,
        backoff_cap_s: float = 300.0,
        fail_on_exit_codes: Sequence[int] = (),
        priority: int = 0,
        expected_duration_s: float | None = None,
    ) -> JobOut:
        """``Jobs.submit``, answering the job's record."""
        want = core.devices_for(
            flavor, count=count, milli=milli, gpu_memory_mib=gpu_memory_mib, devices=devices
        )
        sent = body(
            tenant,
            command,
            members=members,
            max_members=max_members,
            devices=want,
            name=name,
            cwd=cwd,
            image=image,
            env=env,
            checkpoint_dir=checkpoint_dir,
            topology=topology,
            topology_mode=topology_mode,
            max_restarts=max_restarts,
            backoff_s=backoff_s,
            backoff_cap_s=backoff_cap_s,
            fail_on_exit_codes=fail_on_exit_codes,
            priority=priority,
            expected_duration_s=expected_duration_s,
        )
        return await self._portal._run(submit(sent))

    async def get(self, job_id: str) -> JobOut:
        return await self._portal._run(get(job_id))

    async def list(
        self, tenant: str | None = None, state: JobState | str | None = None
    ) -> builtins.list[JobOut]:
        return await self._portal._run(listed(self._portal._page_size, tenant, state))

    async def cancel(self, job_id: str) -> JobOut:
        return await self._portal._run(cancel(job_id))

    async def attempts(self, job_id: str) -> builtins.list[AttemptOut]:
        return await self._portal._run(attempts(job_id, self._portal._page_size))

    async def cost(self, job_id: str) -> JobCostOut:
        return await self._portal._run(cost(job_id))

    async def wait(
        self, job_id: str, *, timeout_s: float | None = None, poll_s: float = 2.0
    ) -> JobOut:
        """Poll until the job ends or ``timeout_s`` passes; returns its last answer."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            info = await self.get(job_id)
            left = None if deadline is None else deadline - time.monotonic()
            if info.state.terminal or (left is not None and left <= 0):
                return info
            await asyncio.sleep(poll_s if left is None else min(poll_s, left))

    async def logs(
        self,
        job_id: str,
        *,
        rank: int = 0,
        attempt: int | None = None,
        follow: bool = False,
        poll_s: float = 1.0,
    ) -> AsyncIterator[str]:
        """``Job.logs`` as an async iterator."""
        number, offset = attempt, 0
        while True:
            log = await self._portal._run(logs(job_id, number, rank, offset))
            number = log.attempt
            if log.text:
                yield log.text
            offset = log.next_offset
            if not follow:
                return
            if log.next_offset > log.offset:
                continue
            if log.done:
                following = next_log_attempt(await self.get(job_id), log)
                if following is None:
                    return
                if following != number:
                    number, offset = following, 0
                    continue
            await asyncio.sleep(poll_s)
