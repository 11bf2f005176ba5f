"""The wrapper each job member runs under: ``python -I member.py RECORD_DIR``.

The portal starts one wrapper per member in a session of its own, so the member outlives the
portal. The wrapper starts the member's command in a new process group (the group
``LocalRunner.stop`` signals), with its output in ``output.log``, records the member's pid and
start time in ``member.json``, waits for it, kills what is left of its process group, and writes
how it ended to ``exit.json``. Since a portal that restarted is not the member's parent and
cannot wait for it, ``exit.json`` is how the exit code or signal reaches ``LocalRunner.poll``.

Only the standard library, and run with ``-I``: the wrapper must start whatever the member's
environment or the working directory hold.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

SPEC = "spec.json"
MEMBER = "member.json"
EXIT = "exit.json"
OUTPUT = "output.log"


def boot_id() -> str:
    """This boot of the host: a start time is only comparable within one boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), or ``None`` when there is no
    such process or it has already ended (a zombie waiting to be reaped counts as ended).

    Together with the pid and the boot it names one process for good: a pid the kernel hands to
    a new process later comes with a different start time.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ")": split after the
    # last one. Then field 3 is the state and field 22 the start time.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` so a reader sees the whole file or none: a temporary name, then rename."""
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    partial.replace(path)


def _stay(signum: int, frame: FrameType | None) -> None:
    """Signals meant for the member (a terminal's, a shutdown's) must not end the wrapper before
    it has recorded the member's exit. A handler, not SIG_IGN: the member gets the default
    dispositions back when it execs, where an ignored signal would stay ignored."""


def run(record: Path) -> int:
    spec = json.loads((record / SPEC).read_text())
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stay)
    with (record / OUTPUT).open("ab") as log:
        try:
            child = subprocess.Popen(
                spec["command"],
                cwd=spec["cwd"],
                env=spec["env"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
        except OSError as e:
            reason = f"cannot start {spec['command'][0]!r}: {e.strerror or e}"
            write_json(record / EXIT, {"exit_code": None, "signal": None, "error": reason})
            return 1
    write_json(
        record / MEMBER,
        {"pid": child.pid, "start_time": process_start(child.pid), "boot_id": boot_id()},
    )
    # Wait without reaping: while the ended leader is a zombie its pid stays its group's id,
    # so the kill below cannot reach a process that got the number later.
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    ended_at = time.time()  # which member of a gang died first is why the gang ended
    with contextlib.suppress(ProcessLookupError):
        # Anything the member left in its group (a launcher's workers) would hold the devices
        # of an attempt that has ended.
        os.killpg(child.pid, signal.SIGKILL)
    returncode = child.wait()
    if returncode < 0:
        ended = {"exit_code": None, "signal": -returncode, "at": ended_at}
    else:
        ended = {"exit_code": returncode, "signal": None, "at": ended_at}
    write_json(record / EXIT, ended)
    return 0


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))
