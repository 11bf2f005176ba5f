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


def launch(r: LocalRunner, tmp_path: Path, attempt: int, resume: Path | None) -> None:
    """What the controller does for one attempt: both members on this node, a fresh port."""
    layout = [(0, "localhost"), (1, "localhost")]
    envs = rendezvous_env(
        JOB,
        attempt,
        layout,
        "127.0.0.1",
        free_port(),
        str(tmp_path / "ckpt"),
        str(resume) if resume else None,
    )
    command = (
        sys.executable,
        str(EXAMPLE),
        f"--steps={STEPS}",
        f"--checkpoint-every={EVERY}",
        "--step-seconds=0.05",
    )
    r.launch(
        [
            MemberLaunch(
                JOB,
                attempt,
                rank,
                node,
                (),
                command,
                str(tmp_path),
                {**env, "JAX_PLATFORMS": "cpu", "GPUPORTAL_TEST_RUN": str(tmp_path)},
            )
            for (rank, node), env in zip(layout, envs, strict=True)
        ]
    )


def log_of(r: LocalRunner, attempt: int, rank: int) -> str:
    path = r.log_path(JOB, attempt, rank)
    return path.read_text() if path.exists() else ""


def wait_for(what: str, check: Callable[[], object], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def checkpoints_logged(r: LocalRunner, attempt: int) -> list[int]:
    return [int(s) for s in re.findall(r"checkpoint step (\d+)", log_of(r, attempt, 0))]


def resumed_steps(r: LocalRunner, attempt: int) -> list[int]:
    found = [re.search(r"resumed from step (\d+)", log_of(r, attempt, rank)) for rank in (0, 1)]
    return [int(m.group(1)) for m in found if m]


def pid_of(r: LocalRunner, attempt: int, rank: int) -> int:
    match = re.search(r"pid (\d+)", log_of(r, attempt, rank))
    assert match, log_of(r, attempt, rank)
    return int(match.group(1))


def poll_until(r: LocalRunner, count: int, timeout_s: float) -> list[MemberExit]:
    exits: list[MemberExit] = []

    def enough() -> bool:
        exits.extend(r.poll())
        return len(exits) >= count

    wait_for(f"{count} exits", enough, timeout_s)
    return sorted(exits, key=lambda e: (e.attempt, e.rank))


def test_a_killed_member_restarts_the_gang_from_the_last_complete_checkpoint(
    runner: LocalRunner, tmp_path: Path
) -> None:
    launch(runner, tmp_path, attempt=1, resume=None)
    wait_for("two checkpoints", lambda: len(checkpoints_logged(runner, 1)) >= 2, START_S)

    os.kill(pid_of(runner, 1, 1), signal.SIGKILL)
    killed = time.monotonic()
    # The controller: on the killed member's exit it stops the rest of the gang (the
    # survivor's all-reduce fails and it exits by itself, or SIGKILL after the grace period).
    exits: list[MemberExit] = []

    def killed_seen() -> bool:
        exits.extend(runner.poll())
        return any(e.rank == 1 for e in exits)

    wait_for("the killed member's exit", killed_seen, 10)
    runner.stop(JOB, 1, grace_s=2)
    exits = sorted(exits + poll_until(runner, 2 - len(exits), timeout_s=10), key=lambda e: e.rank)
    assert exits[1] == MemberExit(JOB, 1, 1, exit_code=None, signal=signal.SIGKILL)
    assert exits[0].rank == 0 and exits[0].exit_code != 0
    last_written = max(checkpoints_logged(runner, 1))
    # An attempt that died while writing leaves a folder without its marker: never resumed.
    torn = tmp_path / "ckpt" / f"step-{last_written + 1000}"
    torn.mkdir()
    (torn / "params.npz").write_bytes(b"half a file")
    newest = newest_complete_checkpoint(tmp_path / "ckpt")
    assert newest is not None
    launch(runner, tmp_path, attempt=2, resume=newest[0])
    relaunched_s = time.monotonic() - killed
    wait_for("both members resumed", lambda: len(resumed_steps(runner, 2)) == 2, START_S)
    resumed_s = time.monotonic() - killed
    print(f"relaunched {relaunched_s:.1f} s, both training again {resumed_s:.1f} s after the kill")

    assert relaunched_s < 10, "both members restarted within 10 s of the kill"
    assert resumed_steps(runner, 2) == [newest[1], newest[1]]
    assert newest[1] >= last_written > 0
    assert poll_until(runner, 2, timeout_s=120) == [
        MemberExit(JOB, 2, 0, exit_code=0, signal=None),
        MemberExit(JOB, 2, 1, exit_code=0, signal=None),
    ]
    assert checkpoints_logged(runner, 2)[-1] == STEPS
    final = newest_complete_checkpoint(tmp_path / "ckpt")
    assert final is not None and final[1] == STEPS  # the torn step-N+1000 still skipped


def test_sigterm_makes_the_gang_checkpoint_the_same_step_and_resume_there(
    runner: LocalRunner, tmp_path: Path
) -> None:
    launch(runner, tmp_path, attempt=1, resume=None)
    wait_for("a checkpoint", lambda: checkpoints_logged(runner, 1), START_S)
    runner.stop(JOB, 1, grace_s=60)  # a preemption: SIGTERM, and time to checkpoint
    assert poll_until(runner, 2, timeout_s=10) == [
        MemberExit(JOB, 1, 0, exit_code=143, signal=None),  # checkpointed, then "terminated"
        MemberExit(JOB, 1, 1, exit_code=143, signal=None),
    ]
    stopped = [
        int(m.group(1))
        for rank in (0, 1)
        if (m := re.search(r"stopped by SIGTERM after step (\d+)", log_of(runner, 1, rank)))
    ]
    assert len(stopped) == 2, [log_of(runner, 1, rank) for rank in (0, 1)]
    assert stopped[0] == stopped[1], "both members stopped after the same step"
    newest = newest_complete_checkpoint(tmp_path / "ckpt")
    assert newest is not None and newest[1] == stopped[0] == checkpoints_logged(runner, 1)[-1]

    launch(runner, tmp_path, attempt=2, resume=newest[0])
    assert poll_until(runner, 2, timeout_s=START_S) == [
        MemberExit(JOB, 2, 0, exit_code=0, signal=None),
        MemberExit(JOB, 2, 1, exit_code=0, signal=None),
    ]
    assert resumed_steps(runner, 2) == [stopped[0], stopped[0]]
