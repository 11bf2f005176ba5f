"""Which workload a GPU process belongs to.

On Kubernetes a container's processes live in the pod's cgroup, whose path carries the pod UID
(``/kubepods/burstable/pod<uid>/<container>`` with cgroup v1 or the cgroupfs driver,
``kubepods-burstable-pod<uid with _>.slice`` with the systemd driver); the pod, found by UID
among the pods of this node, names the workload in its ``gpuportal.io/workload`` label.

On the local backend the spawner starts each notebook server with ``GPUPORTAL_WORKLOAD_ID`` in
its environment, and JupyterHub adds ``JUPYTERHUB_USER`` and ``JUPYTERHUB_SERVER_NAME``. A
process's own environment is read first, then its parents' (a kernel is a child of the server;
a kernel's own children inherit the variables anyway). Reading another user's
``/proc/<pid>/environ`` needs the agent to run as root or as that user; when it is refused the
process stays unattributed rather than guessed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from policies.isolation import IsolationSettings

WORKLOAD_ENV = "GPUPORTAL_WORKLOAD_ID"
USER_ENV = "JUPYTERHUB_USER"
SERVER_ENV = "JUPYTERHUB_SERVER_NAME"
WORKLOAD_LABEL = IsolationSettings().label("workload")
"""The pod label holding the portal workload id (the spawner writes it)."""

_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
_MAX_ANCESTORS = 32


@dataclass(frozen=True, slots=True)
class Attribution:
    """Who a process works for; the fields of the wire format's ``ProcessSample``."""

    workload_id: str | None = None
    namespace: str | None = None
    pod: str | None = None
    user: str | None = None
    server: str | None = None


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod on this node, as the attribution needs it."""

    namespace: str
    name: str
    workload_id: str | None = None


PodLookup = Callable[[str], PodRef | None]
"""Pod UID → the pod on this node, or ``None`` when no such pod is known."""


def pod_uid(cgroup_text: str) -> str | None:
    """The pod UID in a ``/proc/<pid>/cgroup`` file's text, with dashes; ``None`` if none."""
    for line in cgroup_text.splitlines():
        m = _POD_UID.search(line.rpartition(":")[2])
        if m is not None:
            return m.group(1).replace("_", "-")
    return None


def parse_environ(raw: bytes) -> dict[str, str]:
    """``/proc/<pid>/environ`` (NUL-separated ``NAME=value``) as a dict."""
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _parent(status_text: str) -> int | None:
    for line in status_text.splitlines():
        if line.startswith("PPid:"):
            ppid = int(line.split()[1])
            return ppid if ppid > 1 else None
    return None


def _from_env(env: Mapping[str, str]) -> Attribution | None:
    workload = env.get(WORKLOAD_ENV) or None
    user = env.get(USER_ENV) or None
    if workload is None and user is None:
        return None
    return Attribution(
        workload_id=workload, user=user, server=env.get(SERVER_ENV, "") if user else None
    )


class ProcessAttributor:
    """Maps host PIDs to workloads by reading ``/proc`` (``proc`` is a test's fixture tree).

    ``pods`` resolves pod UIDs on Kubernetes; without it only the environment is read. Results
    are cached per PID until ``forget_except`` drops the PIDs that are gone.
    """

    def __init__(self, proc: Path = Path("/proc"), pods: PodLookup | None = None) -> None:
        self._proc = proc
        self._pods = pods
        self._cache: dict[int, Attribution | None] = {}

    def __call__(self, pid: int) -> Attribution | None:
        if pid not in self._cache:
            self._cache[pid] = self._attribute(pid)
        return self._cache[pid]

    def forget_except(self, live: set[int]) -> None:
        """Drop cached answers of PIDs not in ``live`` (a PID may be reused later)."""
        for pid in set(self._cache) - live:
            del self._cache[pid]

    def _attribute(self, pid: int) -> Attribution | None:
        if self._pods is not None:
            found = self._by_pod(pid)
            if found is not None:
                return found
        current: int | None = pid
        for _ in range(_MAX_ANCESTORS):
            if current is None:
                break
            try:
                env = parse_environ((self._proc / str(current) / "environ").read_bytes())
            except OSError:
                env = {}  # gone, or not ours to read
            found = _from_env(env)
            if found is not None:
                return found
            current = self._parent_of(current)
        return None

    def _by_pod(self, pid: int) -> Attribution | None:
        assert self._pods is not None
        try:
            uid = pod_uid((self._proc / str(pid) / "cgroup").read_text())
        except OSError:
            return None
        ref = self._pods(uid) if uid else None
        if ref is None:
            return None
        return Attribution(workload_id=ref.workload_id, namespace=ref.namespace, pod=ref.name)

    def _parent_of(self, pid: int) -> int | None:
        try:
            return _parent((self._proc / str(pid) / "status").read_text())
        except (OSError, ValueError, IndexError):
            return None
