"""Cost of time whose utilization was not measured (a MIG instance of an A100 or A30 sends
memory only), through the real telemetry path: ingest, roll-up, pricing.

Alice holds one H100 from 08:00 to 10:00 at 4.00 per GPU-hour. Her GPU reports memory without
utilization every minute from 08:00 to 08:59, and 2 % from 09:00 to 09:59. The unmeasured hour
is allocated, unused and not idle: cost 8.00, idle spend 1 h x 4.00 = 4.00 (the measured hour
only; 8.00 if "not measured" counted as 0 %), used 0.02 GPU-hours. Minute and hour roll-ups
(a report window of a day, and one of a month) agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from policies.pricing import GroupBy
from portal.accounting import Accounting
from portal.accounting.service import Step
from portal.accounting.telemetry import TelemetryUtilization
from portal.allocator import Allocator
from portal.store.writer import Store
from portal.telemetry.service import Telemetry
from portal.telemetry.wire import GpuSample, SampleBatch, Source
from tests.portal.accounting.test_telemetry_utilization import DAY, PRICES, at
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, wl


@pytest.fixture
def priced(tmp_path: Path) -> Iterator[Accounting]:
    clock = ManualClock(at(8))
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store, clock=clock)
    alloc.start([hgx("n1", gpus=1)])
    alloc.set_tenant("ml")
    alloc.set_quota("ml", "H100-80GB", guaranteed=1, limit=1)
    alice = alloc.request(wl("ml", gpus(1), owner="alice"))
    (uuid,) = alice.allocations[0].gpu_uuids
    tele_now = [at(10).timestamp()]
    telemetry = Telemetry(alloc, clock=lambda: tele_now[0])
    samples = [
        GpuSample(
            gpu_uuid=uuid,
            at=(at(8) + timedelta(minutes=m)).timestamp(),
            utilization_pct=None if m < 60 else 2.0,
            memory_used_mib=1000.0,
            memory_total_mib=81920.0,
        )
        for m in range(120)
    ]
    result = telemetry.ingest(SampleBatch(node="n1", source=Source.NVML, samples=samples))
    assert (result.accepted, result.rejected) == (120, 0), result.rejections
    clock.now = at(10)
    alloc.release(alice.id)
    tele_now[0] = at(10, 5).timestamp()
    telemetry.maintain()
    clock.now = at(12)
    try:
        yield Accounting(store, PRICES, utilization=TelemetryUtilization(store.engine), clock=clock)
    finally:
        store.close()


@pytest.mark.parametrize("days", [1, 30], ids=["minute roll-ups", "hour roll-ups"])
def test_unmeasured_time_is_charged_but_neither_idle_nor_used(
    priced: Accounting, days: int
) -> None:
    report = priced.report(DAY, DAY + timedelta(days=days), Step.WHOLE)
    alice = report.grouped((GroupBy.OWNER,))[("alice",)]
    assert alice.cost == 8 and alice.allocated_gpu_hours == 2
    assert alice.idle_cost == 4
    assert alice.used_gpu_hours == pytest.approx(0.02)
