"""The test PostgreSQL server never outlives a test run, even one killed with SIGKILL (where no
``atexit`` handler runs): a helper interpreter starts one and is killed; the server must go."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.waiting import eventually

STARTER = """
import sys, time
from tests.support.postgres import start_server
server = start_server()
print(server.process.pid, server.root, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose (its parent, pid 1 here, has not reaped it yet).
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


@pytest.mark.postgres
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_a_killed_run_leaves_no_postgres_behind() -> None:
    root_dir = Path(__file__).resolve().parents[2]
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER],
        cwd=root_dir,
        env={**os.environ, "PYTHONPATH": str(root_dir)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None
    pid_text, _, data_root = starter.stdout.readline().strip().partition(" ")
    try:
        pid = int(pid_text)
        assert _alive(pid)
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=10)
        eventually(lambda: True if not _alive(pid) else None, "the orphaned server's exit", 20)
    finally:
        if starter.poll() is None:
            starter.kill()
        if pid_text.isdigit() and _alive(int(pid_text)):
            os.kill(int(pid_text), signal.SIGQUIT)
        if data_root:
            shutil.rmtree(data_root, ignore_errors=True)
