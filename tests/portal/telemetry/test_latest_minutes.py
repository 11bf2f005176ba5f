"""``latest_minutes``: each device's latest rolled-up minute in a window, on both engines."""

from __future__ import annotations

import pytest

from policies.errors import InvalidRequest
from portal.telemetry.reads import DeviceMinute, latest_minutes
from tests.portal.telemetry.conftest import T0, Portal, batch, sample


def test_each_devices_latest_minute_in_the_window(portal: Portal) -> None:
    idx = portal.index()
    samples = [
        # GPU 0: three minutes, 10 then 20 then 30 % (memory 1000 MiB each).
        *(sample("GPU-n1-0", T0 + 60 * m + 5, util=10.0 * (m + 1)) for m in range(3)),
        # GPU 1: the first minute only, two samples averaging 50 %.
        sample("GPU-n1-1", T0 + 5, util=40.0),
        sample("GPU-n1-1", T0 + 15, util=60.0, memory_used_mib=3000.0),
    ]
    assert portal.telemetry.ingest(batch("n1", *samples), idx, now=T0 + 180).accepted == 5
    portal.telemetry.roll_up(now=T0 + 180)
    engine = portal.store.engine
    assert latest_minutes(engine, T0, T0 + 180) == [
        DeviceMinute("GPU-n1-0", T0 + 120, 1, 30.0, 1000.0),
        DeviceMinute("GPU-n1-1", T0, 2, 50.0, 2000.0),
    ]
    # A window ending before GPU 0's last minute: its latest one inside.
    assert latest_minutes(engine, T0, T0 + 120) == [
        DeviceMinute("GPU-n1-0", T0 + 60, 1, 20.0, 1000.0),
        DeviceMinute("GPU-n1-1", T0, 2, 50.0, 2000.0),
    ]
    assert latest_minutes(engine, T0 + 60, T0 + 120) == [
        DeviceMinute("GPU-n1-0", T0 + 60, 1, 20.0, 1000.0)
    ]
    assert latest_minutes(engine, T0 + 180, T0 + 240) == []
    with pytest.raises(InvalidRequest, match="end > start"):
        latest_minutes(engine, T0 + 60, T0)
