"""The local runner with real processes: members pinned and in their own process groups, exits
and signals reported once, stop with a grace period, all-or-nothing launch, logs, and members
that outlive the portal and are adopted by the next one. Every test ends with no process of it
left running (``assert_no_leftovers``)."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from portal.jobs.checkpoints import newest_complete_checkpoint
from portal.jobs.member import process_start
from portal.jobs.runner import LocalRunner, MemberExit, MemberLaunch, RunnerError

JOB = "job-1"

# Members print "ready <pid>" once they run, so a test knows the process it talks about.
SLEEPER = "import os, time; print('ready', os.getpid(), flush=True); time.sleep(60)"

# Waits for a file, then exits with 4; SIGTERM's default action ends it otherwise.
WAITER = """
import os, sys, time
print('ready', os.getpid(), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
sys.exit(4)
"""

# The checkpoint contract in a few lines: on SIGTERM, finish the step, checkpoint, exit 0.
CHECKPOINTER = """
import os, signal, time
from pathlib import Path
from portal.jobs.checkpoints import mark_complete, step_path
stopping = False
def on_term(signum, frame):
    global stopping
    stopping = True
signal.signal(signal.SIGTERM, on_term)
print('ready', os.getpid(), flush=True)
step = 0
while not stopping:
    time.sleep(0.01)
    step += 1
folder = step_path(Path(os.environ['GPUPORTAL_CHECKPOINT_DIR']), step)
folder.mkdir(parents=True)
(folder / 'state').write_text(str(step))
mark_complete(folder)
print('checkpointed', step, flush=True)
"""

# Ignores SIGTERM, and so does the worker it starts in its process group.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
print('ready', os.getpid(), 'worker', worker.pid, flush=True)
time.sleep(60)
"""

# Leaves a worker behind in its process group and exits at once.
ORPHANER = """
import os, subprocess, sys
worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
print('ready', os.getpid(), 'worker', worker.pid, flush=True)
"""


def processes_mentioning(needle: str) -> list[str]:
    """Live processes (not zombies) whose command line or environment contains ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if state not in ("Z", "X") and needle.encode() in cmdline + environ:
            shown = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {shown}")
    return found


def assert_no_leftovers(tmp_path: Path, timeout_s: float = 5.0) -> None:
    """Every process a test started names its tmp_path (wrappers in their command line,
    members in their environment): none may be left once the wrappers have had time to end."""
    deadline = time.monotonic() + timeout_s
    while (left := processes_mentioning(str(tmp_path))) and time.monotonic() < deadline:
        time.sleep(0.05)
    for line in left:
        os.kill(int(line.split(":")[0]), signal.SIGKILL)
    assert left == [], "processes left running"


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[LocalRunner]:
    yield LocalRunner(tmp_path / "state")
    assert_no_leftovers(tmp_path)


def member(
    tmp_path: Path,
    rank: int,
    code: str,
    *args: str,
    attempt: int = 1,
    devices: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> MemberLaunch:
    return MemberLaunch(
        job_id=JOB,
        attempt=attempt,
        rank=rank,
        node="node-a",
        devices=devices,
        command=(sys.executable, "-c", code, *args),
        cwd=str(tmp_path),
        env={
            "GPUPORTAL_TEST_RUN": str(tmp_path),
            "GPUPORTAL_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
            "RANK": str(rank),
            **(env or {}),
        },
    )


def wait_for_log(
    r: LocalRunner, rank: int, text: str, attempt: int = 1, timeout_s: float = 20.0
) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        path = r.log_path(JOB, attempt, rank)
        log = path.read_text() if path.exists() else ""
        if text in log:
            return log
        time.sleep(0.02)
    raise AssertionError(f"rank {rank} never wrote {text!r}")


def ready_pid(r: LocalRunner, rank: int, attempt: int = 1) -> int:
    return int(wait_for_log(r, rank, "ready", attempt).split("ready ")[1].split()[0])


def poll_until(r: LocalRunner, count: int, timeout_s: float = 20.0) -> list[MemberExit]:
    exits: list[MemberExit] = []
    deadline = time.monotonic() + timeout_s
    while len(exits) < count and time.monotonic() < deadline:
        exits += r.poll()
        time.sleep(0.02)
    return sorted(exits, key=lambda e: (e.attempt, e.rank))


def test_members_run_pinned_in_their_own_process_group_and_session(
    runner: LocalRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPORTAL_DATABASE_URL", "postgresql://portal:secret@db/portal")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # the portal's own: never inherited
    report = (
        "import json, os; e = os.environ; print(json.dumps({'pid': os.getpid(), "
        "'pgid': os.getpgrp(), 'sid': os.getsid(0), 'cuda': e['CUDA_VISIBLE_DEVICES'], "
        "'nvidia': e['NVIDIA_VISIBLE_DEVICES'], 'rank': e['RANK'], "
        "'secret': e.get('GPUPORTAL_DATABASE_URL'), 'path': e.get('PATH')}))"
    )
    runner.launch(
        [
            member(tmp_path, 0, report, devices=("GPU-1111", "MIG-2222")),
            member(tmp_path, 1, report, devices=()),
        ]
    )
    exits = poll_until(runner, 2)
    assert exits == [MemberExit(JOB, 1, 0, 0, None), MemberExit(JOB, 1, 1, 0, None)]
    seen = [json.loads(runner.log_path(JOB, 1, rank).read_text()) for rank in (0, 1)]
    for rank, s in enumerate(seen):
        assert s["pgid"] == s["pid"], "a member leads its own process group"
        assert s["sid"] != os.getsid(0), "a member is outside the portal's session"
        assert s["rank"] == str(rank)
        assert s["secret"] is None, "the portal's secrets stay out of a member's environment"
        assert s["path"] == os.environ["PATH"]
    assert (seen[0]["cuda"], seen[0]["nvidia"]) == ("GPU-1111,MIG-2222", "GPU-1111,MIG-2222")
    assert (seen[1]["cuda"], seen[1]["nvidia"]) == ("", "void")  # no devices: sees no GPU


def test_a_relative_working_directory_is_the_portals(
    runner: LocalRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path)
    launch = member(tmp_path, 0, "import os; print(os.getcwd())")
    runner.launch([dataclasses.replace(launch, cwd="work")])
    assert poll_until(runner, 1) == [MemberExit(JOB, 1, 0, 0, None)]
    assert runner.log_path(JOB, 1, 0).read_text().strip() == str(tmp_path / "work")


def test_poll_reports_exit_codes_and_signals_once(runner: LocalRunner, tmp_path: Path) -> None:
    runner.launch(
        [
            member(tmp_path, 0, "import sys; sys.exit(3)"),
            member(tmp_path, 1, "import os, signal; os.kill(os.getpid(), signal.SIGUSR1)"),
            member(tmp_path, 2, "pass"),
        ]
    )
    exits = poll_until(runner, 3)
    assert exits == [
        MemberExit(JOB, 1, 0, exit_code=3, signal=None),
        MemberExit(JOB, 1, 1, exit_code=None, signal=signal.SIGUSR1),
        MemberExit(JOB, 1, 2, exit_code=0, signal=None),
    ]
    time.sleep(0.2)
    assert runner.poll() == []


def test_exits_come_in_the_order_the_members_ended(runner: LocalRunner, tmp_path: Path) -> None:
    # Rank 1 dies first; rank 0, as a survivor would, exits a little later. Polled only after
    # both ended, the first exit is still the one that ended the gang.
    runner.launch(
        [
            member(tmp_path, 0, "import sys, time; time.sleep(0.5); sys.exit(1)"),
            member(tmp_path, 1, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
        ]
    )
    for rank in (0, 1):
        wait_for_exit_record(tmp_path, rank)
    assert runner.poll() == [
        MemberExit(JOB, 1, 1, exit_code=None, signal=signal.SIGKILL),
        MemberExit(JOB, 1, 0, exit_code=1, signal=None),
    ]


def wait_for_exit_record(tmp_path: Path, rank: int) -> None:
    record = tmp_path / "state" / JOB / "attempt-1" / f"rank-{rank}" / "exit.json"
    deadline = time.monotonic() + 20
    while not record.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_logs_hold_stdout_and_stderr_under_the_state_directory(
    runner: LocalRunner, tmp_path: Path
) -> None:
    code = "import sys; print('to stdout', flush=True); print('to stderr', file=sys.stderr)"
    runner.launch([member(tmp_path, 0, code)])
    poll_until(runner, 1)
    path = runner.log_path(JOB, 1, 0)
    assert path.is_relative_to(tmp_path / "state")
    assert path.read_text().splitlines() == ["to stdout", "to stderr"]


def test_stop_sends_sigterm_and_the_script_checkpoints_before_exiting(
    runner: LocalRunner, tmp_path: Path
) -> None:
    runner.launch([member(tmp_path, 0, CHECKPOINTER), member(tmp_path, 1, SLEEPER)])
    ready_pid(runner, 0)
    ready_pid(runner, 1)
    started = time.monotonic()
    runner.stop(JOB, 1, grace_s=15)
    elapsed = time.monotonic() - started
    assert elapsed < 5, "both ended on SIGTERM, long before the grace period"
    exits = poll_until(runner, 2)
    assert exits == [
        MemberExit(JOB, 1, 0, exit_code=0, signal=None),  # caught SIGTERM and checkpointed
        MemberExit(JOB, 1, 1, exit_code=None, signal=signal.SIGTERM),  # default action
    ]
    step = int(runner.log_path(JOB, 1, 0).read_text().split("checkpointed ")[1])
    newest = newest_complete_checkpoint(tmp_path / "ckpt")
    assert newest is not None and newest[1] == step > 0


def test_stop_sigkills_the_whole_group_after_the_grace_period(
    runner: LocalRunner, tmp_path: Path
) -> None:
    runner.launch([member(tmp_path, 0, STUBBORN)])
    log = wait_for_log(runner, 0, "worker")
    worker = int(log.split("worker ")[1])
    started = time.monotonic()
    runner.stop(JOB, 1, grace_s=0.5)
    assert time.monotonic() - started >= 0.5, "SIGKILL only after the grace period"
    assert poll_until(runner, 1) == [MemberExit(JOB, 1, 0, exit_code=None, signal=signal.SIGKILL)]
    assert process_start(worker) is None, "the member's worker died with it"


def test_stop_without_waiting_leaves_the_sigkill_to_poll(
    runner: LocalRunner, tmp_path: Path
) -> None:
    runner.launch([member(tmp_path, 0, STUBBORN), member(tmp_path, 1, CHECKPOINTER)])
    wait_for_log(runner, 0, "worker")
    ready_pid(runner, 1)
    started = time.monotonic()
    runner.stop(JOB, 1, grace_s=2.0, wait=False)
    assert time.monotonic() - started < 1.0, "returned right after the SIGTERM"
    exits = poll_until(runner, 2)
    assert time.monotonic() - started >= 2.0, "the SIGKILL waited for the grace period"
    assert exits == [
        MemberExit(JOB, 1, 0, exit_code=None, signal=signal.SIGKILL),
        MemberExit(JOB, 1, 1, exit_code=0, signal=None),  # it checkpointed on the SIGTERM
    ]


def test_the_next_runner_keeps_a_stops_deadline(runner: LocalRunner, tmp_path: Path) -> None:
    runner.launch([member(tmp_path, 0, STUBBORN)])
    wait_for_log(runner, 0, "worker")
    runner.stop(JOB, 1, grace_s=0.5, wait=False)
    after = LocalRunner(tmp_path / "state")  # the portal restarted during the grace period
    assert after.adopt() == [(JOB, 1)]
    assert poll_until(after, 1) == [MemberExit(JOB, 1, 0, exit_code=None, signal=signal.SIGKILL)]
    assert runner.poll() == [], "reported once, even by two runners on one folder"


def test_a_second_stop_only_brings_the_deadline_closer(runner: LocalRunner, tmp_path: Path) -> None:
    runner.launch([member(tmp_path, 0, STUBBORN)])
    wait_for_log(runner, 0, "worker")
    runner.stop(JOB, 1, grace_s=0.3, wait=False)  # a cancel
    runner.stop(JOB, 1, grace_s=300, wait=False)  # then a preemption's long grace
    started = time.monotonic()
    assert poll_until(runner, 1) == [MemberExit(JOB, 1, 0, exit_code=None, signal=signal.SIGKILL)]
    assert time.monotonic() - started < 5


def test_what_a_member_leaves_in_its_group_ends_with_it(
    runner: LocalRunner, tmp_path: Path
) -> None:
    runner.launch([member(tmp_path, 0, ORPHANER)])
    assert poll_until(runner, 1) == [MemberExit(JOB, 1, 0, exit_code=0, signal=None)]
    worker = int(runner.log_path(JOB, 1, 0).read_text().split("worker ")[1])
    assert process_start(worker) is None


def test_launch_is_all_or_nothing(runner: LocalRunner, tmp_path: Path) -> None:
    bad = MemberLaunch(JOB, 1, 2, "node-a", (), ("/no/such/program",), str(tmp_path), {})
    with pytest.raises(RunnerError, match=r"rank 2: cannot start '/no/such/program'"):
        runner.launch([member(tmp_path, 0, SLEEPER), member(tmp_path, 1, SLEEPER), bad])
    time.sleep(1)  # long enough for a member that survived the failure to show up below
    assert processes_mentioning(str(tmp_path)) == []
    assert not (tmp_path / "state" / JOB / "attempt-1").exists()
    assert runner.poll() == [] and runner.adopt() == []
    # Nothing of the failed launch is in the way of launching the attempt again.
    runner.launch([member(tmp_path, 0, SLEEPER)])
    ready_pid(runner, 0)
    runner.stop(JOB, 1, grace_s=5)
    assert poll_until(runner, 1) == [MemberExit(JOB, 1, 0, None, signal.SIGTERM)]


def _bad_launches(tmp_path: Path) -> dict[str, list[MemberLaunch]]:
    ok = member(tmp_path, 0, SLEEPER)

    def variant(**kw: Any) -> MemberLaunch:
        return dataclasses.replace(ok, **kw)

    return {
        "no members": [],
        "invalid ranks": [ok, variant(rank=2)],
        "expected one attempt per launch": [ok, variant(rank=1, attempt=2)],
        "invalid command": [variant(command=())],
        "invalid working directory": [variant(cwd=str(tmp_path / "missing"))],
        "invalid job id": [variant(job_id="../escape")],
        "invalid attempt": [variant(attempt=0)],
        "invalid device": [variant(devices=("0,1",))],
        "invalid environment variable": [variant(env={"A=B": "1"})],
    }


@pytest.mark.parametrize("problem", list(_bad_launches(Path("/"))))
def test_bad_launches_are_refused_and_start_nothing(
    runner: LocalRunner, tmp_path: Path, problem: str
) -> None:
    with pytest.raises(RunnerError, match=problem):
        runner.launch(_bad_launches(tmp_path)[problem])
    assert list((tmp_path / "state").glob("**/rank-*")) == []


@pytest.mark.parametrize("job_id", ["../escape", "/abs", "a/b", "", ".hidden"])
def test_paths_never_leave_the_state_directory(runner: LocalRunner, job_id: str) -> None:
    with pytest.raises(RunnerError, match="invalid job id"):
        runner.log_path(job_id, 1, 0)
    with pytest.raises(RunnerError, match="invalid job id"):
        runner.stop(job_id, 1, grace_s=0)


def test_an_attempt_is_launched_once(runner: LocalRunner, tmp_path: Path) -> None:
    runner.launch([member(tmp_path, 0, "pass")])
    with pytest.raises(RunnerError, match="launched already"):
        runner.launch([member(tmp_path, 0, SLEEPER)])
    assert poll_until(runner, 1) == [MemberExit(JOB, 1, 0, 0, None)]


# The portal, in a process of its own: it launches, says so, and waits to be killed.
PORTAL = """
import json, sys, time
from pathlib import Path
from portal.jobs.runner import LocalRunner, MemberLaunch
members = [MemberLaunch(**{**m, 'devices': tuple(m['devices']), 'command': tuple(m['command'])})
           for m in json.loads(sys.argv[2])]
LocalRunner(Path(sys.argv[1])).launch(members)
print('launched', flush=True)
time.sleep(60)
"""


def test_members_outlive_the_portal_and_the_next_one_adopts_them(tmp_path: Path) -> None:
    state = tmp_path / "state"
    go = tmp_path / "go"
    members = [member(tmp_path, 0, WAITER, str(go)), member(tmp_path, 1, SLEEPER)]
    as_json = json.dumps([dataclasses.asdict(m) for m in members])
    try:
        portal = subprocess.Popen(
            [sys.executable, "-c", PORTAL, str(state), as_json],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert portal.stdout is not None and portal.stdout.readline() == b"launched\n"
        # The portal dies as a whole: SIGKILL to its process group, as a terminal's or a
        # service manager's stop would (without its grace).
        os.killpg(portal.pid, signal.SIGKILL)
        portal.wait()
        after = LocalRunner(state)
        pids = [ready_pid(after, rank) for rank in (0, 1)]
        assert all(process_start(pid) is not None for pid in pids), "members outlived it"
        assert after.adopt() == [(JOB, 1)]

        go.touch()  # rank 0 exits with 4 while the new portal watches
        assert poll_until(after, 1) == [MemberExit(JOB, 1, 0, exit_code=4, signal=None)]
        assert after.adopt() == [(JOB, 1)], "rank 1 still runs"
        after.stop(JOB, 1, grace_s=5)  # a member that is not its child
        assert poll_until(after, 1) == [MemberExit(JOB, 1, 1, None, signal.SIGTERM)]
        assert after.adopt() == []

        again = LocalRunner(state)  # a second restart: nothing is reported twice
        assert again.adopt() == []
        assert again.poll() == []
    finally:
        assert_no_leftovers(tmp_path)


def test_exits_while_no_portal_watched_are_reported_by_the_next_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    try:
        first = LocalRunner(state)
        first.launch([member(tmp_path, 0, "import sys; sys.exit(7)"), member(tmp_path, 1, SLEEPER)])
        ready_pid(first, 1)
        del first  # the portal is gone; its runner's exits were never polled
        gc.collect()
        time.sleep(0.5)

        second = LocalRunner(state)
        assert second.adopt() == [(JOB, 1)]
        assert poll_until(second, 1) == [MemberExit(JOB, 1, 0, exit_code=7, signal=None)]
        second.stop(JOB, 1, grace_s=5)
        assert poll_until(second, 1) == [MemberExit(JOB, 1, 1, None, signal.SIGTERM)]

        assert LocalRunner(state).poll() == []
    finally:
        assert_no_leftovers(tmp_path)


def test_a_reused_pid_is_never_signalled(runner: LocalRunner, tmp_path: Path) -> None:
    """A record whose member pid now belongs to another process (same pid, other start time)
    is not running, and stopping it signals nobody."""
    runner.launch([member(tmp_path, 0, "pass")])
    assert poll_until(runner, 1) == [MemberExit(JOB, 1, 0, 0, None)]
    # The new owner of the pid starts after the member, as a reused pid would: at least one
    # clock tick (10 ms) later, the resolution of a process's start time.
    time.sleep(0.05)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = tmp_path / "state" / JOB / "attempt-1" / "rank-0"
        (record / "exit.json").unlink()
        (record / "reported").unlink()
        for name in ("member.json", "wrapper.json"):
            identity = json.loads((record / name).read_text())
            identity["pid"] = stranger.pid  # the kernel gave the number to someone else
            (record / name).write_text(json.dumps(identity))

        fresh = LocalRunner(tmp_path / "state")
        assert fresh.adopt() == []
        fresh.stop(JOB, 1, grace_s=0)
        assert stranger.poll() is None, "the stranger was not signalled"
        assert fresh.poll() == [MemberExit(JOB, 1, 0, exit_code=None, signal=None)]
    finally:
        stranger.kill()
        stranger.wait()


def test_stop_of_an_attempt_that_never_ran_is_an_error(runner: LocalRunner) -> None:
    with pytest.raises(RunnerError, match="no members of job 'job-1' attempt 3"):
        runner.stop(JOB, 3, grace_s=1)
    with pytest.raises(RunnerError, match="grace period"):
        runner.stop(JOB, 1, grace_s=-1)


def test_stop_of_an_attempt_that_ended_does_nothing(runner: LocalRunner, tmp_path: Path) -> None:
    runner.launch([member(tmp_path, 0, "import sys; sys.exit(2)")])
    assert poll_until(runner, 1) == [MemberExit(JOB, 1, 0, 2, None)]
    runner.stop(JOB, 1, grace_s=1)
    assert runner.poll() == []
