"""The real training job: examples/train/train.py as a 2-member JAX job over loopback (gloo),
run by the local runner with the rendezvous environment. The test plays the job controller:
it launches attempts, watches exits, stops the gang and relaunches it from the newest complete
checkpoint."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from portal.jobs.checkpoints import newest_complete_checkpoint
from portal.jobs.rendezvous import rendezvous_env
from portal.jobs.runner import LocalRunner, MemberExit, MemberLaunch
from tests.portal.jobs.test_runner import assert_no_leftovers

pytestmark = pytest.mark.slow

JOB = "train-1"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train" / "train.py"
STEPS = 40
EVERY = 5
START_S = 180.0  # JAX's first import on a busy CI machine can take tens of seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[LocalRunner]:
    if importlib.util.find_spec("jax") is None:
        pytest.fail("examples/train needs jax: install the dev extra (pip install -e '.[dev]')")
    yield LocalRunner(tmp_path / "state")
    assert_no_leftovers(tmp_path, timeout_s=15)


class Controller:
    """The part of the job controller these tests need: launch an attempt with the rendezvous
    environment, watch exits, read the members' logs."""

    def __init__(self, runner: LocalRunner, tmp_path: Path) -> None:
        self.runner = runner
        self.tmp_path = tmp_path
        self.checkpoints = tmp_path / "ckpt"
        self.exits: list[MemberExit] = []

    def launch(self, attempt: int, resume: Path | None) -> None:
        """Both members on this node, on a fresh port."""
        layout = [(0, "localhost"), (1, "localhost")]
        envs = rendezvous_env(
            JOB,
            attempt,
            layout,
            "127.0.0.1",
            free_port(),
            str(self.checkpoints),
            str(resume) if resume else None,
        )
        command = (
            sys.executable,
            str(EXAMPLE),
            f"--steps={STEPS}",
            f"--checkpoint-every={EVERY}",
            "--step-seconds=0.05",
        )
        extra = {"JAX_PLATFORMS": "cpu", "GPUPORTAL_TEST_RUN": str(self.tmp_path)}
        self.runner.launch(
            [
                MemberLaunch(JOB, attempt, rank, node, (), command, str(self.tmp_path), env | extra)
                for (rank, node), env in zip(layout, envs, strict=True)
            ]
        )

    def log(self, attempt: int, rank: int) -> str:
        path = self.runner.log_path(JOB, attempt, rank)
        return path.read_text() if path.exists() else ""

    def exits_of(self, attempt: int) -> list[MemberExit]:
        return sorted((e for e in self.exits if e.attempt == attempt), key=lambda e: e.rank)

    def wait(
        self, what: str, check: Callable[[], object], timeout_s: float, running: int | None = None
    ) -> None:
        """Poll until ``check()``; fail at once when a member of attempt ``running`` exits
        first (a member that crashed would otherwise keep the test waiting for nothing)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.exits += self.runner.poll()
            if check():
                return
            if running is not None and self.exits_of(running):
                logs = "\n".join(self.log(running, rank)[-3000:] for rank in (0, 1))
                raise AssertionError(f"{self.exits_of(running)} before {what}:\n{logs}")
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def wait_exits(self, attempt: int, timeout_s: float) -> list[MemberExit]:
        self.wait(f"attempt {attempt} to end", lambda: len(self.exits_of(attempt)) == 2, timeout_s)
        return self.exits_of(attempt)

    def checkpoints_logged(self, attempt: int) -> list[int]:
        return [int(s) for s in re.findall(r"checkpoint step (\d+)", self.log(attempt, 0))]

    def steps_logged(self, attempt: int, pattern: str) -> list[int]:
        found = [re.search(pattern, self.log(attempt, rank)) for rank in (0, 1)]
        return [int(m.group(1)) for m in found if m]

    def pid_of(self, attempt: int, rank: int) -> int:
        match = re.search(r"pid (\d+)", self.log(attempt, rank))
        assert match, self.log(attempt, rank)
        return int(match.group(1))


RESUMED = r"resumed from step (\d+)"
STOPPED = r"stopped by SIGTERM after step (\d+)"


@pytest.fixture
def controller(runner: LocalRunner, tmp_path: Path) -> Controller:
    return Controller(runner, tmp_path)


def test_a_killed_member_restarts_the_gang_from_the_last_complete_checkpoint(
    controller: Controller, tmp_path: Path
) -> None:
    c = controller
    c.launch(attempt=1, resume=None)
    c.wait("two checkpoints", lambda: len(c.checkpoints_logged(1)) >= 2, START_S, running=1)

    os.kill(c.pid_of(1, 1), signal.SIGKILL)
    killed = time.monotonic()
    # On the killed member's exit the controller stops the rest of the gang (the survivor's
    # all-reduce fails and it exits by itself, or SIGKILL after the grace period ends it).
    c.wait("the killed member's exit", lambda: any(e.rank == 1 for e in c.exits), 10)
    c.runner.stop(JOB, 1, grace_s=2)
    survivor, killed_member = c.wait_exits(1, 10)
    assert c.exits[0] == killed_member, "the first exit the controller sees is the cause"
    assert killed_member == MemberExit(JOB, 1, 1, exit_code=None, signal=signal.SIGKILL)
    assert survivor.exit_code != 0
    last_written = max(c.checkpoints_logged(1))
    # An attempt that died while writing leaves a folder without its marker: never resumed.
    torn = c.checkpoints / f"step-{last_written + 1000}"
    torn.mkdir()
    (torn / "params.npz").write_bytes(b"half a file")
    newest = newest_complete_checkpoint(c.checkpoints)
    assert newest is not None
    c.launch(attempt=2, resume=newest[0])
    relaunched_s = time.monotonic() - killed
    c.wait("both members resumed", lambda: len(c.steps_logged(2, RESUMED)) == 2, START_S, 2)
    resumed_s = time.monotonic() - killed
    print(f"relaunched {relaunched_s:.1f} s, both training again {resumed_s:.1f} s after the kill")

    assert relaunched_s < 10, "both members restarted within 10 s of the kill"
    assert c.steps_logged(2, RESUMED) == [newest[1], newest[1]]
    assert newest[1] >= last_written > 0
    assert c.wait_exits(2, 120) == [
        MemberExit(JOB, 2, 0, exit_code=0, signal=None),
        MemberExit(JOB, 2, 1, exit_code=0, signal=None),
    ]
    assert c.checkpoints_logged(2)[-1] == STEPS
    assert newest_complete_checkpoint(c.checkpoints) == (c.checkpoints / f"step-{STEPS}", STEPS)


def test_sigterm_makes_the_gang_checkpoint_the_same_step_and_resume_there(
    controller: Controller,
) -> None:
    c = controller
    c.launch(attempt=1, resume=None)
    c.wait("a checkpoint", lambda: c.checkpoints_logged(1), START_S, running=1)
    c.runner.stop(JOB, 1, grace_s=60)  # a preemption: SIGTERM, and time to checkpoint
    assert c.wait_exits(1, 10) == [
        MemberExit(JOB, 1, 0, exit_code=143, signal=None),  # checkpointed, then "terminated"
        MemberExit(JOB, 1, 1, exit_code=143, signal=None),
    ]
    stopped = c.steps_logged(1, STOPPED)
    assert len(stopped) == 2 and stopped[0] == stopped[1], "both stopped after the same step"
    newest = newest_complete_checkpoint(c.checkpoints)
    assert newest is not None and newest[1] == stopped[0] == c.checkpoints_logged(1)[-1]

    c.launch(attempt=2, resume=newest[0])
    assert c.wait_exits(2, START_S) == [
        MemberExit(JOB, 2, 0, exit_code=0, signal=None),
        MemberExit(JOB, 2, 1, exit_code=0, signal=None),
    ]
    assert c.steps_logged(2, RESUMED) == [stopped[0], stopped[0]]
