"""Cost of time whose utilization was not measured (a MIG instance of an A100 or A30 sends
memory only), through the real telemetry path: ingest, roll-up, pricing.

Alice holds one H100 from 08:00 to 10:00 at 4.00 per GPU-hour (Bob's GPU beside it sends
nothing). Hers reports memory without utilization every minute from 08:00 to 08:59, and 2 %
from 09:00 to 09:59. The unmeasured hour
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
from portal.store.writer import Store
from tests.portal.accounting.test_telemetry_utilization import DAY, two_hours_of


@pytest.fixture
def priced(tmp_path: Path) -> Iterator[Accounting]:
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    try:
        yield two_hours_of(store, lambda m: None if m < 60 else 2.0)
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
