"""What the job controller needs of a backend: a runner of members, and where rank 0 listens.

The local backend's runner is ``portal.jobs.runner.LocalRunner``; the launches and exits it
takes and reports (``MemberLaunch``, ``MemberExit``) and the rendezvous environment
(``portal.jobs.rendezvous``) and checkpoint contract (``portal.jobs.checkpoints``) are the
same for every backend. The controller sees a runner only through ``Runner``, so its tests
can run a stand-in where no process may be started (exits on a manual clock).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from portal.jobs.runner import LocalRunner, MemberExit, MemberLaunch
from portal.jobs.spec import Backend as BackendKind


class Runner(Protocol):
    """Runs the members of an attempt (``portal.jobs.runner.LocalRunner``).

    ``launch`` starts every member or none (raising ``RunnerError``); ``stop`` sends SIGTERM
    to each member's process group and SIGKILL after ``grace_s``; ``poll`` returns the exits
    seen since the last poll, in the order the members ended; ``adopt`` re-adopts, after a
    portal restart, the attempts still running, as ``(job_id, attempt)``. The controller stops
    with ``wait=False``: the SIGTERM is sent at once and ``poll`` sends the SIGKILL once the
    grace is over, so no round of the controller waits out a grace period."""

    def launch(self, members: Sequence[MemberLaunch]) -> None: ...
    def stop(self, job_id: str, attempt: int, grace_s: float, *, wait: bool = True) -> None: ...
    def poll(self) -> Sequence[MemberExit]: ...
    def adopt(self) -> Sequence[tuple[str, int]]: ...
    def log_path(self, job_id: str, attempt: int, rank: int) -> Path: ...


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Up to ``limit`` bytes of a member's log from an offset; ``size`` is the whole log's
    length as far as it is known; ``unavailable`` says why there is no log to read ('' when
    there is one)."""

    data: bytes
    size: int
    unavailable: str = ""


def read_file_log(path: Path, offset: int, limit: int) -> LogChunk:
    """Up to ``limit`` bytes of a log file from ``offset`` (none yet: empty)."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset)
            return LogChunk(f.read(limit), size)
    except FileNotFoundError:
        return LogChunk(b"", 0)


@runtime_checkable
class LogReader(Protocol):
    """A runner whose logs are not files on this host (a pod's log, read through the API)."""

    def read_log(
        self, job_id: str, attempt: int, rank: int, offset: int, limit: int
    ) -> LogChunk: ...


@dataclass(frozen=True, slots=True)
class Backend:
    """What the controller uses of a backend. ``master_addr``: where rank 0 listens
    (loopback for the local backend); ``rendezvous``, when set, gives it per attempt instead,
    as ``(address, port)`` from ``(job_id, attempt)`` (a pod's stable name on Kubernetes)."""

    kind: BackendKind
    runner: Runner
    master_addr: str = "127.0.0.1"
    rendezvous: Callable[[str, int], tuple[str, int]] | None = None


def local_backend(state_dir: Path) -> Backend:
    """The local process backend, logging and keeping its state under ``state_dir``."""
    return Backend(kind=BackendKind.LOCAL, runner=LocalRunner(state_dir))


def merged_env(user: Mapping[str, str], rendezvous: Mapping[str, str]) -> dict[str, str]:
    """A member's environment: the job's own variables, then the portal's (which the spec
    never lets the job set itself)."""
    return {**user, **rendezvous}
