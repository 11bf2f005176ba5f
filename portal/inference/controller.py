"""The service controller: keeps each inference service at its desired number of replicas,
each replica one allocator workload of kind ``inference`` (gang of one).

Because a replica is an ordinary workload, quota, queue position, reason and ETA, fairness,
cost and preemption apply unchanged: a replica beyond the tenant's quota waits in the queue
with the reason, holding nothing, and starts when quota frees.

The life of a replica, advanced by ``step`` (the service's ``services`` loop):

1. **queued**: its workload waits in the allocator's queue;
2. **starting**: once placed, the engine process is launched on its devices and port; it
   becomes **ready** when its health path answers 200 (the gateway then sends it requests),
   or **asleep** if it was started for the warm pool (``portal.inference.warm``);
3. **stopping**: scaled down, the service deleted, or preempted: SIGTERM, then SIGKILL after
   the grace; its devices are released once the process has ended (**ended**).

A replica whose process ends is replaced by the next round; ``MAX_START_FAILURES`` replicas in
a row that end before they were ever ready make the service ``failed`` (a wrong command or
model must not take and free devices forever). Every change is committed through the store
(``ChangeSet.services``/``replicas``) before the controller's memory changes; the controller is
the only writer of services, under its own lock, and calls the allocator, never the reverse.
The replicas' steps (launch, advance, stop, end) are in ``portal.inference.replicas``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Collection
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from policies.errors import Conflict, InvalidRequest, PortalError, Unavailable
from policies.requests import WorkloadKind
from policies.services import Replicas, ReplicaState, ScalingRule, ServiceState
from portal.allocator import Allocator
from portal.inference.backend import ServiceBackend
from portal.inference.cached import HAS_PROCESS
from portal.inference.drain import DEFAULT_DRAIN_TIMEOUT_S, Drains
from portal.inference.prewarm import WarmSizing
from portal.inference.replicas import ReplicaLifecycle
from portal.inference.spec import Backend as BackendKind
from portal.inference.spec import Hold, ServiceSpec
from portal.inference.traffic import TrafficBook
from portal.inference.views import ReplicaView as ReplicaView
from portal.inference.views import ServiceView as ServiceView
from portal.inference.warm import EngineCalls
from portal.jobs.backend import LogChunk, LogReader, read_file_log
from portal.jobs.runner import MemberExit
from portal.store import services as stored
from portal.store.records import (
    ChangeSet,
    EventRecord,
    QuotaRecord,
    ReplicaRecord,
    ServiceRecord,
)

log = logging.getLogger(__name__)

DEFAULT_STOP_GRACE_S = 10.0
LAST_REQUEST_WRITE_S = 5.0
LOST_AT_RESTART = "engine process gone while the portal restarted"


class ServiceController(ReplicaLifecycle):
    """Services over one allocator. Thread-safe. Without a ``backend`` it takes, lists,
    scales and deletes services but runs nothing (``step`` is then a no-op)."""

    def __init__(
        self,
        alloc: Allocator,
        *,
        backend: ServiceBackend | None = None,
        kind: BackendKind = BackendKind.LOCAL,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
        clock: Callable[[], datetime] | None = None,
        refuse: str | None = None,
    ) -> None:
        self._alloc = alloc
        self.backend = backend
        self.kind = backend.kind if backend is not None else kind
        self._stop_grace_s = stop_grace_s
        self._clock = clock
        self._refuse = refuse
        self._lock = threading.RLock()
        self._started = False
        self._last_created: datetime | None = None
        # Read by the gateway without the controller's lock: service id -> ready URLs.
        self._ready: dict[str, tuple[str, ...]] = {}
        # Exits seen by the runner, not yet acted on: (service id, replica) -> exit.
        self._exits: dict[tuple[str, int], MemberExit] = {}
        self._last_request: dict[str, datetime] = {}
        # Read by the gateway without a lock: (tenant, name) -> (service id, its hold).
        self._routes: dict[tuple[str, str], tuple[str, Hold]] = {}
        self.traffic = TrafficBook()  # the gateway's counts, per service
        self._calls = EngineCalls(self)  # warm replicas' sleep and wake, outside the lock
        self._drains = Drains(drain_timeout_s)  # ready replicas leaving, not signalled yet
        self.warm_plans: dict[str, WarmSizing] = {}  # set by ``prewarm.ForecastWarm``

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Re-adopt the replicas still running after a portal restart; those whose process
        is gone end (and are replaced); workloads of kind inference no replica records are
        released."""
        with self._lock:
            if self._started:
                return
            self._started = True
            if self.backend is None:
                return
            adopted = set(self.backend.runner.adopt())
            store = self._alloc.store
            recorded: set[str] = set()
            for svc in stored.unsettled_services(store):
                for r in stored.replicas(store, svc.id, live=True):
                    recorded.add(r.workload_id)
                    if r.state in HAS_PROCESS and (svc.id, r.number) not in adopted:
                        self._end(svc, r, LOST_AT_RESTART, failed=False)
                    elif r.state is ReplicaState.STOPPING:  # nothing in flight after a restart
                        self._drains.begin(r, self.now, at_once=True)
                    elif r.warm and not r.pooled:  # woken before the restart: it serves
                        self._serving_priority(svc, r)
            for w in self._alloc.workloads():
                if w.kind == WorkloadKind.INFERENCE.value and w.id not in recorded:
                    self._alloc.release(w.id, reason="service replica not recorded")
            self._refresh_ready()

    # ---------------------------------------------------------------- the API's side

    def deploy(self, spec: ServiceSpec) -> ServiceView:
        """Take a service and request its first replicas. Bad input raises before anything
        is created."""
        spec.check_backend(self.kind)
        models = self._alloc.read(lambda s: s.facts().models)
        spec.check_quota(self._alloc.quotas(spec.tenant), models)
        if self._refuse is not None:
            raise Unavailable(self._refuse)
        with self._lock:
            if self.find(spec.tenant, spec.name) is not None:
                raise InvalidRequest(
                    "name", spec.name, f"a name no other service of {spec.tenant} uses"
                )
            now = self.now
            if self._last_created is not None and now <= self._last_created:
                now = self._last_created + timedelta(microseconds=1)
            self._last_created = now
            svc = ServiceRecord(
                id=uuid.uuid4().hex,
                tenant=spec.tenant,
                owner=spec.owner,
                name=spec.name,
                spec=spec.to_dict(),
                state=ServiceState.ACTIVE,
                created_at=now,
                updated_at=now,
                # With a warm pool the first request wakes a replica: none serves before.
                desired=spec.replicas.min if spec.replicas.warm else max(spec.replicas.min, 1),
                message="deployed",
            )
            self._commit([svc], [], "service.deployed", svc, f"{spec.name}: deployed")
            self._reconcile(svc)
            return self.view(svc.id)

    def find(self, tenant: str, name: str) -> ServiceRecord | None:
        """The tenant's active service called ``name``."""
        for svc in stored.services(self._alloc.store, tenants=[tenant]):
            if svc.name == name and svc.state is ServiceState.ACTIVE:
                return svc
        return None

    def view(self, service_id: str) -> ServiceView:
        svc = self.get(service_id)
        reps = stored.replicas(self._alloc.store, service_id, live=True)
        return ServiceView(svc, tuple(ReplicaView(r, self._workload(r)) for r in reps))

    def services(self, tenants: Collection[str] | None = None) -> list[ServiceView]:
        return [self.view(s.id) for s in stored.services(self._alloc.store, tenants=tenants)]

    def replicas(self, service_id: str) -> list[ReplicaRecord]:
        """Every replica the service ever had, ended ones included, by number."""
        self.get(service_id)
        return stored.replicas(self._alloc.store, service_id)

    def events(self, service_id: str) -> list[EventRecord]:
        svc = self.get(service_id)
        return [
            e
            for e in self._alloc.store.events(tenant=svc.tenant, limit=100_000)
            if e.data.get("service") == service_id
        ]

    def log_path(self, service_id: str, number: int) -> Path | None:
        """Where replica ``number``'s engine log is, or None without a backend."""
        if self.backend is None:
            return None
        return self.backend.runner.log_path(service_id, number, 0)

    def read_log(self, service_id: str, number: int, offset: int, limit: int) -> LogChunk:
        """Up to ``limit`` bytes of replica ``number``'s engine log from ``offset``: from the
        runner when its logs are not files here (a pod's, ``LogReader``), else the file's."""
        runner: object = self.backend.runner if self.backend is not None else None
        if isinstance(runner, LogReader):
            return runner.read_log(service_id, number, 0, offset, limit)
        path = self.log_path(service_id, number)
        if path is None:
            return LogChunk(b"", 0, "no backend runs replicas here")
        return read_file_log(path, offset, limit)

    def scale(
        self,
        service_id: str,
        *,
        replicas: Replicas | None = None,
        scaling: ScalingRule | None = None,
    ) -> ServiceView:
        """Change the replica bounds or the scaling rule; the desired count is brought within
        the new bounds at once."""
        with self._lock:
            svc = self.get(service_id)
            if svc.state is not ServiceState.ACTIVE:
                raise Conflict(f"service {svc.name} is {svc.state.value}: deploy it again")
            spec = self.spec_of(svc)
            spec = replace(
                spec, replicas=replicas or spec.replicas, scaling=scaling or spec.scaling
            )
            spec.check_backend(self.kind)
            bounds = spec.replicas
            desired = max(bounds.min, min(bounds.max, svc.desired))
            new = self._versioned(svc, spec=spec.to_dict(), desired=desired)
            message = f"{svc.name}: replicas {bounds.min}..{bounds.max}, {desired} wanted"
            self._commit([new], [], "service.scaled", new, message)
            self._reconcile(new)
            self._refresh_ready()
            return self.view(service_id)

    def delete(self, service_id: str) -> ServiceView:
        """Stop every replica and end the service ``deleted``. Idempotent."""
        with self._lock:
            svc = self.get(service_id)
            if svc.state is not ServiceState.DELETED:
                new = self._versioned(
                    svc, state=ServiceState.DELETED, desired=0, deleted_at=self.now
                )
                self._commit([new], [], "service.deleted", new, f"{svc.name}: deleted")
                self._routes.pop((svc.tenant, svc.name), None)
                self._ready.pop(svc.id, None)
                self._reconcile(new)
            return self.view(service_id)

    # ---------------------------------------------------------------- the gateway's side

    def ready_urls(self, service_id: str) -> tuple[str, ...]:
        """Base URLs of the service's ready replicas (no lock, no database read)."""
        return self._ready.get(service_id, ())

    def route(self, tenant: str, name: str) -> tuple[str, Hold] | None:
        """The active service ``name`` of ``tenant`` as the gateway needs it, from memory
        (None when not known there: ask ``find_route``)."""
        return self._routes.get((tenant, name))

    def find_route(self, tenant: str, name: str) -> tuple[str, Hold] | None:
        svc = self.find(tenant, name)
        if svc is None:
            return None
        route = (svc.id, self.spec_of(svc).hold)
        self._routes[(tenant, name)] = route
        return route

    def note_request(self, service_id: str) -> None:
        """A request came (the idle timer): memory only, written by the loop."""
        self._last_request[service_id] = self.now

    def touch(self, service_id: str) -> None:
        """A request came for a service without a ready replica: bring a service scaled to
        zero back to one replica at once (not at the loop's next round)."""
        self.note_request(service_id)
        with self._lock:
            svc = self.get(service_id)
            if svc.state is not ServiceState.ACTIVE or svc.desired > 0:
                return
            new = self._versioned(svc, desired=1, last_request_at=self.now)
            self._commit([new], [], "service.woken", new, f"{svc.name}: a request came")
            # The held request waits for the wake call only: the loop's next round (half
            # a second) refills the pool.
            self._reconcile(new, refill=False)
            self._refresh_ready()  # a draining replica may serve again at once
        self._calls.run(service_id)

    def last_request(self, svc: ServiceRecord) -> datetime | None:
        """When the service last got a request (this process's memory, else the store's)."""
        return self._last_request.get(svc.id, svc.last_request_at)

    # ---------------------------------------------------------------- the autoscaler's side

    def models(self) -> frozenset[str]:
        return self._alloc.read(lambda s: s.facts().models)

    def quotas(self, tenant: str) -> list[QuotaRecord]:
        return self._alloc.quotas(tenant)

    def record_scaling(
        self, svc: ServiceRecord, want: int, idle_for_s: float, value: float | None
    ) -> None:
        """The autoscaler's verdict: ``want`` replicas (and the last request's time, when
        memory knows a newer one than the store by more than ``LAST_REQUEST_WRITE_S``)."""
        with self._lock:
            svc = self.get(svc.id)
            if svc.state is not ServiceState.ACTIVE:
                return
            seen = self._last_request.get(svc.id)
            stale = seen is not None and (
                svc.last_request_at is None
                or (seen - svc.last_request_at).total_seconds() > LAST_REQUEST_WRITE_S
            )
            if want == svc.desired:
                if stale:
                    self.store.commit(
                        ChangeSet(services=[self._versioned(svc, last_request_at=seen)])
                    )
                return
            new = self._versioned(
                svc, desired=want, last_request_at=seen if stale else svc.last_request_at
            )
            metric = self.spec_of(svc).scaling.metric.value
            if want == 0:
                why = f"no request for {idle_for_s:.0f} s: scaled to zero"
            else:
                shown = "n/a" if value is None else f"{value:.2f}"
                why = f"{metric} {shown} per replica: {svc.desired} -> {want} replicas"
            kind = "service.scaled_up" if want > svc.desired else "service.scaled_down"
            self._commit([new], [], kind, new, f"{svc.name}: {why}")
            self._reconcile(new)
            self._refresh_ready()
        self._calls.run(svc.id)

    # ---------------------------------------------------------------- the loop's side

    def step(self) -> None:
        """One round: collect process exits, then advance every service with live replicas."""
        if self.backend is None:
            return
        with self._lock:
            if not self._started:
                self.start()
            for e in self.backend.runner.poll():
                self._exits[(e.job_id, e.attempt)] = e
            for svc in stored.unsettled_services(self._alloc.store):
                try:
                    self._reconcile(svc)
                except PortalError as exc:
                    log.warning("service %s: %s", svc.name, exc.message)
            self._refresh_ready()
        self._calls.run()

    # ---------------------------------------------------------------- warm replicas' calls

    def settle(self, r: ReplicaRecord, state: ReplicaState, what: str) -> None:
        """A warm replica's call answered: it becomes ``state`` (asleep if still pooled,
        ready if woken), unless it changed in the meantime."""
        with self._lock:
            now = stored.replica(self.store, r.service_id, r.number)
            if now is None or now.state is not ReplicaState.STARTING:
                return
            if now.pooled != (state is ReplicaState.ASLEEP):
                return  # woken while it was being put to sleep: the wake call follows
            svc = self.get(r.service_id)
            at = self.now
            new = replace(now, state=state, ready_at=now.ready_at or at)
            changed = [self._versioned(svc, failures=0)]
            self._commit(changed, [new], f"service.replica_{state.value}", changed[0],
                         f"{svc.name}: replica {r.number} {what}")  # fmt: skip
            self._refresh_ready()
