"""The local backend of training jobs: the members of an attempt as processes on this host.

Each member runs under a small wrapper (``portal.jobs.member``) started in a session of its
own, so members neither die with the portal nor depend on it: the wrapper records the member's
pid and start time, waits for it and writes its exit code or signal to a file. A new
``LocalRunner`` on the same state directory (a restarted portal) therefore finds every member
again (``adopt``), and learns how each one ended even though it is not their parent (``poll``).

On disk, one folder per member, ``<state_dir>/<job_id>/attempt-<n>/rank-<r>/``, holds:

- ``spec.json``: what to run (command, working directory, environment), written first;
- ``wrapper.json``: the wrapper's pid, start time and boot id;
- ``member.json``: the member's pid, start time and boot id (its process group is its pid);
- ``output.log``: the member's stdout and stderr;
- ``wrapper.log``: the wrapper's own errors (empty unless something is badly wrong);
- ``kill_at.json``: when a stop's grace period ends (the SIGKILL is due then);
- ``exit.json``: how the member ended: ``exit_code`` or ``signal``, or ``error`` (never ran);
- ``reported``: ``poll`` returned that exit already, so no runner returns it again.

A pid is only trusted together with the start time and boot id it was recorded with, so a pid
the kernel reused for an unrelated process is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from portal.errors import PortalError
from portal.jobs import member as wrapper
from portal.jobs.member import boot_id, process_start, write_json
from portal.store.records import AllocationRecord

__all__ = ["ENV_KEEP", "LocalRunner", "MemberExit", "MemberLaunch", "RunnerError", "member_env"]

ENV_KEEP = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "LD_LIBRARY_PATH",
)
"""The portal's own variables a member inherits (as JupyterHub's ``env_keep`` does for
notebooks): enough to find programs and libraries, and none of the portal's secrets."""

_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_WRAPPER = "wrapper.json"
_WRAPPER_LOG = "wrapper.log"
_REPORTED = "reported"
_KILL_AT = "kill_at.json"
_TICK_S = 0.05


@dataclass(frozen=True, slots=True)
class MemberLaunch:
    """One member (rank) of an attempt, as the controller placed it. ``node`` is recorded,
    not checked: the local backend runs every member on this host."""

    job_id: str
    attempt: int
    rank: int
    node: str
    devices: tuple[str, ...]
    """Values for ``CUDA_VISIBLE_DEVICES``: GPU indices or GPU/MIG UUIDs; empty for no GPU."""
    command: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    """The member's own variables, the rendezvous ones included; laid over ``ENV_KEEP``."""
    image: str | None = None
    """Kubernetes: the container image (the local backend runs ``command`` on this host)."""
    tenant: str = ""
    """Kubernetes: the tenant, whose namespace the member runs in."""
    allocation: AllocationRecord | None = None
    """Kubernetes: the member's devices, as the allocator placed them."""
    kube_job: str | None = None
    weights: str | None = None
    """Kubernetes: the digest of the cached model a replica mounts read-only (the weight
    cache's entry on its node, fetched before the launch)."""
    """Kubernetes: ``namespace/name`` of a Job created outside the portal (kubectl) that this
    attempt runs, instead of a Job the runner creates."""


@dataclass(frozen=True, slots=True)
class MemberExit:
    """How a member ended: ``exit_code`` when it exited, ``signal`` when a signal killed it,
    both ``None`` when it is gone and how it ended is unknown (its wrapper was killed too)."""

    job_id: str
    attempt: int
    rank: int
    exit_code: int | None
    signal: int | None
    node_lost: bool = False
    """The member's node went away (deleted, or not ready for too long): the gang is lost,
    whatever the exit code says."""


class RunnerError(PortalError):
    """The members could not be started or signalled; the message says which and why."""

    code = "runner_failed"


@dataclass(slots=True)
class _Record:
    job_id: str
    attempt: int
    rank: int
    path: Path


def member_env(m: MemberLaunch) -> dict[str, str]:
    """The whole environment of member ``m``: ``ENV_KEEP`` from the portal's, ``m.env`` over
    it, and the devices it is pinned to over both."""
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    env.update(m.env)
    visible = ",".join(m.devices)
    env["CUDA_VISIBLE_DEVICES"] = visible
    env["NVIDIA_VISIBLE_DEVICES"] = visible or "void"
    return env


class LocalRunner:
    """Runs, signals and watches job members on this host; all state lives in ``state_dir``.

    Thread-safe. ``stop`` blocks for up to its grace period (call it off the event loop), or
    returns at once with ``wait=False``, leaving the SIGKILL to ``poll``.
    """

    def __init__(self, state_dir: Path, *, start_timeout_s: float = 30.0) -> None:
        self._root = state_dir
        self._start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._watched: dict[Path, _Record] = {}
        # Wrappers this runner started are its children: they are reaped here, and while
        # unreaped their pids cannot be reused.
        self._children: dict[Path, subprocess.Popen[bytes]] = {}
        self._scanned = False

    # -- paths -----------------------------------------------------------------------------

    def log_path(self, job_id: str, attempt: int, rank: int) -> Path:
        """The member's stdout and stderr (may not exist yet right after ``launch``)."""
        return self._member_dir(job_id, attempt, rank) / wrapper.OUTPUT

    def _attempt_dir(self, job_id: str, attempt: int) -> Path:
        if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
            raise RunnerError(
                f"invalid job id {job_id!r}: expected 1-200 letters, digits, '_', '.' or '-', "
                "starting with a letter or digit"
            )
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise RunnerError(f"invalid attempt {attempt!r}: expected an integer of 1 or more")
        return self._root / job_id / f"attempt-{attempt}"

    def _member_dir(self, job_id: str, attempt: int, rank: int) -> Path:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise RunnerError(f"invalid rank {rank!r}: expected an integer of 0 or more")
        return self._attempt_dir(job_id, attempt) / f"rank-{rank}"

    # -- launch ----------------------------------------------------------------------------

    def launch(self, members: Sequence[MemberLaunch]) -> None:
        """Start every member of one attempt, or none: when one cannot start, those that did
        are killed, the attempt's folder is removed, and ``RunnerError`` says why."""
        ordered = sorted(members, key=lambda m: m.rank)
        attempt_dir = self._validate(ordered)
        with self._lock:
            self._scan()
            if attempt_dir.exists() and any(attempt_dir.iterdir()):
                raise RunnerError(
                    f"job {ordered[0].job_id!r} attempt {ordered[0].attempt} was launched "
                    "already: launch a new attempt number"
                )
            attempt_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            started: list[tuple[_Record, subprocess.Popen[bytes]]] = []
            try:
                for m in ordered:
                    started.append(self._start(m))
                self._await_started(started)
            except BaseException as e:
                self._abort(started, attempt_dir)
                if isinstance(e, RunnerError) or not isinstance(e, Exception):
                    raise
                raise RunnerError(
                    f"cannot launch job {ordered[0].job_id!r} attempt {ordered[0].attempt}: {e}"
                ) from e
            for rec, proc in started:
                self._watched[rec.path] = rec
                self._children[rec.path] = proc

    def _validate(self, members: Sequence[MemberLaunch]) -> Path:
        if not members:
            raise RunnerError("no members to launch: expected at least one")
        first = members[0]
        attempt_dir = self._attempt_dir(first.job_id, first.attempt)
        for position, m in enumerate(members):
            where = f"rank {m.rank} of job {first.job_id!r} attempt {first.attempt}"
            if (m.job_id, m.attempt) != (first.job_id, first.attempt):
                raise RunnerError(
                    f"member of job {m.job_id!r} attempt {m.attempt} in a launch of job "
                    f"{first.job_id!r} attempt {first.attempt}: expected one attempt per launch"
                )
            if m.rank != position:
                raise RunnerError(
                    f"invalid ranks {[x.rank for x in members]}: expected each of "
                    f"0..{len(members) - 1} once"
                )
            if not m.command or not all(isinstance(a, str) and a for a in m.command):
                raise RunnerError(f"invalid command {m.command!r} of {where}: expected a program")
            if not Path(m.cwd).is_dir():
                raise RunnerError(f"invalid working directory {m.cwd!r} of {where}: no such folder")
            for d in m.devices:
                if not d or "," in d:
                    raise RunnerError(
                        f"invalid device {d!r} of {where}: expected a GPU index or UUID"
                    )
            for k, v in m.env.items():
                if not k or "=" in k or "\0" in k or "\0" in v:
                    raise RunnerError(
                        f"invalid environment variable {k!r} of {where}: expected a name "
                        "without '=' and values without NUL"
                    )
        return attempt_dir

    def _start(self, m: MemberLaunch) -> tuple[_Record, subprocess.Popen[bytes]]:
        path = self._member_dir(m.job_id, m.attempt, m.rank)
        path.mkdir(mode=0o700)
        spec = {
            "job_id": m.job_id,
            "attempt": m.attempt,
            "rank": m.rank,
            "node": m.node,
            "devices": list(m.devices),
            "command": list(m.command),
            # The wrapper runs in the record's folder: a relative path means the portal's.
            "cwd": str(Path(m.cwd).resolve()),
            "env": member_env(m),
        }
        write_json(path / wrapper.SPEC, spec)
        with (path / _WRAPPER_LOG).open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-I", wrapper.__file__, str(path)],
                cwd=path,
                env={"PATH": os.environ.get("PATH", os.defpath)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session: the portal's end is not its end
            )
        identity = {"pid": proc.pid, "start_time": process_start(proc.pid), "boot_id": boot_id()}
        write_json(path / _WRAPPER, identity)
        return _Record(m.job_id, m.attempt, m.rank, path), proc

    def _await_started(self, started: list[tuple[_Record, subprocess.Popen[bytes]]]) -> None:
        """Return once every wrapper has started its member; raise when one cannot."""
        deadline = time.monotonic() + self._start_timeout_s
        waiting = list(started)
        while waiting:
            still: list[tuple[_Record, subprocess.Popen[bytes]]] = []
            for rec, proc in waiting:
                if (rec.path / wrapper.MEMBER).exists():
                    continue
                ended = _read_json(rec.path / wrapper.EXIT)
                if ended is not None:
                    raise RunnerError(f"rank {rec.rank}: {ended.get('error', ended)}")
                if proc.poll() is not None:
                    raise RunnerError(
                        f"rank {rec.rank}: the member wrapper ended with {proc.returncode} "
                        f"before starting it: {_tail(rec.path / _WRAPPER_LOG)}"
                    )
                still.append((rec, proc))
            waiting = still
            if waiting and time.monotonic() > deadline:
                ranks = [rec.rank for rec, _ in waiting]
                raise RunnerError(f"ranks {ranks} did not start within {self._start_timeout_s:g} s")
            if waiting:
                time.sleep(_TICK_S)

    def _abort(
        self, started: list[tuple[_Record, subprocess.Popen[bytes]]], attempt_dir: Path
    ) -> None:
        """Kill everything a failed launch started, wrappers and members alike, and forget it.

        Each wrapper leads a session that its member's group belongs to; the wrapper is our
        unreaped child, so that session id cannot name anyone else's processes."""
        for _, proc in started:
            _kill_session(proc.pid)
        for _, proc in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        shutil.rmtree(attempt_dir, ignore_errors=True)

    # -- stop ------------------------------------------------------------------------------

    def stop(self, job_id: str, attempt: int, grace_s: float, *, wait: bool = True) -> None:
        """SIGTERM to every member's process group, then SIGKILL to those still running after
        ``grace_s`` seconds; returns once all have ended (their exits are left for ``poll``).

        With ``wait=False`` it returns right after the SIGTERM, and ``poll`` sends the SIGKILL
        once the grace period is over. The deadline is kept on disk, so the next runner keeps
        it after a restart, and a second stop can only bring it closer. Stopping an attempt
        that has ended already does nothing."""
        if not grace_s >= 0:
            raise RunnerError(f"invalid grace period {grace_s!r} s: expected 0 or more seconds")
        attempt_dir = self._attempt_dir(job_id, attempt)
        records = _records_in(attempt_dir)
        if not records:
            raise RunnerError(f"no members of job {job_id!r} attempt {attempt} on this host")
        running = [r for r in records if not self._ended(r)]
        kill_at = time.time() + grace_s
        for r in running:
            # Recorded before the SIGTERM: a portal that dies in between still kills in time.
            earlier = _kill_deadline(r)
            write_json(
                r.path / _KILL_AT, {"at": kill_at if earlier is None else min(earlier, kill_at)}
            )
            _signal_member(r, signal.SIGTERM)
        if not wait:
            return
        running = self._wait_ended(running, grace_s)
        for r in running:
            _signal_member(r, signal.SIGKILL)
        running = self._wait_ended(running, 10.0)
        if running:
            raise RunnerError(
                f"ranks {[r.rank for r in running]} of job {job_id!r} attempt {attempt} "
                "did not end after SIGKILL"
            )

    def _wait_ended(self, records: list[_Record], timeout_s: float) -> list[_Record]:
        deadline = time.monotonic() + timeout_s
        while True:
            records = [r for r in records if not self._ended(r)]
            if not records or time.monotonic() >= deadline:
                return records
            time.sleep(_TICK_S)

    # -- poll and adopt --------------------------------------------------------------------

    def poll(self) -> list[MemberExit]:
        """Exits observed since the last call, each reported once (across restarts too), in
        the order the members ended: the first exit of a gang is the one that ended it."""
        with self._lock:
            self._scan()
            self._reap()
            exits: list[tuple[float, MemberExit]] = []
            for path, rec in list(self._watched.items()):
                if (path / _REPORTED).exists():  # by another runner on this folder
                    del self._watched[path]
                    continue
                ended = self._exit_of(rec)
                if ended is None:
                    deadline = _kill_deadline(rec)
                    if deadline is not None and time.time() >= deadline:
                        _signal_member(rec, signal.SIGKILL)  # a stop(wait=False) ran out
                    continue
                write_json(path / _REPORTED, {"at": time.time()})
                del self._watched[path]
                exits.append(ended)
            exits.sort(key=lambda e: (e[0], e[1].job_id, e[1].attempt, e[1].rank))
            return [e for _, e in exits]

    def adopt(self) -> list[tuple[str, int]]:
        """After a restart: find every member in the state directory, watch the ones whose
        exit was not reported yet, and return the ``(job_id, attempt)`` pairs that still have
        a member running. Exits that happened while no portal watched come from ``poll``."""
        with self._lock:
            self._scanned = False
            self._scan()
            running = {(r.job_id, r.attempt) for r in self._watched.values() if not self._ended(r)}
            return sorted(running)

    def _scan(self) -> None:
        if self._scanned:
            return
        if self._root.is_dir():
            for attempt_dir in self._root.glob("*/attempt-*"):
                for rec in _records_in(attempt_dir):
                    if not (rec.path / _REPORTED).exists():
                        self._watched.setdefault(rec.path, rec)
        self._scanned = True

    def _reap(self) -> None:
        for path, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[path]

    def _exit_of(self, rec: _Record) -> tuple[float, MemberExit] | None:
        """When and how the member ended, or ``None`` while it runs."""
        ended = _read_json(rec.path / wrapper.EXIT)
        if ended is None:
            if self._alive(rec):
                return None
            # The wrapper may have written it just before it ended; if not, nobody knows.
            ended = _read_json(rec.path / wrapper.EXIT) or {}
        at = float(ended.get("at", time.time()))
        return at, MemberExit(
            rec.job_id, rec.attempt, rec.rank, ended.get("exit_code"), ended.get("signal")
        )

    def _ended(self, rec: _Record) -> bool:
        return (rec.path / wrapper.EXIT).exists() or not self._alive(rec)

    def _alive(self, rec: _Record) -> bool:
        """Whether the member's wrapper or the member itself still runs."""
        proc = self._children.get(rec.path)
        if proc is not None and proc.poll() is None:
            return True
        return _running(rec.path / _WRAPPER) or _running(rec.path / wrapper.MEMBER)


def _records_in(attempt_dir: Path) -> list[_Record]:
    records = []
    for spec_path in sorted(attempt_dir.glob(f"rank-*/{wrapper.SPEC}")):
        spec = _read_json(spec_path)
        if spec is None:
            continue
        records.append(_Record(spec["job_id"], spec["attempt"], spec["rank"], spec_path.parent))
    return records


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data


def _kill_deadline(rec: _Record) -> float | None:
    """When a stop's grace period ends for ``rec`` (seconds since the epoch: it must mean the
    same to the next portal), or ``None`` when nobody stopped it."""
    recorded = _read_json(rec.path / _KILL_AT)
    return None if recorded is None else float(recorded["at"])


def _running(identity_path: Path) -> bool:
    """Whether the process recorded in ``identity_path`` is still that process and running."""
    identity = _read_json(identity_path)
    if identity is None or identity.get("boot_id") != boot_id():
        return False
    started = identity.get("start_time")
    return started is not None and process_start(identity["pid"]) == started


def _signal_member(rec: _Record, signum: int) -> None:
    """Signal the member's process group, only while its leader is the recorded process (after
    it ended, its wrapper cleans the group up itself)."""
    path = rec.path / wrapper.MEMBER
    if _running(path):
        identity = _read_json(path)
        assert identity is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(identity["pid"], signum)


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` until none is left (one may fork meanwhile)."""
    for _ in range(20):
        pids = _session_pids(sid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(_TICK_S)


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        # Field 6 is the session; ended processes (zombies) need no kill.
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no output)"
    return text[-limit:].strip() or "(no output)"
