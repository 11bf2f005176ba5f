"""Ray nodes a test starts end with the test run, even one killed with SIGKILL.

The local backend runs each node in a session of its own on purpose: a portal's end is not its
nodes' end (a restarted portal adopts them). A test run has no successor to adopt them, so a
Ray rig runs under ``nodes_end_with_tests``: a watchdog interpreter, in a session of its own,
holds the read end of a pipe whose only write end is pytest's. However pytest ends, the kernel
closes that end; the watchdog reads end-of-file and stops every member still running under the
rig's state directories, as the rigs' own teardown does (a pipe, not the parent-death signal:
that signal follows the thread that started the child, and a read cannot miss an end that came
before it began).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from portal.jobs.runner import LocalRunner, RunnerError

READY = "watching"
ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def nodes_end_with_tests(*state_dirs: Path) -> Iterator[subprocess.Popen[str]]:
    """Run the block with a watchdog over ``state_dirs`` (a ``LocalRay``'s or a
    ``LocalDrivers``' state directory); at its end the watchdog stops what is left and exits."""
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "tests.support.ray_guard", *map(str, state_dirs)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a signal to pytest's process group is not one to it
    )
    assert watchdog.stdin is not None and watchdog.stdout is not None
    try:
        line = watchdog.stdout.readline().strip()
        assert line == READY, f"the Ray watchdog did not start: {line!r}"
        yield watchdog
    finally:
        watchdog.stdin.close()
        try:
            watchdog.wait(timeout=60)
        except subprocess.TimeoutExpired:
            watchdog.kill()
            watchdog.wait()


def stop_all(state_dir: Path) -> list[str]:
    """Stop every member still running under ``state_dir``; returns their names."""
    runner = LocalRunner(state_dir)
    stopped = []
    for key, start in runner.adopt():
        try:
            runner.stop(key, start, 0.0)
        except RunnerError as exc:  # the others still go
            stopped.append(f"{key}#{start} (not stopped: {exc})")
        else:
            stopped.append(f"{key}#{start}")
    return stopped


def main(argv: list[str]) -> None:
    print(READY, flush=True)
    sys.stdin.read()  # until end-of-file: pytest closed it or ended
    for state_dir in argv:
        stopped = stop_all(Path(state_dir))
        if stopped:
            with contextlib.suppress(OSError):  # pytest's stderr may be gone with it
                print(f"Ray watchdog stopped {', '.join(stopped)}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
