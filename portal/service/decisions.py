"""Allocator decisions as the service sees them: read from what the allocator commits.

Every decision the allocator makes reaches the database as an event in the same transaction,
so a store that reports its committed events sees each decision exactly once — and only
decisions that are durable — without the allocator knowing about metrics or logs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from portal.api.metrics import Outcome
from portal.store.records import ChangeSet, EventRecord
from portal.store.writer import Store

log = logging.getLogger("portal.allocator.decisions")

Listener = Callable[[Outcome, EventRecord], None]

_OUTCOMES = {
    "workload.started": Outcome.ALLOCATED,
    "workload.released": Outcome.RELEASED,
    "workload.cancelled": Outcome.RELEASED,
    "workload.preempting": Outcome.PREEMPTED,
    "workload.failed": Outcome.FAILED,
}


def outcomes(changes: ChangeSet) -> list[tuple[Outcome, EventRecord]]:
    """The decisions in one committed change set; a request answered at once counts as
    allocated, not also as queued."""
    started = {e.workload_id for e in changes.events if e.kind == "workload.started"}
    out: list[tuple[Outcome, EventRecord]] = []
    for event in changes.events:
        if event.kind == "workload.requested":
            if event.workload_id not in started:
                out.append((Outcome.QUEUED, event))
        elif event.kind in _OUTCOMES:
            out.append((_OUTCOMES[event.kind], event))
    return out


class ReportingStore(Store):
    """A ``Store`` that tells its listeners about each decision after it committed."""

    def __init__(self, url: str, *, writer_guard: bool = False) -> None:
        super().__init__(url, writer_guard=writer_guard)
        self.listeners: list[Listener] = [log_decision]

    # ``commit`` is ``commit_all`` of one change set. Overriding ``commit_all`` (not only
    # ``commit``) keeps the allocator's group commit on and reports every decision of a batch.
    def commit_all(self, batch: Iterable[ChangeSet]) -> None:
        work = list(batch)
        super().commit_all(work)
        for changes in work:
            for outcome, event in outcomes(changes):
                for listener in self.listeners:
                    listener(outcome, event)


def log_decision(outcome: Outcome, event: EventRecord) -> None:
    fields = {"workload": event.workload_id, "tenant": event.tenant, "outcome": outcome.value}
    log.info("%s: %s", outcome.value, event.message, extra={"fields": fields})
