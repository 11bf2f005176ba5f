"""The allocator: single writer of allocations, quotas and the queue.

State lives in memory (``state.State``: free capacity, usage per tenant and flavor, the queue)
for speed and in the database for durability. Every operation runs under one lock in three
steps (decide → commit → apply, Kueue's shape):

1. **decide** on a working copy (``draft.Draft``) of the live state: the deciders (admission,
   the scheduling cycle, reclaim, node events, reconcile) change only the draft and produce an
   immutable ``Decision`` — the ops to replay, the rows to write, the events;
2. **commit** the decision's rows in one transaction; if that fails, the error goes to the
   caller and nothing else happens: memory was never touched;
3. **apply** the decision to the live state (``State.apply``, the only writer of memory), then
   tell the observers.

So memory and database never disagree, and no change needs a hand-written undo.

Group commit (``group_commit``): the lock is held to decide and to apply, not across the
commit, so concurrent callers' decisions share one transaction.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from policies import quota
from policies.errors import InvalidRequest, NotFound
from policies.eta import Interval
from policies.inventory import Node
from policies.placement.framework import Policy
from policies.placement.scorers import policy as named_policy
from policies.placement.state import ClusterState
from policies.preemption import PreemptionPolicy
from policies.requests import MAX_PRIORITY, WorkloadRequest
from portal.allocator import checks, cycle, estimates, intake, node_events
from portal.allocator.draft import Draft
from portal.allocator.group_commit import Clock
from portal.allocator.memory import Live, Memory
from portal.allocator.state import (
    Contradiction,
    EndContradiction,
    State,
    released_this_month,
    remember_runs,
    snapshot,
)
from portal.allocator.tenancy import TenantsAndQuotas
from portal.allocator.views import QueueEntry, ReconcileReport, WorkloadStatus, status_of
from portal.store.records import (
    AllocationRecord,
    WorkloadRecord,
    WorkloadState,
)
from portal.store.writer import Store

T = TypeVar("T")
U = TypeVar("U")

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


CONFLICT_AT_START = "conflict-at-start"

INTERVAL_REFRESH_S = 5.0
"""How long status reads share one computation of the queue's intervals while nothing
changes (running work ages: its remaining time by past run lengths shrinks)."""
SLOW_INTERVALS_S = 0.1
"""A recompute of the intervals taking more CPU seconds than this (thousands queued: ~0.3 s
under the lock) is shared for ten times as long even when the state changes, so it takes at
most a tenth of the lock; a workload queued since reads its point estimate without an
interval meanwhile."""


def _end_contradiction(draft: Draft, c: Contradiction) -> None:
    """Fail a workload whose stored allocations contradict older ones or the inventory (the
    rule: of two, the newer loses) and release them, saying what contradicted what."""
    rec = replace(
        c.rec,
        state=WorkloadState.FAILED,
        reason=CONFLICT_AT_START,
        ended_at=draft.now,
        preempt_deadline=None,
        version=c.rec.version + 1,
    )
    draft.do(EndContradiction(rec, c.allocations, draft.now))
    message = f"{rec.name}: {CONFLICT_AT_START}: {c.reason}"
    log.error("at start, workload %s contradicts the database: %s", rec.id, c.reason)
    draft.event(
        "store.contradiction",
        rec.tenant,
        rec.id,
        message,
        {"allocations": [a.id for a in c.allocations]},
    )
    draft.event("workload.failed", rec.tenant, rec.id, f"{rec.name}: {CONFLICT_AT_START}")


class Allocator(TenantsAndQuotas):
    """Quota-aware, topology-aware allocator. Thread-safe; one instance per portal."""

    def __init__(
        self,
        store: Store,
        *,
        policy: Policy | None = None,
        clock: Clock = utcnow,
        preemption: PreemptionPolicy | None = None,
        fairness_half_life_s: float = 24 * 3600.0,
    ) -> None:
        state = State(
            policy or named_policy("binpack"),
            preemption or PreemptionPolicy(),
            fairness_half_life_s,
        )
        super().__init__(store, state, clock)
        # Positions in the cluster's change log mean something only to this allocator.
        self._epoch = uuid.uuid4().hex[:12]
        self._started = False
        self._intervals_at: tuple[tuple[int, int], dict[str, Interval | None]] | None = None
        self._intervals_kept_until = 0.0  # monotonic: a slow recompute's result is kept
        self._waits = estimates.WaitLearning()
        self.subscribe(self._waits.observe)

    # ---------------------------------------------------------------- lifecycle

    def start(self, nodes: Iterable[Node]) -> ReconcileReport:
        """Rebuild from the database and the given inventory.

        Allocations on nodes that are gone are released (their workloads fail with reason
        ``node-lost``); everything else is re-applied to the in-memory cluster state.
        """
        with self._lock:
            now = self._clock()
            stored = self._store.load()
            state = State(self._state.policy, self._state.preemption, self._state.half_life_s)
            rebuilt = state.rebuild(nodes, stored, released_this_month(self._store, now))
            remember_runs(state, self._store, now)
            lost = rebuilt.lost
            self._state = state
            self._intervals_at = None

            def settle(draft: Draft) -> None:
                for wid in lost:
                    draft.finish(draft.live[wid], WorkloadState.FAILED, "node-lost")
                for c in rebuilt.conflicts:
                    _end_contradiction(draft, c)
                for tenant, flavor, used, limit in rebuilt.over_limit:
                    # Legal (a limit lowered below usage): reported, reclaimed by the usual
                    # rules, nothing stopped for it.
                    message = f"{tenant} holds {used} {flavor}, above its limit {limit}"
                    log.warning("at start: %s", message)
                    draft.event(
                        "quota.over-limit-at-start",
                        tenant,
                        None,
                        message,
                        {"flavor": flavor, "used": used, "limit": limit},
                    )
                cycle.schedule(draft)

            self._decide(settle)
            self._started = True
            ended = tuple(lost) + tuple(c.rec.id for c in rebuilt.conflicts)
            return ReconcileReport(released=ended, node_lost=tuple(lost))

    # ---------------------------------------------------------------- workloads

    def request(
        self,
        req: WorkloadRequest,
        *,
        idempotency_key: str | None = None,
        expected_duration_s: float | None = None,
        estimate: bool = True,
        free_only: bool = False,
        adopt: str | None = None,
    ) -> WorkloadStatus:
        """Allocate now if quota and capacity allow, else queue with a reason.

        A retry with the same ``idempotency_key`` (per tenant and owner) returns the first
        answer's workload instead of allocating again. ``estimate=False``: a queued answer
        without its place and ETA (as ``status``), for callers that do not show them.
        ``free_only``: start now on free capacity or raise ``intake.NoFreeRoom``, having
        changed nothing (never queued, no reclaim started for it).
        ``adopt``: a running workload (a pre-started placeholder) released in the same
        decision, so the request is scheduled on the devices it freed; ignored when it has
        ended meanwhile, when a retry finds the first request's workload, and when the
        request would queue all the same (its quota): then it is decided again without.
        """
        wid = uuid.uuid4().hex

        def decide(draft: Draft) -> str | WorkloadStatus:
            # Checked on the draft: it holds the decisions queued before this one.
            draft.tenant(req.tenant)
            checks.request_can_fit(draft, req)
            if idempotency_key is not None:
                prior = self._by_idempotency(draft, req, idempotency_key)
                if prior is not None:
                    return prior
            adopted = draft.live.get(adopt) if adopt is not None else None
            freed: frozenset[str] | None = None
            if adopted is not None and adopted.rec.state is WorkloadState.RUNNING:
                _, freed = _end(draft, adopted, WorkloadState.RELEASED, f"adopted by {req.name}")
            lv = intake.enqueue(draft, req, wid, idempotency_key, expected_duration_s)
            if free_only:
                intake.start_on_free(draft, lv)
            elif freed is not None:
                cycle.schedule(draft, freed=freed)  # the queue in order, the new one included
                if wid in draft.queued:
                    raise _NotAdopted  # it would wait anyway: the placeholder stays (no trace)
            else:
                cycle.schedule(draft, fresh=wid)
            return wid

        def status(found: str | WorkloadStatus) -> WorkloadStatus:
            return self._status_of(found, estimate=estimate) if isinstance(found, str) else found

        try:
            return self._decide_then(decide, status)
        except _NotAdopted:
            return self.request(
                req,
                idempotency_key=idempotency_key,
                expected_duration_s=expected_duration_s,
                estimate=estimate,
            )

    def release(self, workload_id: str, *, reason: str = "released") -> WorkloadStatus:
        """Release a workload's devices (or cancel it while queued). Idempotent."""

        def decide(draft: Draft) -> WorkloadRecord | None:
            if workload_id not in draft.live:
                return None  # ended, or unknown: answered from the database below
            lv = draft.live[workload_id]
            queued = lv.rec.state is WorkloadState.QUEUED
            state = WorkloadState.CANCELLED if queued else WorkloadState.RELEASED
            ended, freed = _end(draft, lv, state, reason)
            cycle.schedule(draft, freed=freed)
            return ended

        ended = self._decide(decide)
        if ended is None:
            stored = self._store.workload(workload_id)
            if stored is None:
                raise NotFound("workload", workload_id)
            return status_of(stored, stored.message)
        return status_of(ended, ended.message)

    cancel = release

    def set_priority(self, workload_id: str, priority: int) -> WorkloadStatus:
        """Change a live workload's priority: its place in the queue, and the order in which
        reclaims pick victims (a warm replica that starts serving takes its service's)."""
        if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
            raise InvalidRequest("priority", priority, f"{-MAX_PRIORITY} to {MAX_PRIORITY}")

        def decide(draft: Draft) -> None:
            if workload_id not in draft.live:
                raise NotFound("workload", workload_id)
            lv = draft.live[workload_id]
            if lv.rec.priority != priority:
                draft.update(lv, replace(lv.rec, priority=priority))
                if lv.rec.state is WorkloadState.QUEUED:
                    cycle.schedule(draft, fresh=workload_id)

        self._decide(decide)
        return self.status(workload_id)

    def status(self, workload_id: str, *, estimate: bool = True) -> WorkloadStatus:
        """A workload's status; while queued with its place, ETA, interval and reason.
        ``estimate=False`` leaves those out: a loop that reads every queued workload's state
        would otherwise walk the queue once per workload."""
        with self._lock:
            if workload_id in self._state.live:
                return self._status_of(workload_id, interval=True, estimate=estimate)
            stored = self._store.workload(workload_id)
            if stored is None:
                raise NotFound("workload", workload_id)
            return status_of(stored, stored.message)

    def workloads(self, tenant: str | None = None) -> list[WorkloadStatus]:
        """Every non-terminal workload (optionally of one tenant)."""
        with self._lock:
            return [
                self._status_of(lv.rec.id, interval=True)
                for lv in sorted(self._state.live.values(), key=lambda lv: lv.seq)
                if tenant is None or lv.rec.tenant == tenant
            ]

    def queue(self, tenant: str | None = None) -> list[QueueEntry]:
        with self._lock:
            now = self._clock()
            entries = estimates.queue_entries(self._state, now, self._queue_intervals())
            return [e for e in entries if tenant is None or e.tenant == tenant]

    def queue_counts(self) -> Counter[tuple[str, str]]:
        """Queued workloads per (tenant, reason): without ordering the queue or computing ETAs,
        so cheap enough for every metrics scrape."""
        with self._lock:
            recs = (self._state.live[w].rec for w in self._state.queued)
            return Counter((r.tenant, r.reason) for r in recs)

    def usage(self, tenant: str | None = None) -> list[quota.FlavorUsage]:
        """Guaranteed, limit, used, borrowed and lent per flavor for one or all tenants."""
        with self._lock:
            state = self._state
            book = state.book()
            names = [tenant] if tenant is not None else sorted(state.tenants)
            out: list[quota.FlavorUsage] = []
            for t in names:
                state.tenant(t)
                out.extend(quota.usage_summary(book, state.ledger.usage, t))
            return out

    def gpu_hours(self, tenant: str, flavor: str) -> float:
        """GPU-hours of ``flavor`` the tenant used this calendar month (UTC), running
        included: what its budget is checked against."""
        with self._lock:
            return self._state.gpu_hours_this_period(tenant, flavor, self._clock())

    def tick(self) -> None:
        """Advance time: end expired preemption grace periods and schedule the queue."""
        self._decide(cycle.schedule)

    # ---------------------------------------------------------------- inventory

    def node_added(self, node: Node) -> None:
        """A node appeared (or, if known, changed)."""
        self._decide(lambda d: node_events.added(d, node))

    def node_updated(self, node: Node) -> None:
        """Replace a node's description, keeping its allocations (cordon, labels, layout)."""
        self._decide(lambda d: node_events.updated(d, node))

    def node_removed(self, name: str) -> list[str]:
        """A node is gone: its workloads fail with reason ``node-lost``. Returns their ids."""
        return self._decide(lambda d: node_events.removed(d, name))

    def reconcile(self, running: set[str]) -> ReconcileReport:
        """Release allocations of workloads the platform no longer runs (``running`` holds the
        ids it runs); flag running ids the allocator does not know."""
        return self._decide(lambda d: node_events.reconcile(d, running))

    # ---------------------------------------------------------------- introspection

    def allocations(self) -> list[AllocationRecord]:
        with self._lock:
            return [a for lv in self._state.live.values() for a in lv.allocations]

    @property
    def cluster(self) -> ClusterState:
        """The live cluster state; read it through ``inspect`` from other threads."""
        return self._state.cluster

    @property
    def epoch(self) -> str:
        """Random per allocator: tells a change-log position (``ClusterState.seq``) of this
        allocator from one of another process or an earlier start."""
        return self._epoch

    def inspect(self, read: Callable[[ClusterState], T]) -> T:
        """Run ``read`` on the cluster state under the allocator's lock, for a consistent view."""
        with self._lock:
            return read(self._state.cluster)

    def read(self, read: Callable[[State], T]) -> T:
        """Run ``read`` on the whole live state under the lock; it must not change it."""
        with self._lock:
            return read(self._state)

    def snapshot(self) -> dict[str, object]:
        """Everything a rebuild from the database must reproduce, comparable (tests)."""
        with self._lock:
            return snapshot(self._state, self._clock())

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def policy(self) -> Policy:
        return self._state.policy

    @property
    def started(self) -> bool:
        """Whether ``start`` finished (memory rebuilt from the database and inventory)."""
        return self._started

    @property
    def capacity(self) -> dict[str, int]:
        with self._lock:
            return dict(self._state.capacity())

    @property
    def store(self) -> Store:
        """The store the allocator commits to; readers (accounting) use it from any thread."""
        return self._store

    def grace_for(self, kind: str) -> timedelta:
        return self._state.grace_for(kind)

    # ================================================================ internals

    def _status_of(
        self, wid: str, *, interval: bool = False, estimate: bool = True
    ) -> WorkloadStatus:
        """``interval``: with the ETA's interval and reason (status reads; a decision's
        answer carries the point alone, which costs no walk over the running work);
        ``estimate=False``: no place in the queue nor ETA (no walk over the queue)."""
        state = self._state
        lv = state.live.get(wid)
        if lv is None:
            stored = self._store.workload(wid)
            if stored is None:
                raise NotFound("workload", wid)
            return status_of(stored, stored.message)
        if lv.rec.state is not WorkloadState.QUEUED or not estimate:
            return status_of(lv.rec, lv.message, lv.allocations)
        # Only this workload's entry: building every entry costs an ETA per queued workload.
        found = estimates.queue_position(state, wid, self._clock())
        if found is None:
            return status_of(lv.rec, lv.message, lv.allocations)
        pos, tpos, eta = found
        if not interval:
            return status_of(lv.rec, lv.message, lv.allocations, pos, tpos, eta)
        f = estimates.eta_fields(eta, self._queue_intervals().get(wid))
        return status_of(
            lv.rec,
            lv.message,
            lv.allocations,
            pos,
            tpos,
            f["eta_s"],
            (f["eta_low_s"], f["eta_high_s"], f["eta_reason"]),
        )

    @property
    def wait_learning(self) -> estimates.WaitLearning:
        """How the queue's intervals are calibrated against the waits that followed (the
        time replay reads the queue through it, as ``_queue_intervals`` does)."""
        return self._waits

    def _queue_intervals(self) -> dict[str, Interval | None]:
        """Every queued workload's calibrated wait, computed once per applied change (and
        per ``INTERVAL_REFRESH_S`` as running work ages) for all status reads in between:
        one replay of the queue answers it whole; past estimates against the waits that
        followed set the interval (``WaitLearning``)."""
        state = self._state
        now = self._clock()
        key = (state.version, math.floor(now.timestamp() / INTERVAL_REFRESH_S))
        cached = self._intervals_at
        began = time.monotonic()
        if cached is None or (cached[0] != key and began >= self._intervals_kept_until):
            # The replay's cost is its CPU time (pure computation on the state): wall time
            # would also count other processes' turns on a loaded machine.
            cpu = time.thread_time()
            raw = estimates.queue_intervals(state, now, estimates.history_of(state))
            self._waits.seen(raw, now.timestamp())
            cached = self._intervals_at = (key, self._waits.apply(raw))
            took = time.thread_time() - cpu
            self._intervals_kept_until = began + 10 * took if took > SLOW_INTERVALS_S else 0.0
        return cached[1]

    def _by_idempotency(
        self, mem: Memory, req: WorkloadRequest, key: str
    ) -> str | WorkloadStatus | None:
        """The live workload's id, the ended workload's status, or None."""
        for lv in mem.live.values():
            r = lv.rec
            if r.idempotency_key == key and r.tenant == req.tenant and r.owner == req.owner:
                return r.id
        stored = self._store.workload_by_idempotency_key(req.tenant, req.owner, key)
        return status_of(stored, stored.message) if stored is not None else None


class _NotAdopted(Exception):
    """An adopting request would have queued: its draft is dropped and it is asked again."""


def _end(
    draft: Draft, lv: Live, state: WorkloadState, reason: str
) -> tuple[WorkloadRecord, frozenset[str]]:
    """End ``lv`` on the draft; returns its final record and the flavors it freed (the
    caller schedules them)."""
    freed = frozenset(a.flavor for a in lv.allocations if a.flavor)
    book = draft.book()
    affected = {
        fl: quota.affected_by_release(book, draft.ledger.usage, lv.rec.tenant, fl) for fl in freed
    }
    own = frozenset({lv.rec.tenant})
    draft.set_scalars(
        affected=tuple(affected.items()), freed_by=tuple((fl, own) for fl in sorted(freed))
    )
    return draft.finish(lv, state, reason), freed
