"""How long each node of a local Ray cluster has been idle, and what GPU demand Ray could
not schedule, read from its head's GCS.

The portal never imports ray (it would load Ray's runtime into the service), so the read
runs in a short child interpreter: the python beside the ``ray`` program, with a script that
asks each head's GCS for the cluster status (``ray.autoscaler.v2.sdk.get_cluster_status``,
which needs no dashboard) and prints every node's ``idle_time_ms`` and the GPU bundles of the
pending tasks, actors and placement groups as JSON. One child reads every cluster due,
because starting an interpreter that imports ray costs seconds of CPU.

Heads with Ray's token authentication (every RayCluster's, ``portal.ray.tokens``) are read
with their own tokens: the child switches its token between heads the way Ray's own tests do.

A node's idle time counts from the end of the last task or actor that held its resources,
so tasks that ran on the head count too.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

IDLE_CHECK_S = 10.0
"""Seconds between reads of the heads' idleness: one read starts an interpreter that imports
ray (seconds of CPU), so it is not done every round of the ``ray`` loop."""

PROBE_TIMEOUT_S = 60.0
"""The longest one read may take (the child imports ray: seconds on a loaded host)."""

GCS_TIMEOUT_S = 5
"""How long the child waits for one head's GCS before it reports that head unread."""

AUTH_ENV = frozenset({"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"})
"""Ray's token settings: the child sets them per head, never inherits the portal's."""

_SCRIPT = """
import json, os, sys
from ray._raylet import AuthenticationTokenLoader, Config
from ray.autoscaler.v2.sdk import get_cluster_status

current = None  # the child starts without Ray's auth variables (the parent drops them)

def use_token(token):
    # Ray loads its token once per process; its own tests switch tokens this way: the
    # variables, then the config (which holds the mode), then the loader's cache.
    global current
    if token == current:
        return
    current = token
    if token:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = token
    else:
        os.environ.pop("RAY_AUTH_MODE", None)
        os.environ.pop("RAY_AUTH_TOKEN", None)
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()

out = {}
for address, token in json.load(sys.stdin).items():
    try:
        use_token(token)
        s = get_cluster_status(address, timeout=int(sys.argv[1]))
        d = s.resource_demands
        out[address] = {
            "idle": [
                n.resource_usage.idle_time_ms if n.resource_usage is not None else 0
                for n in s.active_nodes + s.idle_nodes
            ],
            "demand": [
                [b.bundle.get("GPU", 0), b.count]
                for r in d.ray_task_actor_demand + d.placement_group_demand
                for b in r.bundles_by_count
                if b.bundle.get("GPU", 0) > 0
            ],
        }
    except Exception as exc:
        out[address] = repr(exc)[:300]
print(json.dumps(out))
"""


def probe_python(ray_program: str) -> str:
    """The interpreter of the environment ``ray_program`` belongs to (this one otherwise)."""
    beside = Path(ray_program).with_name("python")
    return str(beside) if beside.exists() else sys.executable


@dataclass(frozen=True, slots=True)
class HeadRead:
    """One head's answer: every live node's idle milliseconds, and the GPU bundles Ray could
    not schedule as ``(GPUs of one bundle, how many)``."""

    idle_ms: tuple[int, ...]
    gpu_demand: tuple[tuple[float, int], ...] = ()


def _head_read(value: object) -> HeadRead | None:
    if not isinstance(value, dict):
        return None
    return HeadRead(
        tuple(int(v) for v in value.get("idle", [])),
        tuple((float(g), int(n)) for g, n in value.get("demand", [])),
    )


def read_heads(python: str, heads: Mapping[str, str | None]) -> dict[str, HeadRead | None]:
    """Each head address -> what its GCS reports, or None where the head did not answer or
    refused the read (a failed read never counts as idle, nor as demand). ``heads`` maps
    each address to the token its head wants (None: the head has no authentication); the
    tokens reach the child on its stdin, never on its command line."""
    addresses = list(heads)
    if not addresses:
        return {}
    try:
        done = subprocess.run(
            [python, "-c", _SCRIPT, str(GCS_TIMEOUT_S)],
            input=json.dumps(dict(heads)),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
            env={
                **{k: v for k, v in os.environ.items() if k not in AUTH_ENV},
                "RAY_USAGE_STATS_ENABLED": "0",
            },
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("Ray idle read failed: %s", exc)
        return dict.fromkeys(addresses)
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        log.warning(
            "Ray idle read gave no answer (exit %s): %s", done.returncode, done.stderr[-500:]
        )
        return dict.fromkeys(addresses)
    result: dict[str, HeadRead | None] = {}
    for address in addresses:
        value = found.get(address)
        result[address] = _head_read(value)
        if result[address] is None and "AuthenticationError" in str(value):
            # The cluster is left as it is (unread), but an operator must see why.
            log.warning("Ray head %s refused the portal's token: %s", address, value)
        elif result[address] is None:
            log.info("Ray read of %s: %s", address, value)
    return result


@dataclass(frozen=True, slots=True)
class Due:
    """A running cluster with ``idle_s`` or ``autoscale`` to read: its id, its record's
    version (a read made before the record changed is stale), and its head's address."""

    cluster_id: str
    version: int
    address: str


HeadReads = Callable[[Sequence[Due]], dict[str, HeadRead | None]]
"""How a backend reads the heads due: each head's address -> its answer (None: unread)."""


class IdleReads:
    """Reads idleness and demand in a thread of its own, at most every ``every_s`` seconds
    and one read at a time, so the controller's round never waits for the child
    interpreter."""

    def __init__(self, read: HeadReads, every_s: float) -> None:
        self._read = read
        self._every_s = every_s
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._next = 0.0  # monotonic
        self._found: dict[str, tuple[int, HeadRead | None]] = {}

    def take(self) -> dict[str, tuple[int, HeadRead | None]]:
        """What the last finished read found, once: cluster id -> (version read, the head's
        answer or None: unread)."""
        with self._lock:
            found, self._found = self._found, {}
        return found

    def forget(self, cluster_id: str) -> None:
        with self._lock:
            self._found.pop(cluster_id, None)

    def start_if_due(self, due: Sequence[Due]) -> None:
        busy = self._thread is not None and self._thread.is_alive()
        if not due or busy or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self._every_s
        self._thread = threading.Thread(
            target=self._run, args=(tuple(due),), name="ray-idle", daemon=True
        )
        self._thread.start()

    def _run(self, due: tuple[Due, ...]) -> None:
        began = time.monotonic()
        times = self._read(due)
        log.debug("Ray idle read of %d heads took %.2f s", len(due), time.monotonic() - began)
        with self._lock:
            for d in due:
                self._found[d.cluster_id] = (d.version, times.get(d.address))
