"""The idle and growth part of the Ray controller's round (``portal.ray.controller``, step 4):
acts on the heads' last read (``portal.ray.idle``): a cluster every node of which has been idle
for its ``idle_s`` is given back, an autoscaled one with GPU demand Ray could not schedule asks
for the workers it needs; then the next read starts when due.

It decides; the controller acts (``release_idle``, ``scale``) and commits, so a release or an
increase made here is the same as one asked for through the API.
"""

from __future__ import annotations

import logging
from typing import Protocol

from policies.errors import PortalError
from policies.ray import RayState, SliceState, is_idle, workers_for_demand
from portal.allocator import Allocator
from portal.jobs.spec import ClusterFacts
from portal.ray.idle import Due, HeadRead, IdleReads
from portal.ray.spec import RaySpec, candidate_flavors, cluster_spec
from portal.store import ray as stored
from portal.store.records import RayClusterRecord

log = logging.getLogger(__name__)


class Clusters(Protocol):
    """What the round needs of the controller (``RayController``)."""

    def get(self, cluster_id: str) -> RayClusterRecord: ...

    def release_idle(self, cluster_id: str, idle_s: float) -> object: ...

    def scale(self, cluster_id: str, workers: int, *, why: str = "") -> object: ...


class IdleRound:
    """Idle release and growth on demand for the clusters that ask for either. Not
    thread-safe: the controller calls it under its lock."""

    def __init__(self, reads: IdleReads, alloc: Allocator, clusters: Clusters) -> None:
        self._reads = reads
        self._alloc = alloc
        self._clusters = clusters

    def forget(self, cluster_id: str) -> None:
        """Drop a read made before the cluster was resumed."""
        self._reads.forget(cluster_id)

    def run(self, active: list[RayClusterRecord]) -> None:
        """Act on the last read: release the clusters found idle, grow the autoscaled ones
        with unmet GPU demand; start the next read when due."""
        read = self._reads.take()
        for cluster in active:
            got = read.get(cluster.id)
            if got is None or got[1] is None:
                continue
            now = self._clusters.get(cluster.id)
            spec = cluster_spec(now)
            # A change since the read (a scale, a node replaced, a worker joined) makes it
            # stale.
            if now.version != got[0] or now.state is not RayState.RUNNING:
                continue
            if spec.idle_s is not None and is_idle(got[1].idle_ms, spec.idle_s):
                self._clusters.release_idle(now.id, min(got[1].idle_ms) / 1000.0)
            elif spec.autoscale and got[1].gpu_demand:
                self._grow_on_demand(now, spec, got[1])
        self._reads.start_if_due(
            [
                Due(c.id, c.version, c.address)
                for c in active
                if c.state is RayState.RUNNING
                and c.address
                and (cluster_spec(c).idle_s is not None or cluster_spec(c).autoscale)
            ]
        )

    def _grow_on_demand(self, cluster: RayClusterRecord, spec: RaySpec, read: HeadRead) -> None:
        """Ask for the workers Ray's unmet GPU demand needs, as ``scale`` would: one new
        slice, bounded by ``max_workers`` and by what the tenant's limit could ever give.
        Nothing while an increase already waits (the demand read is the one it answers)."""
        live = stored.slices(self._alloc.store, cluster.id)
        if any(s.state is SliceState.QUEUED for s in live):
            return
        facts = self._alloc.read(ClusterFacts.of)
        flavors = set(candidate_flavors(spec.devices, facts.models))
        limit = max(
            (q.limit for q in self._alloc.quotas(cluster.tenant) if q.flavor in flavors),
            default=0,
        )
        room = min(spec.max_workers - spec.workers, limit // max(1, spec.devices.amount()))
        more = workers_for_demand(read.gpu_demand, spec.gpus_per_worker, room)
        if more <= 0:
            return
        pending = sum(n for _, n in read.gpu_demand)
        try:
            self._clusters.scale(
                cluster.id,
                spec.workers + more,
                why=f"autoscaler: {pending} GPU requests pending, ",
            )
        except PortalError as exc:
            log.warning("Ray cluster %s: growth refused: %s", cluster.id, exc.message)
