"""Job controller tests: a real allocator on a real store (SQLite and PostgreSQL) and a
stand-in runner.

STAND-IN RUNNER: ``FakeRunner`` stands for ``portal.jobs.runner.LocalRunner`` (marked
``# STAND-IN`` where used) and takes and reports the real ``MemberLaunch``/``MemberExit``; the
rendezvous environment and checkpoints are the real ones. It starts no process: a test says
when each member exits and with what, and whether a stopped member takes its time, which real
processes cannot be made to do deterministically (at 1,000 randomized cases, or on a manual
clock). The same controller runs
the real runner in ``test_controller_local.py`` and under ``gpuportal serve`` in
``tests/portal/service/test_serve_jobs.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.jobs import RestartPolicy, TopologyMode
from policies.requests import DeviceRequest, TopologyRequirement
from portal.allocator import Allocator
from portal.jobs.backend import Backend
from portal.jobs.checkpoints import mark_complete, step_path
from portal.jobs.controller import JobController
from portal.jobs.runner import MemberExit, MemberLaunch, RunnerError
from portal.jobs.spec import Backend as BackendKind
from portal.jobs.spec import JobSpec
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx

H100 = "H100-80GB"


@dataclass
class FakeRunner:
    """STAND-IN for ``portal.jobs.runner.LocalRunner``: remembers launches and stops, and
    reports the exits a test makes with ``exit``. ``stop`` makes every member still running
    exit by SIGTERM, as a real process group would."""

    tmp: Path
    launched: list[list[MemberLaunch]] = field(default_factory=list)
    stops: list[tuple[str, int, float]] = field(default_factory=list)
    running: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    pending: list[MemberExit] = field(default_factory=list)
    adoptable: list[tuple[str, int]] = field(default_factory=list)
    fail_next_launch: bool = False
    fail_jobs: set[str] = field(default_factory=set)  # every launch of these fails
    # Launches the controller may run at once (the Kubernetes runner's attribute), and a
    # barrier each launch waits at: it breaks unless that many are in flight together.
    launch_concurrency: int = 1
    launch_gate: threading.Barrier | None = None
    # False: members ignore SIGTERM until a test makes them exit (a script checkpointing).
    stop_ends_members: bool = True
    # Tests make members exit from their own thread while the service's loop polls.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def launch(self, members: Sequence[MemberLaunch]) -> None:
        if self.launch_gate is not None:
            self.launch_gate.wait(timeout=10)
        with self.lock:
            if self.fail_next_launch or members[0].job_id in self.fail_jobs:
                self.fail_next_launch = False
                raise RunnerError("no such program")
            self.launched.append(list(members))
            for m in members:
                self.running.setdefault((m.job_id, m.attempt), set()).add(m.rank)

    def exit(self, job_id: str, attempt: int, rank: int, code: int) -> None:
        with self.lock:
            self.running.get((job_id, attempt), set()).discard(rank)
            self.pending.append(MemberExit(job_id, attempt, rank, code, None))

    def stop(self, job_id: str, attempt: int, grace_s: float, *, wait: bool = True) -> None:
        with self.lock:
            self.stops.append((job_id, attempt, grace_s))
            if not self.stop_ends_members:
                return
            for rank in sorted(self.running.pop((job_id, attempt), set())):
                self.pending.append(MemberExit(job_id, attempt, rank, None, 15))

    def poll(self) -> list[MemberExit]:
        with self.lock:
            out, self.pending = self.pending, []
        return out

    def adopt(self) -> list[tuple[str, int]]:
        return list(self.adoptable)

    def log_path(self, job_id: str, attempt: int, rank: int) -> Path:
        return self.tmp / "jobs" / job_id / str(attempt) / f"rank-{rank}.log"


@dataclass
class Rig:
    alloc: Allocator
    clock: ManualClock
    runner: FakeRunner
    jobs: JobController
    ckpt: Path  # a checkpoint directory tests write real checkpoints to

    def checkpoint(self, step: int) -> Path:
        """A complete checkpoint of ``step`` in ``ckpt``, written as the contract says."""
        folder = step_path(self.ckpt, step)
        folder.mkdir(parents=True)
        (folder / "state").write_text(str(step))
        mark_complete(folder)
        return folder

    def step(self, times: int = 1) -> None:
        for _ in range(times):
            self.alloc.tick()
            self.jobs.step()

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds=seconds)
        self.step()


def make_backend(runner: FakeRunner) -> Backend:
    return Backend(kind=BackendKind.LOCAL, runner=runner)  # STAND-IN runner


@pytest.fixture
def store_url(db_url: str) -> str:
    return db_url


@pytest.fixture
def rig(store_url: str, tmp_path: Path) -> Iterator[Rig]:
    store = Store(store_url)
    clock = ManualClock()
    alloc = Allocator(store, clock=clock)
    alloc.start([hgx("n1", "r1"), hgx("n2", "r1"), hgx("n3", "r2"), hgx("n4", "r2")])
    # One cohort: each may borrow the other's unused guarantee (and have it reclaimed).
    alloc.set_tenant("team-a", cohort="lab")
    alloc.set_tenant("team-b", cohort="lab")
    alloc.set_quota("team-a", H100, guaranteed=16, limit=32)
    alloc.set_quota("team-b", H100, guaranteed=16, limit=32)
    runner = FakeRunner(tmp_path)
    jobs = JobController(alloc, backend=make_backend(runner))
    jobs.start()
    yield Rig(alloc, clock, runner, jobs, tmp_path / "ckpt")
    store.close()


def job(
    members: int = 2,
    gpus: int = 8,
    *,
    tenant: str = "team-a",
    topology: TopologyRequirement = TopologyRequirement.ANY,
    mode: TopologyMode = TopologyMode.REQUIRED,
    restart: RestartPolicy | None = None,
    checkpoint_dir: str | None = "/ckpt",
    priority: int = 0,
) -> JobSpec:
    return JobSpec(
        tenant=tenant,
        owner="alice",
        name="train",
        members=members,
        devices=DeviceRequest(
            FlavorKind.GPU, count=gpus, models=frozenset({H100}), topology=topology
        ),
        topology_mode=mode,
        command=("python", "train.py"),
        cwd="/work",
        env=(("EPOCHS", "3"),),
        checkpoint_dir=checkpoint_dir,
        restart=restart or RestartPolicy(max_restarts=2, backoff_s=5, backoff_cap_s=8),
        priority=priority,
    )


@dataclass
class LiveJobs:
    """A job controller with the real local runner, stepped in real time by a test."""

    alloc: Allocator
    jobs: JobController
    tmp: Path

    def until(self, what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            self.alloc.tick()
            self.jobs.step()
            time.sleep(0.05)

    def log(self, job_id: str, attempt: int, rank: int) -> str:
        path = self.jobs.log_path(job_id, attempt, rank)
        assert path is not None
        return path.read_text() if path.exists() else ""
