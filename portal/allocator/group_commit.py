"""Group commit: the allocator's cycle of decide → commit → apply for concurrent callers.

The lock is held to decide and to apply, not across the commit
(``docs/decisions/0011-group-commit.md``). While one batch's transaction is in flight, other
callers decide on top of the decided-but-uncommitted decisions (a draft over the previous
draft) and queue; the first caller to find no commit in flight commits everything queued in
one transaction (``Store.commit_all``), applies it in order and wakes the others. A caller
returns only after its decision is committed and applied. A failed batch fails every decision
in it with the store's error and applies none; decisions taken on top of it are decided again.

What a waiting decision reads is kept as small as the decisions still waiting: once a batch
is applied, the first waiting draft reads the state directly (``Draft.rebase``) and every
waiting draft's cluster fork forgets the copies of nodes the batch changed
(``ClusterFork.settle``). Under steady concurrency the queue is never empty, and without this
each new decision would read, and copy, everything decided since it last was.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TypeVar, cast

from policies.placement.fork import ClusterFork
from portal.allocator.draft import Decision, Draft
from portal.allocator.memory import Memory
from portal.allocator.state import State
from portal.store.writer import Store

Clock = Callable[[], datetime]
Observer = Callable[[Decision], None]
T = TypeVar("T")
U = TypeVar("U")

MAX_CHAIN = 32
"""Most decisions stacked on uncommitted ones before new callers wait for the queue to drain:
each stacked draft is one more overlay level for every read."""

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class Queued:
    """A decided decision waiting for its batch's commit; its caller waits on ``done``."""

    decision: Decision
    # The caller's answer, computed right after its decision is applied (before the next one
    # of the batch is): what the caller would have seen alone.
    answer: Callable[[], object]
    result: object = None
    done: bool = False  # committed and applied, or failed with ``error``
    error: BaseException | None = None
    redo: bool = False  # decided on top of a batch that failed: decide again
    draft: Draft | None = None  # what it was decided on, the base of the drafts after it


class GroupCommit:
    """The allocator's single writer path: ``_decide`` runs a decider through group commit.
    Subclassed by ``engine.Allocator`` (through ``tenancy.TenantsAndQuotas``), which owns the
    state and the deciders."""

    def __init__(self, store: Store, state: State, clock: Clock) -> None:
        self._store = store
        self._state = state
        self._clock = clock
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._queued: list[Queued] = []  # decided, waiting for a committer, in order
        self._committing = False
        self._tip: Memory | None = None  # the newest uncommitted draft (None: the state)
        self._chain = 0  # drafts a new one would stack on (reset by a rebase or an empty queue)
        self._observers: list[Observer] = []

    def _decide(self, decide: Callable[[Draft], T]) -> T:
        """Decide on a draft, commit, apply, notify (see the module docstring)."""
        return self._decide_then(decide, _same)

    def _decide_then(self, decide: Callable[[Draft], T], then: Callable[[T], U]) -> U:
        """``_decide``, then ``then`` on the result under the lock once it is applied."""
        with self._cond:
            while True:
                while self._chain >= MAX_CHAIN:
                    self._cond.wait()
                draft = Draft(self._tip or self._state, self._clock())
                result = decide(draft)
                mine = Queued(draft.decision(), partial(then, result), draft=draft)
                self._queued.append(mine)
                self._tip = draft
                self._chain += 1
                while not (mine.done or mine.redo):
                    if self._committing:
                        self._cond.wait()
                    else:
                        self._commit_queued()
                if mine.redo:
                    continue
                if mine.error is not None:
                    raise mine.error
                return cast(U, mine.result)

    def _commit_queued(self) -> None:
        """Commit every queued decision, apply the committed ones in order, and settle each
        caller (under the lock, which is released during the commit itself)."""
        batch, self._queued = self._queued, []
        self._committing = True
        done = 0
        error: BaseException | None = None
        self._cond.release()
        try:
            done, error = self._commit(batch)
        finally:
            self._cond.acquire()
            self._committing = False
        applied = 0
        try:
            for q in batch[:done]:
                self._state.apply(q.decision)
                applied += 1
                try:
                    q.result = q.answer()
                except Exception as err:  # the caller's own error (e.g. NotFound)
                    q.error = err
                q.done = True
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("decision %s", q.decision.describe())
                for observer in self._observers:
                    try:
                        observer(q.decision)
                    except Exception:  # an observer never undoes a committed decision
                        log.exception("allocator observer failed")
        except BaseException as err:  # a bug in apply: never leave a caller waiting
            error = error or err
            raise
        finally:
            if applied < len(batch):
                # A batch committed as one transaction fails as a whole, and so do committed
                # decisions left unapplied; committed one by one, the first refused decision
                # fails. Nothing decided on top of a failed one is committed: those callers
                # decide again.
                whole = applied < done or (done == 0 and self._batched)
                failed = len(batch) if whole else applied + 1
                for q in batch[applied:failed]:
                    q.error, q.done = error, True
                for q in batch[failed:] + self._queued:
                    q.redo = True
                self._queued = []
            if not self._queued:
                self._tip, self._chain = None, 0
            elif applied == len(batch):
                self._rebase_waiting(batch[-1])
            self._cond.notify_all()

    @property
    def chain_depth(self) -> int:
        """How many uncommitted drafts a new decision would read through (0: the state
        directly); for benchmarks and debugging, read without the lock."""
        depth, m = 0, self._tip
        while isinstance(m, Draft):
            m, depth = m.base, depth + 1
        return depth

    def _rebase_waiting(self, applied: Queued) -> None:
        """The drafts decided during the commit stack on the batch's last draft, now applied:
        the first of them reads the state directly from here on (``Draft.rebase``), so a
        chain is only as deep as the decisions still waiting."""
        first = self._queued[0].draft
        if first is not None and first.base is applied.draft:
            first.rebase(self._state)
            self._chain = len(self._queued)
            # Every waiting draft's cluster fork starts with the applied one's changes (forks
            # copy them): drop those copies, or each new fork copies every node changed since
            # the queue was last empty, which under steady concurrency it never is.
            done = applied.draft.cluster
            if isinstance(done, ClusterFork):
                prefix = done.fork_log
                for q in self._queued:
                    fork = q.draft.cluster if q.draft is not None else None
                    if isinstance(fork, ClusterFork) and fork.fork_log[: len(prefix)] == prefix:
                        fork.settle(len(prefix))

    @property
    def _batched(self) -> bool:
        """Whether the store commits a batch in one transaction: a subclass that wraps
        ``commit`` alone (to observe each change set) gets its decisions one by one."""
        cls = type(self._store)
        return cls.commit is Store.commit or cls.commit_all is not Store.commit_all

    def _commit(self, batch: list[Queued]) -> tuple[int, BaseException | None]:
        """Commit the batch's decisions; how many were committed and what stopped the rest."""
        changes = [q.decision.changes for q in batch if not q.decision.changes.empty()]
        if not changes:
            return len(batch), None
        if len(changes) > 1 and self._batched:
            try:
                self._store.commit_all(changes)
            except Exception as err:
                return 0, err
            return len(batch), None
        for i, q in enumerate(batch):
            if q.decision.changes.empty():
                continue
            try:
                self._store.commit(q.decision.changes)
            except Exception as err:
                return i, err
        return len(batch), None

    def subscribe(self, observer: Observer) -> None:
        """Call ``observer`` with every applied decision (under the allocator's lock: it must
        be quick and must not call back into the allocator)."""
        self._observers.append(observer)


def _same(result: T) -> T:
    return result
