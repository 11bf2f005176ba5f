"""A test run killed with SIGKILL (no teardown, no ``atexit``) leaves none of the Ray nodes it
started behind: a helper interpreter starts a node under ``nodes_end_with_tests`` and is
killed; every process of the node's session must end. The node is a real ``ray start --head``
(its GCS, raylet and the rest in the session), and, quicker, a plain member of the runner."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from portal.jobs.runner import _session_pids as session_pids
from portal.ray.local import LocalRay, head_key
from portal.ray.spec import installed_ray_version
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]

STARTER = """
import sys, time
from pathlib import Path
from portal.jobs.runner import LocalRunner, MemberLaunch
from portal.ray.local import LocalRay
from tests.support.ray_guard import nodes_end_with_tests

what, state = sys.argv[1], Path(sys.argv[2])
state.mkdir(parents=True, exist_ok=True)
with nodes_end_with_tests(state):
    if what == "ray":
        LocalRay(state).start_head("guarded", 1, 1)
    else:
        member = MemberLaunch("sleeper", 1, 0, "127.0.0.1", (), ("sleep", "300"), str(state), {})
        LocalRunner(state).launch([member])
    print("started", flush=True)
    time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    "what",
    [
        pytest.param("sleep"),
        pytest.param(
            "ray",
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif(installed_ray_version() is None, reason="no ray"),
            ],
        ),
    ],
)
def test_a_killed_run_leaves_no_ray_node_behind(what: str, tmp_path: Path) -> None:
    state = tmp_path / "nodes"
    key = head_key("guarded") if what == "ray" else "sleeper"
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, what, str(state)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None
    sid = 0
    try:
        assert starter.stdout.readline().strip() == "started"
        wrapper = state / key / "attempt-1" / "rank-0" / "wrapper.json"
        sid = json.loads(wrapper.read_text())["pid"]  # the session's leader
        if what == "ray":  # its GCS and raylet run once it says so
            eventually(lambda: True if LocalRay(state).ready(key, 1) else None, "the head up", 300)
            assert len(session_pids(sid)) > 2
        else:
            eventually(lambda: True if len(session_pids(sid)) >= 2 else None, "the member", 30)

        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=10)
        eventually(
            lambda: True if not session_pids(sid) else None, "the node's every process ended", 90
        )
    finally:
        if starter.poll() is None:
            starter.kill()
        for pid in session_pids(sid) if sid else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if what == "ray":
            LocalRay(state).remove_session("guarded")
        shutil.rmtree(state, ignore_errors=True)
