"""The life of a service's replicas, as the controller's loop advances it: request a workload,
launch the engine on its devices once placed, follow it to ready (or asleep, for the warm pool),
drain and stop it, end it and release its devices; with the record-keeping the controller's
sides share (every change committed through the store before memory changes).

``ReplicaLifecycle`` is the base of ``portal.inference.controller.ServiceController``, which
owns the state declared here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime

from policies.errors import NotFound, PortalError
from policies.jobs import exit_code_of
from policies.requests import WorkloadKind, WorkloadRequest
from policies.services import MAX_START_FAILURES, ReplicaState, ServiceState
from portal.allocator import Allocator, WorkloadStatus
from portal.inference.backend import ServiceBackend, replica_launch
from portal.inference.cached import holders, replica_weights
from portal.inference.drain import Drains, begin, check, revive
from portal.inference.prewarm import WarmSizing, warm_size
from portal.inference.spec import Hold, ServiceSpec
from portal.inference.traffic import TrafficBook
from portal.inference.warm import WARM_PRIORITY, EngineCalls, plan, woken
from portal.jobs.runner import MemberExit, RunnerError
from portal.store import services as stored
from portal.store.records import (
    ChangeSet,
    EventRecord,
    ReplicaRecord,
    ServiceRecord,
    WorkloadState,
)
from portal.store.writer import Store

log = logging.getLogger(__name__)


class ReplicaLifecycle:
    """Advancing replicas, and the shared reads and writes of a ``ServiceController``."""

    _alloc: Allocator
    backend: ServiceBackend | None
    _stop_grace_s: float
    _clock: Callable[[], datetime] | None
    _ready: dict[str, tuple[str, ...]]
    _exits: dict[tuple[str, int], MemberExit]
    _routes: dict[tuple[str, str], tuple[str, Hold]]
    traffic: TrafficBook
    _calls: EngineCalls
    _drains: Drains
    warm_plans: dict[str, WarmSizing]

    @property
    def now(self) -> datetime:
        return (self._clock or self._alloc.clock)()

    def get(self, service_id: str) -> ServiceRecord:
        svc = stored.service(self._alloc.store, service_id)
        if svc is None:
            raise NotFound("service", service_id)
        return svc

    def spec_of(self, svc: ServiceRecord) -> ServiceSpec:
        return ServiceSpec.from_dict(svc.tenant, svc.owner, svc.name, svc.spec)

    @property
    def store(self) -> Store:
        return self._alloc.store

    def _reconcile(self, svc: ServiceRecord, *, refill: bool = True) -> None:
        """Advance the replicas, then request or stop replicas to meet ``desired``."""
        store = self._alloc.store
        live = stored.replicas(store, svc.id, live=True)
        if not live and svc.state is not ServiceState.ACTIVE:
            return
        for r in live:
            svc = self._advance(svc, r)
        live = stored.replicas(store, svc.id, live=True)
        active = svc.state is ServiceState.ACTIVE
        if active and revive(self, svc, live):
            live = stored.replicas(store, svc.id, live=True)
        warm = warm_size(self.spec_of(svc), self.warm_plans.get(svc.id), svc.desired) * active
        todo = plan(live, svc.desired if active else 0, warm)
        for r in todo.stop:
            why = "warm pool shrunk" if r.pooled else "scaled down"
            self._stop(svc, r, why if active else f"service {svc.state.value}")
        for r in todo.wake:
            self._wake(svc, r)
        for _ in range(todo.add_serving):
            svc = self._add_replica(svc)
        for _ in range(todo.add_warm * refill):  # refilled in the round that woke one
            svc = self._add_replica(svc, warm=True)

    def _advance(self, svc: ServiceRecord, r: ReplicaRecord) -> ServiceRecord:
        st = self._workload(r)
        exit_ = self._exits.pop((svc.id, r.number), None)
        if r.state is ReplicaState.QUEUED:
            if st is None or st.state.terminal:
                self._end(svc, r, st.message if st else "workload gone", failed=False)
            elif st.state is WorkloadState.PREEMPTING:
                self._end(svc, r, "preempted while queued", failed=False)
            elif st.state is WorkloadState.RUNNING and self.backend is not None:
                return self._launch(svc, r, st)
            return svc
        if exit_ is not None:
            code = exit_code_of(exit_.exit_code, exit_.signal)
            stopped = r.state is ReplicaState.STOPPING
            reason = r.reason if stopped else f"engine exited with code {code}"
            return self._end(svc, r, reason, failed=r.state is ReplicaState.STARTING)
        preempted = st is not None and st.state is WorkloadState.PREEMPTING
        if self._drains.draining(r) and not preempted:
            check(self, svc, r)
            return svc
        if st is not None and st.state is WorkloadState.PREEMPTING:
            if r.state is not ReplicaState.STOPPING or self._drains.draining(r):
                # The grace the allocator gave, not ours: the claimant waits for exactly it.
                grace = self._stop_grace_s
                if st.preempt_deadline is not None:
                    grace = max(0.0, (st.preempt_deadline - self.now).total_seconds())
                self._stop(svc, r, f"preempted: {st.message}", grace)
            return svc
        # A warm replica's health, sleep and wake are asked outside the lock (``EngineCalls``).
        starting = r.state is ReplicaState.STARTING and not r.warm and r.port is not None
        if starting and self.backend is not None and r.port is not None:
            health = self.spec_of(svc).engine.resolved.health_path
            if self.backend.probe(self.backend.url(r.port, svc.id, r.number) + health):
                ready = replace(r, state=ReplicaState.READY, ready_at=self.now)
                new = self._versioned(svc, failures=0)
                self._commit(
                    [new],
                    [ready],
                    "service.replica_ready",
                    new,
                    f"{svc.name}: replica {r.number} ready",
                )
                return new
        return svc

    def _add_replica(self, svc: ServiceRecord, *, warm: bool = False) -> ServiceRecord:
        spec = self.spec_of(svc)
        number = svc.next_replica
        status = self._alloc.request(
            WorkloadRequest(
                tenant=svc.tenant,
                owner=svc.owner,
                name=f"{svc.name}-{number}",
                devices=spec.devices,
                kind=WorkloadKind.INFERENCE,
                priority=WARM_PRIORITY if warm else spec.priority,
                labels={"service": svc.id},
                prefer_nodes=holders(self.backend, spec.model.digest, svc.tenant),
            )
        )
        rep = ReplicaRecord(svc.id, number, status.id, ReplicaState.QUEUED, self.now, warm=warm)
        new = self._versioned(svc, next_replica=number + 1)
        where = "placed" if status.state is WorkloadState.RUNNING else f"queued ({status.reason})"
        where = f"(warm) {where}" if warm else where
        try:
            self._commit([new], [rep], "service.replica_requested", new,
                         f"{svc.name}: replica {number} {where}")  # fmt: skip
        except BaseException:
            self._alloc.release(status.id, reason="replica not recorded")
            raise
        if status.state is WorkloadState.RUNNING and self.backend is not None:
            new = self._launch(new, rep, status)
        return new

    def _launch(self, svc: ServiceRecord, r: ReplicaRecord, st: WorkloadStatus) -> ServiceRecord:
        assert self.backend is not None
        (allocation,) = st.allocations
        try:  # the weights first: a replica starts only on a checked, read-only copy
            got = replica_weights(self.backend, self.store, svc, allocation.node, self.now)
        except PortalError as exc:
            return self._end(svc, r, f"weights refused: {exc.message}", failed=True)
        if not got.ready:
            return svc  # fetched on the node meanwhile: the next round asks again
        how = got.how
        spec = self.spec_of(svc)
        launch, port = replica_launch(
            self.backend, svc.id, r.number, spec, allocation, None, got.path
        )
        try:
            self.backend.runner.launch([launch])
        except RunnerError as exc:
            return self._end(svc, r, f"launch failed: {exc.message}", failed=True)
        started = replace(
            r,
            state=ReplicaState.STARTING,
            node=allocation.node,
            devices=launch.devices,
            port=port,
            started_at=self.now,
        )
        self._commit(
            [], [started], "service.replica_started", svc,
            f"{svc.name}: replica {r.number} starting on {allocation.node} "
            f"(devices {','.join(launch.devices) or 'none'}, port {port})"
            + (f"; {how}" if how else ""),
        )  # fmt: skip
        return svc

    def _stop(
        self, svc: ServiceRecord, r: ReplicaRecord, reason: str, grace_s: float | None = None
    ) -> None:
        """A queued replica leaves the queue at once; a ready one drains first (unless
        preempted: ``grace_s`` given); a running one is told to stop and keeps its devices
        until its process has ended."""
        if r.state is ReplicaState.QUEUED or self.backend is None:
            self._end(svc, r, reason, failed=False)
            return
        draining = r.state is ReplicaState.READY and grace_s is None and r.port is not None
        if draining and begin(self, svc, r, reason):
            return
        self._signal(svc, r, reason, self._stop_grace_s if grace_s is None else grace_s)

    def _signal(self, svc: ServiceRecord, r: ReplicaRecord, reason: str, grace: float) -> None:
        assert self.backend is not None
        self._drains.end(r)
        try:
            self.backend.runner.stop(svc.id, r.number, grace, wait=False)
        except RunnerError:
            self._end(svc, r, reason, failed=False)
            return
        stopping = replace(r, state=ReplicaState.STOPPING, reason=reason)
        self._commit([], [stopping], "service.replica_stopping", svc,
                     f"{svc.name}: replica {r.number} stopping: {reason}")  # fmt: skip

    def _end(
        self, svc: ServiceRecord, r: ReplicaRecord, reason: str, *, failed: bool
    ) -> ServiceRecord:
        """Record the replica's end, then release its workload (after the commit: a failed
        commit leaves the devices with a replica the next round still sees)."""
        self._drains.end(r)
        ended = replace(r, state=ReplicaState.ENDED, ended_at=self.now, reason=reason)
        changes: dict[str, object] = {}
        message = f"{svc.name}: replica {r.number} ended: {reason}"
        if failed:
            changes["failures"] = svc.failures + 1
            if svc.failures + 1 >= MAX_START_FAILURES and svc.state is ServiceState.ACTIVE:
                changes["state"] = ServiceState.FAILED
                changes["message"] = (
                    f"{MAX_START_FAILURES} replicas in a row ended before they were ready; "
                    f"the last: {reason}"
                )
        new = self._versioned(svc, **changes) if changes else svc
        self._commit([new] if changes else [], [ended], "service.replica_ended", new, message)
        self._alloc.release(r.workload_id, reason=f"service replica ended: {reason}")
        return new

    def _wake(self, svc: ServiceRecord, r: ReplicaRecord) -> None:
        """``r`` leaves the warm pool to serve; the wake call itself is made outside the lock.
        Its workload takes the service's priority after the commit (a restart re-applies it)."""
        self._commit([], [woken(r, self.now)], "service.replica_woken", svc,
                     f"{svc.name}: replica {r.number} woken from the warm pool")  # fmt: skip
        self._serving_priority(svc, r)

    def _serving_priority(self, svc: ServiceRecord, r: ReplicaRecord) -> None:
        with contextlib.suppress(NotFound):  # ended: the next round ends the replica too
            self._alloc.set_priority(r.workload_id, self.spec_of(svc).priority)

    def _refresh_ready(self) -> None:
        ready: dict[str, tuple[str, ...]] = {}
        routes: dict[tuple[str, str], tuple[str, Hold]] = {}
        for svc in stored.active_services(self._alloc.store):
            routes[(svc.tenant, svc.name)] = (svc.id, self.spec_of(svc).hold)
            if self.backend is None:
                continue
            urls = tuple(
                self.backend.url(r.port, svc.id, r.number)
                for r in stored.replicas(self._alloc.store, svc.id, live=True)
                if r.state is ReplicaState.READY and r.port is not None
            )
            if urls:
                ready[svc.id] = urls
        self._ready = ready
        self._routes = routes

    def _workload(self, r: ReplicaRecord) -> WorkloadStatus | None:
        try:
            return self._alloc.status(r.workload_id)
        except NotFound:
            return None

    def _versioned(self, svc: ServiceRecord, **changes: object) -> ServiceRecord:
        return replace(svc, updated_at=self.now, version=svc.version + 1, **changes)  # type: ignore[arg-type]

    def _commit(
        self,
        services: list[ServiceRecord],
        replicas: list[ReplicaRecord],
        kind: str,
        svc: ServiceRecord,
        message: str,
        data: Mapping[str, object] | None = None,
    ) -> None:
        workload = replicas[0].workload_id if replicas else None
        event = EventRecord(
            self.now, kind, svc.tenant, workload, message, {"service": svc.id, **(data or {})}
        )
        self.store.commit(ChangeSet(services=services, replicas=replicas, events=[event]))
