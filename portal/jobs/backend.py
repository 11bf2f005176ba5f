"""What the job controller needs of a backend: a runner of members, the rendezvous
environment and the newest complete checkpoint.

The local backend's parts live in ``portal.jobs.runner`` (``LocalRunner``, ``MemberLaunch``,
``MemberExit``, ``RunnerError``), ``portal.jobs.rendezvous`` (``rendezvous_env``) and
``portal.jobs.checkpoints`` (``newest_complete_checkpoint``). The controller only sees the
``Backend`` bundle below, so its tests can run on a stand-in runner where no process may be
started, and the Kubernetes backend can provide the same four things.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from portal.jobs.spec import Backend as BackendKind


class MemberExitLike(Protocol):
    """An exit a runner observed (``portal.jobs.runner.MemberExit``)."""

    @property
    def job_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def signal(self) -> int | None: ...


class Runner(Protocol):
    """Runs the members of an attempt (``portal.jobs.runner.LocalRunner``).

    ``launch`` starts every member or none (raising the runner's error); ``stop`` sends
    SIGTERM to each member's process group and SIGKILL after ``grace_s``; ``poll`` returns
    the exits seen since the last poll; ``adopt`` re-adopts, after a portal restart, the
    attempts still running, as ``(job_id, attempt)``. The controller stops with
    ``wait=False``: the SIGTERM is sent at once and ``poll`` sends the SIGKILL once the grace
    is over, so no round of the controller waits out a grace period."""

    def launch(self, members: Sequence[Any]) -> None: ...
    def stop(self, job_id: str, attempt: int, grace_s: float, *, wait: bool = True) -> None: ...
    def poll(self) -> Sequence[MemberExitLike]: ...
    def adopt(self) -> Sequence[tuple[str, int]]: ...
    def log_path(self, job_id: str, attempt: int, rank: int) -> Path: ...


MemberLaunchFactory = Callable[..., Any]
"""``MemberLaunch(job_id=, attempt=, rank=, node=, devices=, command=, cwd=, env=)``."""

RendezvousEnv = Callable[..., list[dict[str, str]]]
"""``rendezvous_env(job_id, attempt, members, master_addr, master_port, checkpoint_dir,
resume_from)``: one environment per rank."""

NewestCheckpoint = Callable[[Path], tuple[Path, int] | None]


@dataclass(frozen=True, slots=True)
class Backend:
    """Everything the controller uses of a backend. ``master_addr``: where rank 0 listens
    (loopback for the local backend); ``launch_error``: the exception ``launch`` raises when
    it starts nobody."""

    kind: BackendKind
    runner: Runner
    member_launch: MemberLaunchFactory
    rendezvous_env: RendezvousEnv
    newest_checkpoint: NewestCheckpoint
    launch_error: type[Exception]
    master_addr: str = "127.0.0.1"


def local_backend(state_dir: Path) -> Backend:
    """The local process backend, logging and keeping its state under ``state_dir``.

    Raises:
        ModuleNotFoundError: this build has no local runner (``portal.jobs.runner``).
    """
    # Imported by name: the runner, rendezvous and checkpoint modules are the runner's own,
    # and nothing else of the portal depends on them.
    runner = importlib.import_module("portal.jobs.runner")
    rendezvous = importlib.import_module("portal.jobs.rendezvous")
    checkpoints = importlib.import_module("portal.jobs.checkpoints")
    return Backend(
        kind=BackendKind.LOCAL,
        runner=runner.LocalRunner(state_dir),
        member_launch=runner.MemberLaunch,
        rendezvous_env=rendezvous.rendezvous_env,
        newest_checkpoint=checkpoints.newest_complete_checkpoint,
        launch_error=runner.RunnerError,
    )


def merged_env(user: Mapping[str, str], rendezvous: Mapping[str, str]) -> dict[str, str]:
    """A member's environment: the job's own variables, then the portal's (which the spec
    never lets the job set itself)."""
    return {**user, **rendezvous}
