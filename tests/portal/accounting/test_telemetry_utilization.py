"""Efficiency and idle spend from samples that went through the real telemetry path: ingest
against the live allocator (attribution to the workload), roll-up, then pricing.

Alice holds one H100 from 08:00 to 10:00 at 4.00 per GPU-hour; her GPU reports 2 % every
minute from 08:00 to 08:59 and 80 % from 09:00 to 09:59. Minute roll-ups make two measured
hours: idle spend = 1 h x 4.00 = 4.00; used = 0.02 + 0.80 = 0.82 of 2 GPU-hours, efficiency
0.41. Bob's GPU sends nothing: unmeasured, so neither idle nor used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import pytest

from policies.pricing import GroupBy, to_cents
from portal.accounting import Accounting, price_config
from portal.accounting.service import Step
from portal.accounting.telemetry import TelemetryUtilization
from portal.allocator import Allocator
from portal.store.writer import Store
from portal.telemetry.service import Telemetry
from portal.telemetry.wire import GpuSample, SampleBatch, Source
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, wl

DAY = datetime(2026, 11, 2, tzinfo=UTC)
PRICES = price_config({"prices": {"H100-80GB": "4.00"}})


def at(hour: int, minute: int = 0) -> datetime:
    return DAY + timedelta(hours=hour, minutes=minute)


def two_hours_of(store: Store, utilization: Callable[[int], float | None]) -> Accounting:
    """Alice's H100 from 08:00 to 10:00, her GPU reporting ``utilization(m)`` at minute ``m``
    after 08:00; Bob's GPU beside it sends nothing. Ingested against the live allocator,
    rolled up, and priced at 12:00."""
    clock = ManualClock(at(8))
    alloc = Allocator(store, clock=clock)
    alloc.start([hgx("n1", gpus=2)])
    alloc.set_tenant("ml")
    alloc.set_quota("ml", "H100-80GB", guaranteed=2, limit=2)
    alice = alloc.request(wl("ml", gpus(1), owner="alice"))
    bob = alloc.request(wl("ml", gpus(1), owner="bob", name="quiet"))
    (uuid,) = alice.allocations[0].gpu_uuids
    tele_now = [at(10).timestamp()]
    telemetry = Telemetry(alloc, clock=lambda: tele_now[0])
    samples = [
        GpuSample(
            gpu_uuid=uuid,
            at=(at(8) + timedelta(minutes=m)).timestamp(),
            utilization_pct=utilization(m),
            memory_used_mib=1000.0,
            memory_total_mib=81920.0,
        )
        for m in range(120)
    ]
    result = telemetry.ingest(SampleBatch(node="n1", source=Source.NVML, samples=samples))
    assert (result.accepted, result.rejected) == (120, 0), result.rejections
    clock.now = at(10)
    alloc.release(alice.id)
    alloc.release(bob.id)
    tele_now[0] = at(10, 5).timestamp()
    telemetry.maintain()
    clock.now = at(12)
    return Accounting(store, PRICES, utilization=TelemetryUtilization(store.engine), clock=clock)


@pytest.fixture
def priced(db_url: str) -> Iterator[Accounting]:
    store = Store(db_url)
    try:
        yield two_hours_of(store, lambda m: 2.0 if m < 60 else 80.0)
    finally:
        store.close()


def test_idle_spend_and_efficiency_follow_the_rolled_up_samples(priced: Accounting) -> None:
    report = priced.report(DAY, DAY + timedelta(days=1), Step.WHOLE)
    by_owner = report.grouped((GroupBy.OWNER,))
    alice, bob = by_owner[("alice",)], by_owner[("bob",)]
    assert alice.cost == 8 and alice.allocated_gpu_hours == 2
    assert to_cents(alice.idle_cost) == to_cents(Fraction(4))
    assert alice.used_gpu_hours == pytest.approx(0.82)
    assert alice.efficiency == pytest.approx(0.41)
    assert bob.cost == 8 and bob.used_gpu_hours == 0 and bob.idle_cost == 0


def test_a_window_that_starts_mid_bucket_counts_only_its_part(priced: Accounting) -> None:
    # 08:30-09:30: half an hour at 2 % (idle, 2.00), half at 80 %.
    report = priced.report(at(8, 30), at(9, 30), Step.WHOLE, tenants={"ml"})
    alice = report.grouped((GroupBy.OWNER,))[("alice",)]
    assert alice.allocated_gpu_hours == 1
    assert alice.idle_cost == 2
    assert alice.used_gpu_hours == pytest.approx(0.5 * 0.02 + 0.5 * 0.80)
