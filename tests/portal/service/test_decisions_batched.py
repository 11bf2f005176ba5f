"""The service's reporting store keeps the allocator's group commit and reports every decision
of a batch (not only the first one of each transaction). On SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from portal.allocator import Allocator
from portal.api.metrics import Outcome
from portal.service.decisions import ReportingStore
from portal.store.records import ChangeSet, EventRecord
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, wl


class GatedReportingStore(ReportingStore):
    """The service's store whose first commit waits until the test opens ``gate``."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.batches: list[int] = []

    def commit_all(self, batch: Iterable[ChangeSet]) -> None:
        work = [c for c in batch if not c.empty()]
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        self.batches.append(len(work))
        super().commit_all(work)


def test_every_decision_of_a_batch_is_reported(db_url: str) -> None:
    store = GatedReportingStore(db_url)
    try:
        a = Allocator(store, clock=ManualClock())
        a.start([hgx("n1")])
        a.set_tenant("team-a")
        a.set_quota("team-a", "H100-80GB", guaranteed=8, limit=8)
        store.batches.clear()
        seen: list[tuple[Outcome, EventRecord]] = []
        store.listeners.append(lambda outcome, event: seen.append((outcome, event)))
        store.gate.clear()
        store.entered.clear()
        with ThreadPoolExecutor(max_workers=6) as pool:
            first = pool.submit(a.request, wl("team-a", gpus(1)))
            assert store.entered.wait(20), "the first commit never started"
            rest = [pool.submit(a.request, wl("team-a", gpus(1))) for _ in range(5)]
            deadline = time.monotonic() + 20
            while len(a._queued) < 5:  # they decide on top of the first and queue
                assert time.monotonic() < deadline, "callers did not queue behind the commit"
                time.sleep(0.005)
            store.gate.set()
            ids = {f.result(timeout=30).id for f in [first, *rest]}
        assert store.batches == [1, 5], store.batches  # the five shared one transaction
        allocated = [e.workload_id for o, e in seen if o is Outcome.ALLOCATED]
        assert sorted(allocated) == sorted(ids)
    finally:
        store.gate.set()
        store.close()
