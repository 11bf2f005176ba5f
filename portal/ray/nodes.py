"""The Ray nodes the local backend runs for the controller (``portal.ray.controller``): which
start of each node runs now, which of them have joined their head, and the clusters whose Ray
temp dir goes once none of their nodes runs. The controller decides what should run; this
keeps the processes in step with its decisions and answers what it needs to decide.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

from portal.jobs.runner import RunnerError
from portal.ray.local import LocalRay, cluster_of, head_key

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0


class RayNodes:
    """The running nodes of every cluster, as started (or adopted after a restart). Not
    thread-safe: the controller calls it under its lock."""

    def __init__(self, backend: LocalRay) -> None:
        self.backend = backend
        # Node name -> the start of it that runs now (launched, or adopted after a restart).
        self._running: dict[str, int] = {}
        self._ready: set[tuple[str, int]] = set()
        # Clusters whose Ray temp dir goes once none of their nodes runs.
        self._to_clean: set[str] = set()

    def adopt(self, active: Collection[str]) -> None:
        """Take the nodes that still run after a portal restart; stop those of clusters that
        are not ``active`` any more (deleted meanwhile)."""
        for key, start in self.backend.adopt():
            if cluster_of(key) in active:
                self._running[key] = max(start, self._running.get(key, 0))
            else:
                self.stop(key, start)

    def collect_exits(self) -> None:
        """Forget the nodes whose process ended (a later round starts them again)."""
        for e in self.backend.poll():
            if self._running.get(e.key) == e.start:
                del self._running[e.key]
                self._ready.discard((e.key, e.start))
                log.info("Ray node %s start %d ended (%s)", e.key, e.start, e.code)

    def runs(self, key: str) -> bool:
        return key in self._running

    def launch_head(self, cluster_id: str, cpus: int) -> tuple[str, int]:
        """Stop the cluster's nodes (workers of a previous head cannot join a new one) and
        start its head; returns its address and start, which ``record`` takes once the
        controller has committed the new address."""
        self.stop_cluster(cluster_id)
        key = head_key(cluster_id)
        start = self.backend.next_start(key)
        return self.backend.start_head(cluster_id, start, cpus), start

    def record(self, key: str, start: int) -> None:
        self._running[key] = start

    def start_worker(self, key: str, address: str, devices: Sequence[str], cpus: int) -> None:
        start = self.backend.next_start(key)
        try:
            self.backend.start_worker(key, start, address, devices, cpus)
        except RunnerError as exc:  # tried again next round
            log.warning("Ray node %s: %s", key, exc.message)
            return
        self._running[key] = start

    def is_ready(self, key: str) -> bool:
        start = self._running.get(key)
        if start is None:
            return False
        if (key, start) not in self._ready and self.backend.ready(key, start):
            self._ready.add((key, start))
        return (key, start) in self._ready

    def starting(self, cluster_id: str) -> bool:
        """Whether a node of the cluster was started and has not joined yet. Nodes start one
        at a time: ``ray start`` gives a node 30 s to register, which simultaneous starts
        on a small host overrun."""
        return any(
            cluster_of(key) == cluster_id and not self.is_ready(key) for key in list(self._running)
        )

    def joined(self, cluster_id: str) -> int:
        """The cluster's workers that have joined (the head not counted)."""
        return sum(
            1
            for key in list(self._running)
            if cluster_of(key) == cluster_id and ".s" in key and self.is_ready(key)
        )

    def stop_cluster(self, cluster_id: str, *, keep_head: bool = False) -> None:
        head = head_key(cluster_id)
        for key, start in list(self._running.items()):
            if cluster_of(key) == cluster_id and not (keep_head and key == head):
                self.stop(key, start)

    def stop_slice(self, cluster_id: str, number: int) -> None:
        prefix = f"{cluster_id}.s{number}."
        for key, start in list(self._running.items()):
            if key.startswith(prefix):
                self.stop(key, start)

    def stop(self, key: str, start: int) -> None:
        self._running.pop(key, None)
        self._ready.discard((key, start))
        try:
            self.backend.stop(key, start, STOP_GRACE_S)
        except RunnerError as exc:  # it ended already
            log.info("Ray node %s: %s", key, exc.message)

    def clean_later(self, cluster_id: str) -> None:
        """Remove the cluster's temp dir once its nodes ended (stopped or suspended)."""
        self._to_clean.add(cluster_id)

    def keep_session(self, cluster_id: str) -> None:
        """Its head starts again in that directory (a resume)."""
        self._to_clean.discard(cluster_id)

    def clean_sessions(self) -> None:
        """Remove the Ray temp dir of each cluster marked ``clean_later`` whose nodes ended
        (a node stops within ``STOP_GRACE_S``)."""
        if not self._to_clean:
            return
        running = {cluster_of(key) for key, _ in self.backend.adopt()}
        for cid in sorted(self._to_clean - running):
            self.backend.remove_session(cid)
            self._to_clean.discard(cid)
