"""A decision's working copy of the allocator's memory, and the decision it produces.

A ``Draft`` is a ``Memory`` whose containers are copy-on-write overlays of the live state's
(``overlay``, ``policies.placement.fork``): deciders read it and change it through ops
(``ops``), exactly as the live state will change, while the live state stays untouched. When
the decider is done, ``decision()`` freezes the ops, the rows to write and the events into a
``Decision``. Nothing needs undoing when the commit fails: the draft is simply dropped.

The base may itself be a draft whose decision is decided but not yet committed (group commit,
``docs/decisions/0011-group-commit.md``): overlays stack, and the cluster fork starts from a
copy of the base draft's. The base's decision is applied to the live state before this one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, cast

from policies import fairness
from policies.placement.fork import ClusterFork
from portal.allocator.ledger import Ledger
from portal.allocator.memory import Live, Memory, Scalars
from portal.allocator.ops import Finish, Op, SetHistory, Update
from portal.allocator.overlay import OverlayDict, OverlayNested, OverlaySet
from portal.store.records import ChangeSet, EventRecord, WorkloadRecord, WorkloadState


@dataclass(frozen=True, slots=True)
class Decision:
    """What one allocator operation decided: the memory changes (``ops``, then ``scalars``),
    the rows to commit (``changes``) and the events, in one immutable value. The store commits
    ``changes``; only then does ``state.State.apply`` replay the ops on the live state."""

    ops: tuple[Op, ...] = ()
    scalars: Scalars = field(default_factory=Scalars)
    changes: ChangeSet = field(default_factory=ChangeSet)
    at: datetime | None = None

    @property
    def events(self) -> list[EventRecord]:
        return self.changes.events

    def describe(self) -> dict[str, object]:
        """A JSON-compatible summary for logs and debugging."""
        c = self.changes
        return {
            "at": self.at.isoformat() if self.at else None,
            "ops": [type(op).__name__ for op in self.ops],
            "workloads": [(w.id, w.state.value, w.reason) for w in c.workloads],
            "allocations": [(a.id, a.workload_id, a.node, list(a.gpus)) for a in c.allocations],
            "released": [a for a, _ in c.released],
            "events": [e.kind for e in c.events],
        }


class Draft(Memory):
    """A working copy of ``base`` at time ``now``; see the module docstring."""

    def __init__(self, base: Memory, now: datetime) -> None:
        self.base = base
        self.now = now
        # On a draft (a decision not yet committed, see the engine's group commit) the fork
        # starts with that draft's changes; forks do not stack.
        cluster = base.cluster
        self.cluster = cluster.fork() if isinstance(cluster, ClusterFork) else ClusterFork(cluster)
        self.nodes = OverlayDict(base.nodes)
        self.tenants = OverlayDict(base.tenants)
        self.quotas = OverlayDict(base.quotas)
        self.live = OverlayDict(base.live)
        self.queued = OverlaySet(base.queued)
        self.preempting = OverlaySet(base.preempting)
        self.preempting_amount = OverlayDict(base.preempting_amount)
        self.ledger = Ledger(
            OverlayDict(base.ledger.usage),
            OverlayNested(base.ledger.gpu_equivalents),
            OverlayDict(base.ledger.borrowed),
            OverlayNested(base.ledger.holders),
        )
        self.releases = None  # a decision reads no ETAs
        self.run_lengths = None
        self.history = OverlayDict(base.history)
        self.period = OverlayDict(base.period)
        self.scalars = base.scalars
        # Shared with the base until the draft changes the inventory or quotas: values
        # computed meanwhile are the same for both.
        self.derived = base.derived
        self.memo = base.memo
        self.policy = base.policy
        self.half_life_s = base.half_life_s
        self.preemption = base.preemption
        self._ops: list[Op] = []
        self._events: list[EventRecord] = []

    def rebase(self, onto: Memory) -> None:
        """Read through ``onto`` instead of the base draft, once the base's decision has been
        applied to ``onto`` (so both read the same): keeps the chain of drafts waiting for a
        commit as deep as the drafts still waiting, not as every draft since the pipeline
        was last empty. The cluster fork needs nothing: forks copy, they do not stack."""
        assert isinstance(self.base, Draft), "only a draft on a draft is rebased"
        self.base = onto
        pairs: tuple[tuple[Any, Any], ...] = (
            (self.nodes, onto.nodes),
            (self.tenants, onto.tenants),
            (self.quotas, onto.quotas),
            (self.live, onto.live),
            (self.preempting_amount, onto.preempting_amount),
            (self.history, onto.history),
            (self.period, onto.period),
            (self.ledger.usage, onto.ledger.usage),
            (self.ledger.borrowed, onto.ledger.borrowed),
        )
        for mine, theirs in pairs:
            cast(OverlayDict[object, object], mine).rebase(theirs)
        for s_mine, s_theirs in ((self.queued, onto.queued), (self.preempting, onto.preempting)):
            cast(OverlaySet[str], s_mine).rebase(s_theirs)
        for n_mine, n_theirs in (
            (self.ledger.gpu_equivalents, onto.ledger.gpu_equivalents),
            (self.ledger.holders, onto.ledger.holders),
        ):
            cast(OverlayNested[str, object], n_mine).rebase(n_theirs)

    # ---- building the decision -----------------------------------------------------------

    def do(self, op: Op) -> None:
        """Apply ``op`` to the draft and keep it for the decision."""
        op.apply(self)
        self._ops.append(op)

    def event(
        self,
        kind: str,
        tenant: str | None,
        workload_id: str | None,
        message: str,
        data: dict[str, object] | None = None,
    ) -> None:
        self._events.append(EventRecord(self.now, kind, tenant, workload_id, message, data or {}))

    def set_scalars(self, **changes: object) -> None:
        self.scalars = replace(self.scalars, **changes)  # type: ignore[arg-type]

    def decision(self) -> Decision:
        changes = ChangeSet()
        for op in self._ops:
            op.record(changes)
        # One row per workload: its last version in this decision.
        changes.workloads = list({w.id: w for w in changes.workloads}.values())
        changes.events = list(self._events)
        return Decision(tuple(self._ops), self.scalars, changes, self.now)

    # ---- helpers deciders share ----------------------------------------------------------

    def versioned(self, rec: WorkloadRecord) -> WorkloadRecord:
        """``rec`` at the version it gets in this decision: one step past the committed row,
        however many times the decision changes it."""
        committed = self.base.live.get(rec.id)
        version = committed.rec.version + 1 if committed is not None else rec.version
        return rec if rec.version == version else replace(rec, version=version)

    def update(self, lv: Live, rec: WorkloadRecord) -> None:
        self.do(Update(self.versioned(rec)))

    def note(self, lv: Live, message: str) -> None:
        """Only the wait message's figures changed: memory only."""
        self.do(Update(lv.rec, note=message, persist=False))

    def touch_history(self, tenant: str) -> None:
        """Fold the tenant's usage since the last change into its decayed history."""
        now = self.now
        value, last = self.history.get(tenant, (0.0, now))
        current = sum(self.ledger.tenant_gpu_equivalents(tenant).values())
        folded = fairness.accumulate(
            value, last.timestamp(), now.timestamp(), current, self.half_life_s
        )
        self.do(SetHistory(tenant, (folded, now)))

    def finish(self, lv: Live, state: WorkloadState, reason: str) -> WorkloadRecord:
        """End ``lv``: its devices come back. Returns its final record."""
        if lv.allocations:
            self.touch_history(lv.rec.tenant)
        lv = self.live[lv.rec.id]
        rec = replace(lv.rec, state=state, reason=reason, ended_at=self.now, preempt_deadline=None)
        rec = self.versioned(rec)
        self.do(Finish(rec, lv.allocations, self.now))
        self.event(f"workload.{state.value}", rec.tenant, rec.id, f"{rec.name}: {reason}")
        return rec

    def next_seq(self) -> int:
        seq = self.scalars.seq + 1
        self.set_scalars(seq=seq)
        return seq


def allocation_id(workload_id: str, member: int, at: datetime) -> str:
    """Deterministic allocation ids: a decision is a function of state, input and time."""
    digest = hashlib.sha256(f"{workload_id}/{member}/{at.isoformat()}".encode())
    return digest.hexdigest()[:32]
