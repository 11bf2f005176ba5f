"""The Ray controller: runs each Ray cluster as a head plus workers held in slices, each
slice one allocator workload of kind ``ray``.

Because a slice is an ordinary workload (``gang_size`` = its workers), quota, queue
position and reason, fairness, cost and alerts apply to Ray clusters unchanged:

1. **create**: slice 1 (the ``min`` workers) is requested as one gang; the head starts only
   once it is placed, so the head and its first workers start together or not at all (a
   cluster with ``min`` 0 starts its head at once). Workers asked for above ``min`` are a
   slice of their own.
2. **scale**: an increase is requested as a new slice (it waits with its reason when quota
   does not allow it, and nothing running is touched for it); a decrease releases whole
   slices, newest first, within the round (``policies.ray.plan_scale``).
3. **reconcile** (``step``, the service's ``ray`` loop): each placed worker runs pinned to its
   allocation's devices; a worker whose process ended is started again on the same
   allocation (its devices are still the cluster's); a head that ended is started again and
   every worker with it. A slice preempted or lost is released and its workers requested again.
4. **idle** (``idle_s``): every few seconds (``idle_check_s``) the head's GCS is asked how
   long each node has been idle (``portal.ray.idle``, in a thread of its own: the read costs
   seconds; the local backend's heads, or an outside backend's through ``heads``); once
   every node has been idle for ``idle_s``, every slice is released and the workers stopped,
   keeping the head (state ``idle``), or with ``idle_suspend`` the head too (``suspended``).
   ``resume`` asks for the previous size again through admission. Growth on demand
   (``autoscale``) acts on the same read; both are ``portal.ray.idleround``.
5. **delete**: every node is stopped and every slice released at once.

Every change is committed through the store (``ChangeSet.ray_clusters``/``ray_slices``)
before memory changes; the controller is the only writer of Ray clusters, under its lock.
The local backend's node processes (which start of each runs, which have joined) are kept by
``portal.ray.nodes``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from policies.errors import Conflict, InvalidRequest, NotFound, PortalError, Unavailable
from policies.ray import RayState, SliceFacts, SliceState, check_bounds, plan_scale
from policies.requests import WorkloadKind, WorkloadRequest
from portal.allocator import Allocator, WorkloadStatus
from portal.jobs.launch import visible_devices
from portal.jobs.spec import ClusterFacts
from portal.ray.idle import IDLE_CHECK_S, HeadReads, IdleReads
from portal.ray.idleround import IdleRound
from portal.ray.local import LocalRay, head_key, worker_key
from portal.ray.nodes import RayNodes
from portal.ray.spec import (
    RaySpec,
    _worker_field,
    check_tenant_flavors,
    check_version,
    cluster_spec,
    fits_cluster,
    installed_ray_version,
)
from portal.store import ray as stored
from portal.store.records import (
    ChangeSet,
    EventRecord,
    RayClusterRecord,
    RaySliceRecord,
    WorkloadState,
)
from portal.store.writer import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SliceView:
    slice: RaySliceRecord
    workload: WorkloadStatus | None


@dataclass(frozen=True, slots=True)
class RayView:
    """A cluster as its owner sees it: the record, its slices with their workloads (queue
    reason and position while one waits), and how many workers have joined."""

    cluster: RayClusterRecord
    slices: tuple[SliceView, ...]
    joined: int


class RayController:
    """Ray clusters over one allocator. Thread-safe. Without a ``backend`` it takes, lists,
    scales and deletes clusters and holds their slices, but starts no process."""

    def __init__(
        self,
        alloc: Allocator,
        *,
        backend: LocalRay | None = None,
        refuse: str | None = None,
        installed: str | None = None,
        clock: Callable[[], datetime] | None = None,
        idle_check_s: float = IDLE_CHECK_S,
        heads: HeadReads | None = None,
    ) -> None:
        self._alloc = alloc
        self.backend = backend
        self._refuse = refuse
        self.installed = installed if installed is not None else installed_ray_version()
        self._clock = clock
        self._lock = threading.RLock()
        self._nodes = RayNodes(backend) if backend is not None else None
        self._started = False
        self._last_created: datetime | None = None
        # How heads are read: the local backend's, or an outside backend's (``portal.ray.kube``
        # reads its heads through their Services); without one, nothing is read.
        read = heads or (backend.read_heads if backend is not None else None)
        self._idle = (
            IdleRound(IdleReads(read, idle_check_s), alloc, self) if read is not None else None
        )
        # Workers joined, as an outside backend (``portal.ray.kube``) last observed them.
        self._observed: dict[str, int] = {}

    @property
    def now(self) -> datetime:
        return (self._clock or self._alloc.clock)()

    @property
    def lock(self) -> threading.RLock:
        """Held by every writer of Ray state (``portal.ray.jobs`` too)."""
        return self._lock

    @property
    def store(self) -> Store:
        return self._alloc.store

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Re-adopt the nodes that still run after a portal restart; stop those of clusters
        that were deleted meanwhile."""
        with self._lock:
            if self._started or self._nodes is None:
                self._started = True
                return
            self._started = True
            self._nodes.adopt({c.id for c in stored.clusters(self._alloc.store, active=True)})

    # ---------------------------------------------------------------- the API's side

    def create(self, spec: RaySpec) -> RayView:
        """Take a cluster and request its slices. Bad input raises before anything is
        created (the allocator's own checks included)."""
        check_version(spec.ray_version, self.installed)
        facts = self._alloc.read(ClusterFacts.of)
        quotas = {q.flavor for q in self._alloc.quotas(spec.tenant) if q.limit > 0}
        check_tenant_flavors(spec.devices, facts, quotas)
        fits_cluster(spec, facts)
        if self._refuse is not None:
            raise Unavailable(self._refuse)
        with self._lock:
            now = self.now
            if self._last_created is not None and now <= self._last_created:
                now = self._last_created + timedelta(microseconds=1)
            self._last_created = now
            cluster = RayClusterRecord(
                id=uuid.uuid4().hex,
                tenant=spec.tenant,
                owner=spec.owner,
                name=spec.name,
                spec=spec.to_dict(),
                state=RayState.QUEUED if spec.min_workers else RayState.STARTING,
                created_at=now,
                updated_at=now,
                message="requested",
                version=1,
            )
            sizes = [n for n in (spec.min_workers, spec.workers - spec.min_workers) if n]
            requested: list[RaySliceRecord] = []
            try:
                for number, workers in enumerate(sizes, start=1):
                    requested.append(self._request_slice(cluster, spec, number, workers))
                self._commit([cluster], requested, "ray.created", cluster, "requested")
            except BaseException:
                for s in requested:
                    self._alloc.release(s.workload_id, reason="Ray cluster not recorded")
                raise
            if self.backend is not None:
                self._reconcile(cluster)
            return self.view(cluster.id)

    def get(self, cluster_id: str) -> RayClusterRecord:
        found = stored.cluster(self._alloc.store, cluster_id)
        if found is None:
            raise NotFound("Ray cluster", cluster_id)
        return found

    def view(self, cluster_id: str) -> RayView:
        return self._view(self.get(cluster_id))

    def clusters(self, tenants: Collection[str] | None = None) -> list[RayView]:
        return [self._view(c) for c in stored.clusters(self._alloc.store, tenants=tenants)]

    def scale(self, cluster_id: str, workers: int, *, why: str = "") -> RayView:
        """Set the worker count: an increase is one new slice, a decrease releases slices.
        ``why`` is said in the cluster's message (the autoscaler's demand)."""
        with self._lock:
            cluster = self.get(cluster_id)
            if cluster.state.terminal:
                raise InvalidRequest("state", cluster.state.value, "a cluster not stopped")
            spec = cluster_spec(cluster)
            check_bounds("workers", workers, spec.min_workers, spec.max_workers)
            before = spec.workers
            new = self._versioned(
                cluster,
                spec={**cluster.spec, "workers": workers},
                message=f"{why}scaled from {before} to {workers} workers",
            )
            self._commit([new], [], "ray.scaled", new, new.message)
            if cluster.state.released:  # the size ``resume`` asks for: nothing held now
                return self.view(cluster_id)
            try:
                self._plan(new)
            except PortalError:
                # Refused (an increase the tenant's limit can never give): keep the old count.
                back = self._versioned(new, spec=cluster.spec, message=cluster.message)
                self._commit([back], [], "ray.scaled", back, f"scale to {workers} refused")
                raise
            if self.backend is not None:
                self._reconcile(self.get(cluster_id))
            return self.view(cluster_id)

    def delete(self, cluster_id: str) -> RayView:
        """Stop every node and release every slice. Idempotent."""
        with self._lock:
            cluster = self.get(cluster_id)
            if not cluster.state.terminal:
                if self._nodes is not None:
                    self._nodes.stop_cluster(cluster_id)
                released = [
                    self._release_slice(s, "Ray cluster deleted")
                    for s in stored.slices(self._alloc.store, cluster_id)
                    if s.state is not SliceState.RELEASED
                ]
                new = self._versioned(
                    cluster, state=RayState.STOPPED, message="deleted", ended_at=self.now
                )
                self._commit([new], released, "ray.stopped", new, "deleted")
                if self._nodes is not None:
                    self._nodes.clean_later(cluster_id)
            return self.view(cluster_id)

    def resume(self, cluster_id: str) -> RayView:
        """Ask for the size an idle (or suspended) cluster had, through admission: its
        slices are requested as at creation and may wait in the queue with their reason.

        Raises:
            Conflict: the cluster was not released for idleness (nothing changes).
        """
        with self._lock:
            cluster = self.get(cluster_id)
            if not cluster.state.released:
                raise Conflict(
                    f"Ray cluster {cluster_id} is {cluster.state.value}: only an idle or "
                    "suspended cluster can be resumed"
                )
            spec = cluster_spec(cluster)
            numbers = [s.number for s in stored.slices(self._alloc.store, cluster_id)]
            first = max(numbers, default=0) + 1
            sizes = [n for n in (spec.min_workers, spec.workers - spec.min_workers) if n]
            requested: list[RaySliceRecord] = []
            new = self._versioned(
                cluster,
                state=RayState.QUEUED if spec.min_workers else RayState.STARTING,
                message=f"resumed: asking for {spec.workers} workers",
            )
            try:
                for number, workers in enumerate(sizes, start=first):
                    requested.append(self._request_slice(new, spec, number, workers))
                self._commit([new], requested, "ray.resumed", new, new.message)
            except BaseException:
                for s in requested:
                    self._alloc.release(s.workload_id, reason="Ray resume not recorded")
                raise
            if self._idle is not None:
                self._idle.forget(cluster_id)
            if self._nodes is not None:
                self._nodes.keep_session(cluster_id)
                self._reconcile(new)
            return self.view(cluster_id)

    def observe(
        self, cluster_id: str, state: RayState, message: str, *, address: str | None, joined: int
    ) -> None:
        """Record where a cluster that an outside backend runs (``portal.ray.kube``: the
        operator's pods) stands. A stopped or released cluster is left as it is."""
        with self._lock:
            cluster = self.get(cluster_id)
            if cluster.state.terminal or cluster.state.released:
                return
            self._observed[cluster_id] = joined
            if address is not None and cluster.address != address:
                cluster = self._versioned(cluster, address=address, head=cluster.head + 1)
                self._commit([cluster], [], "ray.head", cluster, f"head up at {address}")
            self._set_state(cluster, state, message)

    # ---------------------------------------------------------------- the loop's side

    def step(self) -> None:
        """One round: collect node exits, then reconcile every active cluster."""
        with self._lock:
            if not self._started:
                self.start()
            if self._nodes is not None:
                self._nodes.collect_exits()
            active = stored.clusters(self._alloc.store, active=True)
            for cluster in active:
                if cluster.state.released:
                    continue
                try:
                    self._plan(cluster)
                    if self.backend is not None:
                        self._reconcile(self.get(cluster.id))
                except PortalError as exc:
                    log.warning("Ray cluster %s: %s", cluster.id, exc.message)
            if self._idle is not None:
                # Read again: this round's reconcile may have moved some clusters on.
                self._idle.run(stored.clusters(self._alloc.store, active=True))
            if self._nodes is not None:
                self._nodes.clean_sessions()

    # ---------------------------------------------------------------- idleness

    def release_idle(self, cluster_id: str, idle_s: float) -> RayView:
        """Give a cluster idle for ``idle_s`` seconds back: stop its workers and release
        every slice; with ``idle_suspend`` stop the head too.

        Raises:
            Conflict: the cluster is stopped or released already (nothing changes).
        """
        with self._lock:
            cluster = self.get(cluster_id)
            if cluster.state.terminal or cluster.state.released:
                raise Conflict(
                    f"Ray cluster {cluster_id} is {cluster.state.value}: only a cluster that "
                    "holds its slices is released for idleness"
                )
            self._release_idle(cluster, idle_s)
            return self.view(cluster_id)

    def _release_idle(self, cluster: RayClusterRecord, idle_s: float) -> None:
        suspend = cluster_spec(cluster).idle_suspend
        if self._nodes is not None:
            self._nodes.stop_cluster(cluster.id, keep_head=not suspend)
        released = [
            self._release_slice(s, "idle")
            for s in stored.slices(self._alloc.store, cluster.id)
            if s.state is not SliceState.RELEASED
        ]
        what = "every node stopped" if suspend else "workers released, head kept"
        new = self._versioned(
            cluster,
            state=RayState.SUSPENDED if suspend else RayState.IDLE,
            address=None if suspend else cluster.address,
            message=f"idle for {idle_s:.0f} s: {what}; resume brings back "
            f"{cluster_spec(cluster).workers} workers",
        )
        self._commit([new], released, f"ray.{new.state.value}", new, new.message)
        self._observed.pop(cluster.id, None)  # an outside backend's workers go with the slices
        if suspend and self._nodes is not None:
            self._nodes.clean_later(cluster.id)

    # ---------------------------------------------------------------- slices

    def _plan(self, cluster: RayClusterRecord) -> None:
        """Bring the slices in line with the allocator and the wanted count: record slices
        placed or ended outside, release the slices a decrease gives back, request one for
        an increase."""
        spec = cluster_spec(cluster)
        changed: list[RaySliceRecord] = []
        live: list[RaySliceRecord] = []
        for s in stored.slices(self._alloc.store, cluster.id):
            if s.state is SliceState.RELEASED:
                continue
            st = self._workload(s.workload_id)
            if st is None or st.state.terminal or st.state is WorkloadState.PREEMPTING:
                why = "workload gone" if st is None else (st.reason or st.state.value)
                self._stop_slice_nodes(cluster.id, s.number)
                changed.append(self._release_slice(s, why))
                continue
            if st.state is WorkloadState.RUNNING and s.state is SliceState.QUEUED:
                s = replace(s, state=SliceState.RUNNING, started_at=self.now)
                changed.append(s)
            live.append(s)
        plan = plan_scale([SliceFacts(s.number, s.workers) for s in live], spec.workers)
        for s in live:
            if s.number in plan.release:
                self._stop_slice_nodes(cluster.id, s.number)
                changed.append(self._release_slice(s, "scaled down"))
        if plan.request:
            numbers = [s.number for s in stored.slices(self._alloc.store, cluster.id)]
            changed.append(
                self._request_slice(cluster, spec, max(numbers, default=0) + 1, plan.request)
            )
        if changed:
            self._commit([], changed, "ray.slices", cluster, _slices_note(changed))

    def _request_slice(
        self, cluster: RayClusterRecord, spec: RaySpec, number: int, workers: int
    ) -> RaySliceRecord:
        request = WorkloadRequest(
            tenant=cluster.tenant,
            owner=cluster.owner,
            name=f"{cluster.name} slice {number}",
            devices=spec.devices,
            kind=WorkloadKind.RAY,
            gang_size=workers,
            priority=spec.priority,
            labels={"ray_cluster": cluster.id},
        )
        try:
            status = self._alloc.request(request)
        except InvalidRequest as exc:
            raise _worker_field(exc) from None
        running = status.state is WorkloadState.RUNNING
        return RaySliceRecord(
            cluster_id=cluster.id,
            number=number,
            workload_id=status.id,
            workers=workers,
            state=SliceState.RUNNING if running else SliceState.QUEUED,
            requested_at=self.now,
            started_at=self.now if running else None,
        )

    def _release_slice(self, s: RaySliceRecord, reason: str) -> RaySliceRecord:
        self._alloc.release(s.workload_id, reason=f"Ray slice released: {reason}")
        return replace(s, state=SliceState.RELEASED, released_at=self.now, reason=reason)

    # ---------------------------------------------------------------- processes

    def _reconcile(self, cluster: RayClusterRecord) -> None:
        """Start what should run and is not: the head once slice 1 is placed, then every
        placed worker; and say where the cluster stands."""
        nodes = self._nodes
        assert nodes is not None
        spec = cluster_spec(cluster)
        slices = [
            s
            for s in stored.slices(self._alloc.store, cluster.id)
            if s.state is not SliceState.RELEASED
        ]
        running = [s for s in slices if s.state is SliceState.RUNNING]
        # The gang is the oldest live slice (slice 1, or the one requested again in its
        # place): the head waits for it, and nothing starts before the head.
        gang = slices[0] if slices else None
        if spec.min_workers and (gang is None or gang.state is not SliceState.RUNNING):
            st = self._workload(gang.workload_id) if gang else None
            self._set_state(cluster, RayState.QUEUED, st.message if st else "queued")
            return
        head = head_key(cluster.id)
        if not nodes.runs(head):
            cluster = self._start_head(nodes, cluster, spec)
        head_ready = nodes.is_ready(head)
        wanted = 0
        for s in running:
            st = self._workload(s.workload_id)
            if st is None:
                continue
            for a in st.allocations:
                key = worker_key(cluster.id, s.number, a.member)
                wanted += 1
                if not nodes.runs(key) and head_ready and cluster.address:
                    if nodes.starting(cluster.id):
                        continue
                    address = cluster.address
                    nodes.start_worker(key, address, visible_devices(a), spec.worker_cpus)
        joined = nodes.joined(cluster.id)
        queued = [s for s in slices if s.state is SliceState.QUEUED]
        if head_ready and joined >= wanted:
            note = f"{joined} workers joined"
            if queued:
                st = self._workload(queued[0].workload_id)
                note += f"; +{queued[0].workers} waiting: {st.message if st else 'queued'}"
            self._set_state(cluster, RayState.RUNNING, note)
        else:
            self._set_state(
                cluster,
                RayState.STARTING,
                f"head {'up' if head_ready else 'starting'}, {joined} of {wanted} workers joined",
            )

    def _start_head(
        self, nodes: RayNodes, cluster: RayClusterRecord, spec: RaySpec
    ) -> RayClusterRecord:
        address, start = nodes.launch_head(cluster.id, spec.head_cpus)
        new = self._versioned(
            cluster, address=address, head=cluster.head + 1, message="head starting"
        )
        self._commit([new], [], "ray.head", new, f"{cluster.name}: head started at {address}")
        nodes.record(head_key(cluster.id), start)
        return new

    def _stop_slice_nodes(self, cluster_id: str, number: int) -> None:
        if self._nodes is not None:
            self._nodes.stop_slice(cluster_id, number)

    # ---------------------------------------------------------------- helpers

    def _view(self, cluster: RayClusterRecord) -> RayView:
        views = tuple(
            SliceView(
                s, self._workload(s.workload_id) if s.state is not SliceState.RELEASED else None
            )
            for s in stored.slices(self._alloc.store, cluster.id)
        )
        if cluster.state.terminal:
            joined = 0
        elif self._nodes is None:
            joined = self._observed.get(cluster.id, 0)
        else:
            joined = self._nodes.joined(cluster.id)
        return RayView(cluster, views, joined)

    def _set_state(self, cluster: RayClusterRecord, state: RayState, message: str) -> None:
        if cluster.state is state and cluster.message == message:
            return
        new = self._versioned(cluster, state=state, message=message)
        kind = f"ray.{state.value}"
        self._commit([new], [], kind, new, f"{cluster.name}: {message}")

    def _workload(self, workload_id: str) -> WorkloadStatus | None:
        try:
            return self._alloc.status(workload_id)
        except NotFound:
            return None

    def _versioned(self, cluster: RayClusterRecord, **changes: object) -> RayClusterRecord:
        return replace(cluster, updated_at=self.now, version=cluster.version + 1, **changes)  # type: ignore[arg-type]

    def _commit(
        self,
        clusters: list[RayClusterRecord],
        slices: list[RaySliceRecord],
        kind: str,
        cluster: RayClusterRecord,
        message: str,
    ) -> None:
        event = EventRecord(self.now, kind, cluster.tenant, None, message, {"ray": cluster.id})
        self._alloc.store.commit(
            ChangeSet(ray_clusters=clusters, ray_slices=slices, events=[event])
        )


def _slices_note(changed: list[RaySliceRecord]) -> str:
    return "; ".join(f"slice {s.number} ({s.workers} workers) {s.state.value}" for s in changed)
