"""Telemetry revisions: the cheap version cost accounting checks kept days against.

Alice holds one H100 of ``n1`` from 08:00 on; her GPU reports 2 % every minute from 08:00 to
08:59 and 80 % from 09:00 to 10:09 (ingested through the real telemetry path, with a short
retention: 3 hours at every level). The day in progress is kept from midnight to the last
ended hour with the revision sum of its hours; a roll-up of a later hour leaves that sum alone,
a late sample rolled up or a pruning round changes it, and the next report shows the change.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from policies.pricing import GroupBy
from portal.accounting import Accounting, price_config
from portal.accounting.service import CostReport, Step
from portal.accounting.telemetry import TelemetryUtilization
from portal.allocator import Allocator
from portal.store.writer import Store
from portal.telemetry.service import Telemetry
from portal.telemetry.store import Retention
from portal.telemetry.tables import REVISIONS
from portal.telemetry.wire import GpuSample, SampleBatch, Source
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, wl

DAY = datetime(2026, 11, 2, tzinfo=UTC)
PRICES = price_config({"prices": {"H100-80GB": "4.00"}})
RETENTION = Retention(raw_s=3 * 3600, minute_s=3 * 3600, hour_s=3 * 3600)
MINUTE, HOUR = 60, 3600


def at(hour: int, minute: int = 0, second: int = 0) -> datetime:
    return DAY + timedelta(hours=hour, minutes=minute, seconds=second)


@dataclass
class Setup:
    store: Store
    clock: ManualClock
    telemetry: Telemetry
    source: TelemetryUtilization
    accounting: Accounting
    uuid: str

    def send(self, *samples: tuple[datetime, float]) -> None:
        batch = [
            GpuSample(
                gpu_uuid=self.uuid,
                at=t.timestamp(),
                utilization_pct=u,
                memory_used_mib=1000.0,
                memory_total_mib=81920.0,
            )
            for t, u in samples
        ]
        result = self.telemetry.ingest(SampleBatch(node="n1", source=Source.NVML, samples=batch))
        assert (result.accepted, result.rejected) == (len(batch), 0), result.rejections

    def today(self, accounting: Accounting | None = None) -> CostReport:
        return (accounting or self.accounting).report(DAY, self.clock.now, Step.WHOLE)

    def fresh(self) -> CostReport:
        """The same report from an accounting that kept nothing."""
        return self.today(Accounting(self.store, PRICES, utilization=self.source, clock=self.clock))

    def version(self, start: datetime, end: datetime, step_s: int) -> int:
        v = self.source.version(int(start.timestamp()), int(end.timestamp()), step_s)
        assert isinstance(v, int)
        return v


@pytest.fixture
def setup(db_url: str) -> Iterator[Setup]:
    clock = ManualClock(at(8))
    store = Store(db_url)
    alloc = Allocator(store, clock=clock)
    alloc.start([hgx("n1", gpus=1)])
    alloc.set_tenant("ml")
    alloc.set_quota("ml", "H100-80GB", guaranteed=1, limit=1)
    alice = alloc.request(wl("ml", gpus(1), owner="alice"))
    (uuid,) = alice.allocations[0].gpu_uuids
    telemetry = Telemetry(
        alloc, retention=RETENTION, clock=lambda: clock.now.timestamp(), attribution_ttl_s=0
    )
    source = TelemetryUtilization(store.engine, raw_retention_s=RETENTION.raw_s)
    s = Setup(
        store,
        clock,
        telemetry,
        source,
        Accounting(store, PRICES, utilization=source, clock=clock),
        uuid,
    )
    clock.now = at(10, 10)
    s.send(*((at(8, m), 2.0 if m < 60 else 80.0) for m in range(130)))
    telemetry.maintain()  # rolls up 08:00-10:09; prunes nothing (all younger than 3 h)
    try:
        yield s
    finally:
        store.close()


def used(report: CostReport) -> float:
    return float(report.grouped((GroupBy.OWNER,))[("alice",)].used_gpu_hours or 0)


def test_roll_ups_bump_their_hours_only(setup: Setup) -> None:
    with setup.store.engine.connect() as conn:
        rows = conn.execute(select(REVISIONS).order_by(REVISIONS.c.step_s, REVISIONS.c.hour_ms))
        got = [(r.step_s, r.hour_ms // 1000, r.revision) for r in rows]
    hours = [int(at(h).timestamp()) for h in (8, 9, 10)]
    # One roll-up round: each hour's minutes and the hours that closed (not 10:00 yet).
    assert got == [*((MINUTE, h, 1) for h in hours), *((HOUR, h, 1) for h in hours[:2])]
    before = setup.version(DAY, at(10), MINUTE)
    assert before == 2
    # Samples of 10:10-10:19 rolled up: a later hour, the range's version stays.
    setup.clock.now = at(10, 21)
    setup.send(*((at(10, m), 50.0) for m in range(10, 20)))
    assert setup.version(DAY, at(10), MINUTE) == before
    setup.telemetry.maintain()
    assert setup.version(DAY, at(10), MINUTE) == before
    assert setup.version(DAY, at(11), MINUTE) == before + 2  # 10:00 rolled twice
    # A range not on whole hours reads the hours it overlaps.
    assert setup.version(at(9, 30), at(10, 1), MINUTE) == 1 + 2


def test_a_late_sample_rolled_up_shows_in_the_next_report(setup: Setup) -> None:
    first = setup.today()
    assert used(first) == pytest.approx(used(setup.fresh()))
    # A sample of 08:30:30 arrives late: on its own it changes nothing the source answers...
    setup.clock.now = at(10, 30)
    v = setup.version(DAY, at(10), MINUTE)
    setup.send((at(8, 30, 30), 100.0))
    assert setup.version(DAY, at(10), MINUTE) == v
    # ...once rolled up, its hour's revision moves and the kept hours are priced again.
    setup.telemetry.maintain()
    assert setup.version(DAY, at(10), MINUTE) != v
    second = setup.today()
    assert used(second) > used(first)
    assert second == setup.fresh()


def test_pruning_bumps_the_hours_it_deletes_from(setup: Setup) -> None:
    setup.clock.now = at(10, 15)
    kept = setup.today()  # keeps 00:00-10:00 with the revisions of 08:00 and 09:00
    assert used(kept) == pytest.approx(0.02 + 70 / 60 * 0.80)
    minute_v, hour_v = setup.version(DAY, at(10), MINUTE), setup.version(DAY, at(10), HOUR)
    setup.clock.now = at(10, 31)
    setup.telemetry.maintain()  # pruned at 10:10, so not again before 11:10
    assert setup.version(DAY, at(10), MINUTE) == minute_v
    # At 11:32 the retention (3 h) ends at 08:32: 08:00-08:31's minutes and the 08:00 hour
    # bucket are pruned, and 08:00's revisions move at both levels.
    setup.clock.now = at(11, 32)
    setup.telemetry.maintain()
    assert setup.version(DAY, at(10), MINUTE) == minute_v + 1
    assert setup.version(DAY, at(10), HOUR) == hour_v + 1
    assert setup.version(at(9), at(10), MINUTE) == 1  # 09:00 untouched
    report = setup.today()
    assert report == setup.fresh()
    # 08:00-08:31 are unmeasured now.
    assert used(report) == pytest.approx(28 / 60 * 0.02 + 70 / 60 * 0.80)
