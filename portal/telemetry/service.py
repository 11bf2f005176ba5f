"""The telemetry service: ingest against the live allocator, and the periodic maintenance.

``Telemetry(alloc)`` stores samples in the allocator's database. The service registers its
maintenance as a loop (``loops.add("telemetry", 30.0, telemetry.maintain)``): roll up the
closed dirty buckets, and once an hour prune what is past retention.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from portal.allocator import Allocator
from portal.telemetry.attribution import AllocatorIndexSource
from portal.telemetry.store import HOUR_S, Retention, TelemetryStore
from portal.telemetry.wire import IngestResult, SampleBatch


class Telemetry:
    """Samples of a live allocator's devices, stored in its database.

    Args:
        alloc: the started allocator (inventory and allocations for attribution).
        retention: how long each level is kept; the defaults of ``Retention``.
        clock: epoch seconds; tests pass a manual one.
        attribution_ttl_s: how long one snapshot of the allocations is reused by ingest.
    """

    def __init__(
        self,
        alloc: Allocator,
        *,
        retention: Retention | None = None,
        clock: Callable[[], float] = time.time,
        attribution_ttl_s: float = 2.0,
    ) -> None:
        self.store = TelemetryStore(alloc.store.engine, retention)
        self.index = AllocatorIndexSource(alloc, ttl_s=attribution_ttl_s)
        self.clock = clock
        self._last_prune: float | None = None

    def ingest(self, batch: SampleBatch) -> IngestResult:
        return self.store.ingest(batch, self.index(), self.clock())

    def maintain(self) -> None:
        """One round of upkeep: roll-ups, and pruning at most once an hour."""
        now = self.clock()
        self.store.roll_up(now)
        if self._last_prune is None or now - self._last_prune >= HOUR_S:
            self.store.prune(now)
            self._last_prune = now
