"""Draining: a ready replica chosen for removal (scale down, scale to zero, the service
deleted) first leaves the gateway's rotation, and its engine is told to stop only once the
gateway has no request in flight to it, or after the drain timeout.

Stopping a ready replica at once would cut the answers it is streaming (the engine closes
its connections on SIGTERM) and fail the requests the gateway had just sent it. A draining
replica is recorded ``stopping`` (so it holds its devices, counts as a replica that is going
away, and gets no new request) without a signal yet; which replicas are draining is kept in
memory: after a portal restart the gateway has nothing in flight, so the first round stops
them. A replica with nothing in flight is stopped at once. A draining replica that is wanted
again (a request came while its service went to zero) is ready again at once: it still runs,
loaded.

Preemption does not drain: the claimant waits for the allocator's grace, not ours.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from policies.services import ReplicaState
from portal.store.records import ReplicaRecord, ServiceRecord

if TYPE_CHECKING:
    from portal.inference.replicas import ReplicaLifecycle

DEFAULT_DRAIN_TIMEOUT_S = 30.0
"""The longest a draining replica keeps serving the requests it has: then it is stopped."""


class Drains:
    """The replicas draining, with the time each must be stopped at the latest. Thread-safe."""

    def __init__(self, timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S) -> None:
        if not timeout_s >= 0:
            raise ValueError(f"drain timeout {timeout_s!r} s: expected 0 or more seconds")
        self.timeout_s = timeout_s
        self._until: dict[tuple[str, int], datetime] = {}
        self._lock = threading.Lock()

    def begin(self, r: ReplicaRecord, now: datetime, *, at_once: bool = False) -> None:
        until = now if at_once else now + timedelta(seconds=self.timeout_s)
        with self._lock:
            self._until.setdefault((r.service_id, r.number), until)

    def draining(self, r: ReplicaRecord) -> bool:
        return r.state is ReplicaState.STOPPING and (r.service_id, r.number) in self._until

    def due(self, r: ReplicaRecord, in_flight: int, now: datetime) -> bool:
        """Whether ``r`` is to be stopped now: nothing in flight to it, or its time is up."""
        until = self._until.get((r.service_id, r.number))
        return until is not None and (in_flight <= 0 or now >= until)

    def end(self, r: ReplicaRecord) -> None:
        with self._lock:
            self._until.pop((r.service_id, r.number), None)


def begin(c: ReplicaLifecycle, svc: ServiceRecord, r: ReplicaRecord, reason: str) -> bool:
    """``r`` (ready, with a port) leaves the rotation now, not at the loop's next round, if
    the gateway has requests in flight to it; whether it drains (else stop it at once)."""
    assert c.backend is not None and r.port is not None
    url = c.backend.url(r.port, svc.id, r.number)
    if c.traffic.in_flight_at(url) <= 0:
        return False
    stopping = replace(r, state=ReplicaState.STOPPING, reason=reason)
    c._commit([], [stopping], "service.replica_draining", svc,
              f"{svc.name}: replica {r.number} draining: {reason}")  # fmt: skip
    c._drains.begin(r, c.now)
    c._ready[svc.id] = tuple(u for u in c._ready.get(svc.id, ()) if u != url)
    return True


def check(c: ReplicaLifecycle, svc: ServiceRecord, r: ReplicaRecord) -> None:
    """Stop the draining ``r`` if nothing is in flight to it any more, or its time is up."""
    url = None if c.backend is None or r.port is None else c.backend.url(r.port, svc.id, r.number)
    if c._drains.due(r, c.traffic.in_flight_at(url), c.now):
        c._signal(svc, r, r.reason, c._stop_grace_s)


def revive(c: ReplicaLifecycle, svc: ServiceRecord, live: Sequence[ReplicaRecord]) -> bool:
    """Put draining replicas back in rotation (lowest number first) until the service has
    ``desired`` serving ones, before any new one is requested; whether any was."""
    serving = [r for r in live if not r.pooled]
    active = sum(r.state is not ReplicaState.STOPPING for r in serving)
    draining = sorted((r for r in serving if c._drains.draining(r)), key=lambda r: r.number)
    back = draining[: max(0, svc.desired - active)]
    for r in back:
        c._drains.end(r)
        c._commit([], [replace(r, state=ReplicaState.READY, reason="")], "service.replica_ready",
                  svc, f"{svc.name}: replica {r.number} ready again (it was draining)")  # fmt: skip
    return bool(back)
