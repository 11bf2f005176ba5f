"""The local backend of Ray clusters: each node a real ``ray start --block`` on this host.

Every node (the head, and each worker) runs as one member of the job runner
(``portal.jobs.runner.LocalRunner``), so it gets what job members get: a session and process
group of its own (it outlives the portal; a stop signals the whole group), its output in a log
under the state directory, and re-adoption by a restarted portal. A node is named
``<cluster>.head`` or ``<cluster>.s<slice>.m<member>``; each start of it is a new attempt
number of that name, so a replaced worker's log sits beside the one it replaced.

The head is CPU-only (``--num-gpus 0``); a worker is pinned with ``CUDA_VISIBLE_DEVICES`` to
the devices its allocation holds and started with ``--num-gpus`` to match, so Ray hands those
same devices to the tasks it runs there. Every port a node opens is chosen free on loopback,
so several clusters share one host.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from portal.jobs.launch import free_port
from portal.jobs.runner import LocalRunner, MemberExit, MemberLaunch
from portal.ray import idle

HOST = "127.0.0.1"
READY_LINE = "Ray runtime started"
"""What ``ray start`` prints once its node has joined (the head: once it serves)."""

OBJECT_STORE_BYTES = 256 * 1024 * 1024
"""Each node's object store: small, since the local backend shares one host's memory."""

_NODE_PORTS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)
_ATTEMPT = re.compile(r"attempt-(\d+)")


def head_key(cluster_id: str) -> str:
    return f"{cluster_id}.head"


def worker_key(cluster_id: str, slice_number: int, member: int) -> str:
    return f"{cluster_id}.s{slice_number}.m{member}"


def cluster_of(key: str) -> str:
    """The cluster a node name belongs to."""
    return key.split(".", 1)[0]


def ray_program() -> str:
    """The ``ray`` command installed beside this interpreter."""
    return str(Path(sys.executable).with_name("ray"))


@dataclass(frozen=True, slots=True)
class NodeExit:
    key: str
    start: int
    code: int | None


class LocalRay:
    """Starts, stops and watches Ray nodes on this host; state lives in ``state_dir``."""

    def __init__(self, state_dir: Path, *, program: str | None = None) -> None:
        self._root = state_dir
        self.runner = LocalRunner(state_dir)
        self._program = program or ray_program()

    def _temp_dir(self, cluster_id: str) -> str:
        # Ray's sockets live under its temp dir and a socket path may not pass 107 bytes:
        # a short folder of the system's temporary directory, not the state directory.
        return str(Path(tempfile.gettempdir()) / f"gpuportal-ray-{cluster_id[:16]}")

    def _common(self, cluster_id: str, cpus: int) -> list[str]:
        args = [
            "--block",
            "--node-ip-address",
            HOST,
            "--num-cpus",
            str(cpus),
            "--object-store-memory",
            str(OBJECT_STORE_BYTES),
            "--temp-dir",
            self._temp_dir(cluster_id),
            "--disable-usage-stats",
        ]
        for flag in _NODE_PORTS:
            args += [flag, str(free_port(HOST))]
        return args

    def next_start(self, key: str) -> int:
        """The next start number of node ``key`` (the runner never reuses one)."""
        used = [
            int(m.group(1))
            for p in (self._root / key).glob("attempt-*")
            if (m := _ATTEMPT.fullmatch(p.name))
        ]
        return max(used, default=0) + 1

    def start_head(self, cluster_id: str, start: int, cpus: int) -> str:
        """Start the head; returns its address (``host:port``) for workers and ``ray.init``."""
        port = free_port(HOST)
        command = [
            self._program,
            "start",
            "--head",
            "--port",
            str(port),
            "--include-dashboard",
            "false",
            "--num-gpus",
            "0",
            *self._common(cluster_id, cpus),
        ]
        self._launch(head_key(cluster_id), start, command, ())
        return f"{HOST}:{port}"

    def start_worker(
        self, key: str, start: int, address: str, devices: Sequence[str], cpus: int
    ) -> None:
        command = [
            self._program,
            "start",
            "--address",
            address,
            "--num-gpus",
            str(len(devices)),
            *self._common(cluster_of(key), cpus),
        ]
        self._launch(key, start, command, tuple(devices))

    def _launch(self, key: str, start: int, command: list[str], devices: tuple[str, ...]) -> None:
        self._root.mkdir(parents=True, exist_ok=True)
        self.runner.launch(
            [
                MemberLaunch(
                    job_id=key,
                    attempt=start,
                    rank=0,
                    node=HOST,
                    devices=devices,
                    command=tuple(command),
                    cwd=str(self._root),
                    env={"RAY_USAGE_STATS_ENABLED": "0"},
                )
            ]
        )

    def ready(self, key: str, start: int) -> bool:
        """Whether the node's ``ray start`` reported that it joined."""
        path = self.log_path(key, start)
        try:
            return READY_LINE in path.read_text(errors="replace")
        except FileNotFoundError:
            return False

    def log_path(self, key: str, start: int) -> Path:
        return self.runner.log_path(key, start, 0)

    def stop(self, key: str, start: int, grace_s: float) -> None:
        """SIGTERM to the node's process group now; SIGKILL from ``poll`` after ``grace_s``."""
        self.runner.stop(key, start, grace_s, wait=False)

    def poll(self) -> list[NodeExit]:
        return [_node_exit(e) for e in self.runner.poll()]

    def read_heads(self, due: Sequence[idle.Due]) -> dict[str, idle.HeadRead | None]:
        """Each head's nodes' idle milliseconds and unmet GPU demand (``portal.ray.idle``);
        blocks for seconds. Local heads run without authentication."""
        return idle.read_heads(idle.probe_python(self._program), {d.address: None for d in due})

    def remove_session(self, cluster_id: str) -> None:
        """Remove the cluster's Ray temp dir (sessions, sockets, logs, spilled objects):
        called once none of its nodes runs."""
        shutil.rmtree(self._temp_dir(cluster_id), ignore_errors=True)

    def session_dir(self, cluster_id: str) -> Path:
        return Path(self._temp_dir(cluster_id))

    def adopt(self) -> list[tuple[str, int]]:
        """The nodes still running after a portal restart, as ``(key, start)``."""
        return list(self.runner.adopt())


def _node_exit(e: MemberExit) -> NodeExit:
    code = e.exit_code if e.exit_code is not None else (128 + e.signal if e.signal else None)
    return NodeExit(e.job_id, e.attempt, code)
