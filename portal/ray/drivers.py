"""Ray job drivers on the local backend: each attempt of a Ray job is its entrypoint run by
``/bin/sh -c`` on this host with ``RAY_ADDRESS`` set to the cluster's head, which is what
Ray's own job supervisor does with an entrypoint. The runtime environment goes to Ray in
``RAY_JOB_CONFIG_JSON_ENV_VAR`` (as the supervisor hands it), so the job's tasks get the same
``env_vars`` and ``working_dir`` as the driver.

A driver runs as one member of the job runner (``portal.jobs.runner.LocalRunner``) in a state
directory of its own, apart from the clusters' nodes: a session and process group of its own
(a stop signals the whole group), its output in a log, re-adoption by a restarted portal.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from portal.jobs.backend import LogChunk, read_file_log
from portal.jobs.runner import LocalRunner, MemberExit, MemberLaunch
from portal.ray.jobspec import RayJobSpec
from portal.ray.local import HOST, ray_program

SHELL = "/bin/sh"


@dataclass(frozen=True, slots=True)
class DriverRun:
    """One attempt of a Ray job's driver, and the cluster (of ``tenant``) it runs against."""

    job_id: str
    attempt: int
    cluster_id: str
    tenant: str


def job_config(spec: RayJobSpec) -> str:
    """``RAY_JOB_CONFIG_JSON_ENV_VAR``: the runtime environment as Ray's job supervisor hands
    it to an entrypoint, so the job's tasks get the driver's ``env_vars`` and ``working_dir``."""
    config: dict[str, Any] = {"runtime_env": spec.runtime_env(), "metadata": dict(spec.metadata)}
    return json.dumps(config)


class Drivers(Protocol):
    """Where Ray job drivers run: this host (``LocalDrivers``) or a tenant's namespace
    (``portal.ray.kubedrivers.KubeDrivers``)."""

    def check(self, spec: RayJobSpec) -> None:
        """Raise ``InvalidRequest`` for what this backend cannot run (before anything is made)."""

    def start(self, run: DriverRun, address: str, spec: RayJobSpec) -> None: ...

    def stop(self, run: DriverRun, grace_s: float) -> None: ...

    def poll(self, running: Sequence[DriverRun]) -> list[MemberExit]:
        """Exits of drivers since the last poll; ``running`` are the attempts the jobs think
        run (a backend that keeps no record of its own reports those that vanished)."""
        ...

    def read_log(self, job_id: str, attempt: int, offset: int, limit: int) -> LogChunk: ...


class LocalDrivers:
    """Starts, stops and watches Ray job drivers on this host; state lives in ``state_dir``."""

    def __init__(self, state_dir: Path, *, program: str | None = None) -> None:
        self._root = state_dir
        self.runner = LocalRunner(state_dir)
        # The driver's ``python`` and ``ray`` are the ones beside the cluster's nodes.
        self._bin = str(Path(program or ray_program()).parent)

    def check(self, spec: RayJobSpec) -> None:
        """Everything a spec holds runs here (``working_dir`` was checked on this host)."""

    def start(self, run: DriverRun, address: str, spec: RayJobSpec) -> None:
        """Run attempt ``run.attempt`` of the job's entrypoint against the head at ``address``."""
        self._root.mkdir(parents=True, exist_ok=True)
        env = {
            **dict(spec.env_vars),
            "PATH": f"{self._bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "RAY_ADDRESS": address,
            "RAY_JOB_CONFIG_JSON_ENV_VAR": job_config(spec),
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
        }
        self.runner.launch(
            [
                MemberLaunch(
                    job_id=run.job_id,
                    attempt=run.attempt,
                    rank=0,
                    node=HOST,
                    devices=(),
                    command=(SHELL, "-c", spec.entrypoint),
                    cwd=spec.working_dir or str(self._root),
                    env=env,
                )
            ]
        )

    def stop(self, run: DriverRun, grace_s: float) -> None:
        """SIGTERM to the driver's process group now; SIGKILL from ``poll`` after ``grace_s``."""
        self.runner.stop(run.job_id, run.attempt, grace_s, wait=False)

    def poll(self, running: Sequence[DriverRun] = ()) -> list[MemberExit]:
        # The runner keeps its own record (re-adopted on restart): ``running`` is not needed.
        return list(self.runner.poll())

    def read_log(self, job_id: str, attempt: int, offset: int, limit: int) -> LogChunk:
        return read_file_log(self.log_path(job_id, attempt), offset, limit)

    def adopt(self) -> list[tuple[str, int]]:
        return list(self.runner.adopt())

    def log_path(self, job_id: str, attempt: int) -> Path:
        return self.runner.log_path(job_id, attempt, 0)
