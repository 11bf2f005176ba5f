"""The warm pool of a service: ``replicas.warm`` replicas started, loaded, and put to sleep
(vLLM's sleep mode), so that a service that needs a replica wakes one in well under a second
instead of loading the model again.

- A warm replica is an allocator workload like a serving one, at ``WARM_PRIORITY``: it counts
  in the tenant's quota (it holds devices) and a reclaim picks it before any serving replica.
- Once its health path answers it is told ``POST /sleep`` and becomes **asleep**. Engines
  without a sleep mode stay loaded and idle: they get no requests until woken.
- When the service needs a serving replica (scale from zero, scale up, a replacement) it
  wakes a pooled one first (``POST /wake_up``; its workload takes the service's priority) and
  starts cold ones only for the rest; the pool is refilled in the same round (after a
  request's wake, in the loop's next one: the held request waits for the wake call only).
- Sleep and wake calls reach engines outside the controller's lock (a slow engine must not
  stall other services), one call at a time per replica, each re-checked against the store.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from policies.services import ReplicaState, ServiceState
from portal.store import services as stored
from portal.store.records import AllocationRecord, ReplicaRecord, ServiceRecord

if TYPE_CHECKING:
    from portal.inference.controller import ServiceController
    from portal.store.writer import Store

WARM_PRIORITY = -1000
"""The priority of a pooled replica's workload: below any serving replica's."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What one round does to meet ``desired`` serving replicas and ``warm`` pooled ones."""

    stop: tuple[ReplicaRecord, ...]  # serving ones beyond desired, then pooled beyond warm
    wake: tuple[ReplicaRecord, ...]  # pooled ones to serve, before any cold start
    add_serving: int
    add_warm: int


_SERVING_STOP_ORDER = {ReplicaState.QUEUED: 0, ReplicaState.STARTING: 1, ReplicaState.READY: 2}
_WAKE_ORDER = {ReplicaState.ASLEEP: 0, ReplicaState.STARTING: 1, ReplicaState.QUEUED: 2}
_POOL_STOP_ORDER = {ReplicaState.QUEUED: 0, ReplicaState.STARTING: 1, ReplicaState.ASLEEP: 2}


def plan(live: Sequence[ReplicaRecord], want: int, warm: int) -> Plan:
    """Replicas still stopping hold their devices: they count until they have ended, so a
    replacement does not compete with the claimant that preempted them."""
    serving = [r for r in live if not r.pooled]
    pool = [r for r in live if r.pooled]
    active = [r for r in serving if r.state is not ReplicaState.STOPPING]
    stop: list[ReplicaRecord] = []
    if len(active) > want:
        order = sorted(active, key=lambda r: (_SERVING_STOP_ORDER.get(r.state, 3), -r.number))
        stop += order[: len(active) - want]
    need = want - len(serving)
    candidates = sorted(
        (r for r in pool if r.state is not ReplicaState.STOPPING),
        key=lambda r: (_WAKE_ORDER.get(r.state, 3), r.number),
    )
    wake = candidates[: max(0, need)]
    left = [r for r in candidates if r not in wake]
    if len(left) > warm:
        order = sorted(left, key=lambda r: (_POOL_STOP_ORDER.get(r.state, 3), -r.number))
        stop += order[: len(left) - warm]
    pooled = len(pool) - len(wake)
    return Plan(tuple(stop), tuple(wake), max(0, need - len(wake)), max(0, warm - pooled))


class EngineCalls:
    """The sleep and wake calls of a controller's warm replicas, made without its lock."""

    def __init__(self, controller: ServiceController) -> None:
        self._c = controller
        self._guard = threading.Lock()
        self._busy: set[tuple[str, int]] = set()

    def run(self, service_id: str | None = None) -> None:
        """Put loaded pooled replicas to sleep, and wake woken ones (of one service, or all);
        each replica is called by one thread at a time (another round finds the rest)."""
        c = self._c
        if c.backend is None:
            return
        for svc, r in self._starting(service_id):
            key = (svc.id, r.number)
            with self._guard:
                if key in self._busy:
                    continue
                self._busy.add(key)
            try:
                self._call(svc, r)
            finally:
                with self._guard:
                    self._busy.discard(key)

    def _starting(self, service_id: str | None) -> list[tuple[ServiceRecord, ReplicaRecord]]:
        """Warm replicas whose engine runs but that are neither asleep nor ready yet."""
        store = self._c.store
        if service_id is None:
            services = stored.active_services(store)
        else:
            services = [s for s in [stored.service(store, service_id)] if s is not None]
        found = []
        for svc in services:
            if svc.state is ServiceState.ACTIVE:
                found += [
                    (svc, r)
                    for r in stored.replicas(self._c.store, svc.id, live=True)
                    if r.warm and r.state is ReplicaState.STARTING and r.port is not None
                ]
        return found

    def _call(self, svc: ServiceRecord, r: ReplicaRecord) -> None:
        c = self._c
        assert c.backend is not None and r.port is not None
        # Re-read: another thread may have woken, stopped or readied it since it was listed.
        now = stored.replica(c.store, svc.id, r.number)
        if now is None or now.state is not ReplicaState.STARTING or now.port is None:
            return
        engine = c.spec_of(svc).engine.resolved
        base = c.backend.url(now.port, svc.id, now.number)
        if not c.backend.probe(base + engine.health_path):
            return  # still loading: the next round tries again
        post = c.backend.post
        if now.pooled:
            if not engine.sleep_mode or post(base + "/sleep"):
                c.settle(now, ReplicaState.ASLEEP, "asleep in the warm pool")
        elif not engine.sleep_mode or post(base + "/wake_up"):
            c.settle(now, ReplicaState.READY, "woken from the warm pool: ready")


def woken(r: ReplicaRecord, at: datetime) -> ReplicaRecord:
    """``r`` leaves the pool to serve: asleep, it is started again (the wake call makes it
    ready); queued or loading, it goes on as a serving replica."""
    state = ReplicaState.STARTING if r.state is ReplicaState.ASLEEP else r.state
    return replace(r, state=state, woken_at=at)


@dataclass(frozen=True, slots=True)
class ServiceHours:
    """A service's GPU-equivalent-hours held in a window: in its warm pool, and serving."""

    service: ServiceRecord
    warm_gpu_hours: float
    serving_gpu_hours: float


def _aware(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def gpu_hours(
    store: Store, services: Sequence[ServiceRecord], lo: datetime, hi: datetime, now: datetime
) -> list[ServiceHours]:
    """The hours the tenant is charged for (its replicas' allocations, as the cost routes
    price them), each allocation split where its replica was woken: before, warm."""
    held: dict[str, list[AllocationRecord]] = {}
    for a in store.allocations_between(lo, hi):
        held.setdefault(a.workload_id, []).append(a)
    out = []
    for svc in services:
        warm = serving = 0.0
        for r in stored.replicas(store, svc.id):
            for a in held.get(r.workload_id, ()):
                start = max(_aware(a.created_at or lo), lo)
                end = min(_aware(a.released_at or now), hi)
                if end <= start:
                    continue
                split = start
                if r.warm:
                    split = min(max(_aware(r.woken_at or end), start), end)
                warm += (split - start).total_seconds() * a.gpu_equivalent
                serving += (end - split).total_seconds() * a.gpu_equivalent
        out.append(ServiceHours(svc, warm / 3600, serving / 3600))
    return out
