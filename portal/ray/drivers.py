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
from pathlib import Path

from portal.jobs.runner import LocalRunner, MemberExit, MemberLaunch
from portal.ray.jobspec import RayJobSpec
from portal.ray.local import HOST, ray_program

SHELL = "/bin/sh"


class LocalDrivers:
    """Starts, stops and watches Ray job drivers on this host; state lives in ``state_dir``."""

    def __init__(self, state_dir: Path, *, program: str | None = None) -> None:
        self._root = state_dir
        self.runner = LocalRunner(state_dir)
        # The driver's ``python`` and ``ray`` are the ones beside the cluster's nodes.
        self._bin = str(Path(program or ray_program()).parent)

    def start(self, job_id: str, attempt: int, address: str, spec: RayJobSpec) -> None:
        """Run attempt ``attempt`` of the job's entrypoint against the head at ``address``."""
        self._root.mkdir(parents=True, exist_ok=True)
        env = {
            **dict(spec.env_vars),
            "PATH": f"{self._bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "RAY_ADDRESS": address,
            "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(
                {"runtime_env": spec.runtime_env(), "metadata": dict(spec.metadata)}
            ),
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
        }
        self.runner.launch(
            [
                MemberLaunch(
                    job_id=job_id,
                    attempt=attempt,
                    rank=0,
                    node=HOST,
                    devices=(),
                    command=(SHELL, "-c", spec.entrypoint),
                    cwd=spec.working_dir or str(self._root),
                    env=env,
                )
            ]
        )

    def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        """SIGTERM to the driver's process group now; SIGKILL from ``poll`` after ``grace_s``."""
        self.runner.stop(job_id, attempt, grace_s, wait=False)

    def poll(self) -> list[MemberExit]:
        return list(self.runner.poll())

    def adopt(self) -> list[tuple[str, int]]:
        return list(self.runner.adopt())

    def log_path(self, job_id: str, attempt: int) -> Path:
        return self.runner.log_path(job_id, attempt, 0)
