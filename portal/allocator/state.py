"""The allocator's live in-memory state: rebuilt from the database, changed only by ``apply``.

``State.apply(decision)`` is the one writer of memory after start: it replays a committed
decision's ops (the same code that built the decider's draft) and takes its single values.
It does no I/O and cannot fail on a decision made on this state.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from policies.errors import Conflict
from policies.eta import RunLengths
from policies.inventory import Node
from policies.placement.framework import Policy
from policies.placement.state import ClusterState, Placement
from policies.preemption import PreemptionPolicy
from policies.requests import DeviceRequest
from portal.allocator import codec
from portal.allocator.draft import Decision
from portal.allocator.ledger import Ledger
from portal.allocator.memory import (
    Derived,
    Live,
    Memo,
    Memory,
    Scalars,
    month_start,
    period_hours,
    run_length,
)
from portal.allocator.ops import restored_placement
from portal.allocator.releases import LiveTable
from portal.store.records import (
    AllocationRecord,
    ChangeSet,
    StoredState,
    WorkloadRecord,
    WorkloadState,
)
from portal.store.writer import Store


class State(Memory):
    def __init__(self, policy: Policy, preemption: PreemptionPolicy, half_life_s: float) -> None:
        self.cluster = ClusterState()
        self.nodes = {}
        self.tenants = {}
        self.quotas = {}
        self.live = LiveTable()
        self.releases = self.live.releases
        self.run_lengths = RunLengths()
        self.version = 0  # applied decisions: what cached reads of the state are keyed on
        self.queued = set()
        self.preempting = set()
        self.preempting_amount = {}
        self.ledger = Ledger()
        self.history = {}
        self.period = {}
        self.scalars = Scalars()
        self.derived = Derived()
        self.memo = Memo()
        self.policy = policy
        self.preemption = preemption
        self.half_life_s = half_life_s

    def apply(self, decision: Decision) -> None:
        """Make memory what ``decision`` says (after the store committed it)."""
        for op in decision.ops:
            op.apply(self)
        self.scalars = decision.scalars
        self.version += 1

    def observe(self, dev: DeviceRequest, placement: Placement) -> None:
        self.policy.observe(dev, placement)

    # ---- start ---------------------------------------------------------------------------

    def rebuild(
        self,
        nodes: Iterable[Node],
        stored: StoredState,
        released_this_month: Iterable[tuple[str, AllocationRecord]],
    ) -> Rebuilt:
        """Fill an empty state from the inventory and the database.

        Returns the workloads holding devices on nodes that are gone (the caller fails them:
        ``node-lost``) and those whose allocations contradict the inventory or older ones
        (see ``Contradiction``), and the tenants above a limit. A database is never refused:
        workloads are placed oldest first, so of two that claim the same capacity the newer
        one is left out of memory — it holds nothing here — and the caller ends it.
        """
        for n in nodes:
            self.cluster.add_node(n)
            self.nodes[n.name] = n
        self.inventory_changed()
        self.tenants.update({t.name: t for t in stored.tenants})
        self.quotas.update({(q.tenant, q.flavor): q for q in stored.quotas})
        self.history.update(stored.usage_history)
        by_wl: dict[str, list[AllocationRecord]] = defaultdict(list)
        for a in stored.allocations:
            by_wl[a.workload_id].append(a)
        lost: list[str] = []
        conflicts: list[Contradiction] = []
        seq = 0
        last: datetime | None = None
        for rec in sorted(stored.workloads, key=lambda r: (r.created_at, r.id)):
            allocs = tuple(by_wl.get(rec.id, ())) if rec.state is not WorkloadState.QUEUED else ()
            gone = any(a.node not in self.nodes for a in allocs)
            if not gone:
                clash = self._place(allocs)
                if clash is not None:
                    conflicts.append(Contradiction(rec, allocs, clash))
                    continue
            seq += 1
            last = max(last or rec.created_at, rec.created_at)
            req = codec.workload_request_from_record(
                rec.tenant, rec.owner, rec.name, rec.kind, rec.request, rec.gang_size, rec.priority
            )
            lv = Live(rec, req, seq, allocs)
            self.live[rec.id] = lv
            if rec.state is WorkloadState.QUEUED:
                self.queued.add(rec.id)
            elif rec.state is WorkloadState.PREEMPTING:
                self.preempting.add(rec.id)
                for a in allocs:
                    if a.flavor:
                        key = (rec.tenant, a.flavor)
                        self.preempting_amount[key] = self.preempting_amount.get(key, 0) + a.amount
            for a in allocs:
                self.ledger.add(a, rec.tenant)
            if gone:
                lost.append(rec.id)
        for tenant, a in released_this_month:
            if a.released_at is None or a.created_at is None or not a.flavor:
                continue
            month, hours = period_hours(a.created_at, a.released_at)
            at = (tenant, a.flavor, month)
            self.period[at] = self.period.get(at, 0.0) + a.gpu_equivalent * hours
        self.scalars = Scalars(seq=seq, last_created=last)
        return Rebuilt(lost, conflicts, self._over_limit())

    def _place(self, allocs: tuple[AllocationRecord, ...]) -> str | None:
        """Apply a workload's placements all or none; None, or what they contradict."""
        done: list[Placement] = []
        for a in allocs:
            p = restored_placement(self.nodes[a.node], a)
            try:
                self.cluster.apply(p)
            except Conflict as err:
                for q in reversed(done):
                    self.cluster.unapply(q)
                holders = sorted(
                    wid
                    for wid, lv in self.live.items()
                    if any(b.node == a.node and set(b.gpus) & set(a.gpus) for b in lv.allocations)
                )
                held = f" (held by {', '.join(holders)})" if holders else ""
                return f"allocation {a.id} on {a.node} GPU {list(a.gpus)}: {err.message}{held}"
            done.append(p)
        return None

    def _over_limit(self) -> list[tuple[str, str, int, int]]:
        """(tenant, flavor, used, limit) for each quota that running work exceeds."""
        return sorted(
            (tenant, flavor, used, q.limit)
            for (tenant, flavor), used in self.ledger.usage.items()
            if (q := self.quotas.get((tenant, flavor))) is not None and used > q.limit
        )


@dataclass(frozen=True, slots=True)
class Contradiction:
    """A workload whose stored allocations cannot be placed: they claim capacity that older
    workloads' allocations already hold, or that the inventory does not have."""

    rec: WorkloadRecord
    allocations: tuple[AllocationRecord, ...]
    reason: str  # what contradicted what


@dataclass(frozen=True, slots=True)
class Rebuilt:
    lost: list[str]  # workloads on nodes that are gone
    conflicts: list[Contradiction]  # left out of memory, newest first loses
    over_limit: list[tuple[str, str, int, int]]  # (tenant, flavor, used, limit)


@dataclass(frozen=True, slots=True)
class EndContradiction:
    """The op that fails a ``Contradiction`` at start: its allocations are released in the
    database. Memory never held them (``rebuild`` left the workload out), so only the
    period's GPU-hours change, as they would for any released allocation."""

    rec: WorkloadRecord
    allocations: tuple[AllocationRecord, ...]
    at: datetime

    def apply(self, mem: Memory) -> None:
        for a in self.allocations:
            if a.created_at is not None and a.flavor:
                month, hours = period_hours(a.created_at, self.at)
                key = (self.rec.tenant, a.flavor, month)
                mem.period[key] = mem.period.get(key, 0.0) + a.gpu_equivalent * hours

    def record(self, out: ChangeSet) -> None:
        out.workloads.append(self.rec)
        out.released.extend((a.id, self.at) for a in self.allocations)


RUN_HISTORY_DAYS = 30
"""How far back a restarted allocator reads run lengths for its ETAs."""


def remember_runs(state: State, store: Store, now: datetime) -> None:
    """Fill the state's run-length history from the workloads that ended recently, oldest
    first (the history keeps the newest runs of each group)."""
    history = state.run_lengths
    if history is None:
        return
    since = now - timedelta(days=RUN_HISTORY_DAYS)
    ended = store.workloads_ended_since(since, limit=history.capacity)
    for rec in reversed(ended):
        length = run_length(rec)
        if length is not None:
            history.add((rec.tenant, rec.kind), length, rec.expected_duration_s)


def released_this_month(store: Store, now: datetime) -> list[tuple[str, AllocationRecord]]:
    """Allocations released since the start of ``now``'s month, with their tenants."""
    owners: dict[str, str] = {}
    out = []
    for a in store.allocations_between(month_start(now), now):
        if a.released_at is None:
            continue
        if a.workload_id not in owners:
            w = store.workload(a.workload_id)
            owners[a.workload_id] = w.tenant if w is not None else ""
        out.append((owners[a.workload_id], a))
    return out


def snapshot(mem: Memory, now: datetime) -> dict[str, object]:
    """Everything that must survive a restart, in comparable form: what a fresh rebuild
    from the database must reproduce (the property tests compare the two)."""
    workloads = {
        wid: (lv.rec, tuple(sorted(a.id for a in lv.allocations))) for wid, lv in mem.live.items()
    }
    usage = {k: v for k, v in mem.ledger.usage.items() if v}
    period = {
        (t, fl): round(mem.gpu_hours_this_period(t, fl, now), 9)
        for t in mem.tenants
        for fl in {f for (tt, f) in mem.quotas if tt == t}
    }
    free = sorted(
        (s.name, tuple(s.free_milli), tuple(s.free_mem), s.cpu_free, s.mem_free,
         tuple(tuple(sorted(x)) for x in s.mig_free),
         tuple(tuple(sorted((i.profile, i.start) for i in x)) for x in s.mig_layout))
        for s in mem.cluster
    )  # fmt: skip
    return {
        "tenants": dict(mem.tenants),
        "quotas": dict(mem.quotas),
        "workloads": workloads,
        "queue": [lv.rec.id for lv in mem.order(now)],
        "preempting": {k: v for k, v in mem.preempting_amount.items() if v},
        "usage": usage,
        "borrowed": {k: v for k, v in mem.ledger.borrowed.items() if v},
        "history": dict(mem.history),
        "period_gpu_hours": period,
        "free": free,
        "releases": mem.releases.snapshot() if mem.releases is not None else None,
    }
