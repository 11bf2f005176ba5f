"""Ingest, roll-ups and retention on a real database: what is stored, rejected, deduplicated,
and how late samples correct the roll-ups without double counting."""

from __future__ import annotations

import pytest

from policies.errors import InvalidRequest
from portal.telemetry.reads import Resolution, series
from portal.telemetry.store import Retention
from tests.portal.telemetry.conftest import T0, Portal, batch, sample


def minute_points(p: Portal, device: str) -> list[tuple[float, int, object]]:
    pts = series(
        p.store.engine, resolution=Resolution.MINUTE, start=T0 - 3600, end=T0 + 7200, device=device
    )
    return [(pt.at, pt.samples, pt.utilization_avg) for pt in pts]


def test_samples_are_stored_and_rolled_up_per_minute_and_hour(portal: Portal) -> None:
    idx = portal.index()
    # Six samples a minute (every 10 s) for two minutes: 10, 20, ... 60 % then 70 % flat.
    first = [sample("GPU-n1-0", T0 + 10 * i, util=10.0 * (i + 1)) for i in range(6)]
    second = [sample("GPU-n1-0", T0 + 60 + 10 * i, util=70.0) for i in range(6)]
    result = portal.telemetry.ingest(batch("n1", *first, *second), idx, now=T0 + 120)
    assert (result.accepted, result.duplicates, result.rejected) == (12, 0, 0)

    assert portal.telemetry.roll_up(now=T0 + 119) == 1  # only the first minute has closed
    assert minute_points(portal, "GPU-n1-0") == [(T0, 6, pytest.approx(35.0))]
    assert portal.telemetry.roll_up(now=T0 + 3600) == 2  # the second minute, then the hour
    assert minute_points(portal, "GPU-n1-0") == [
        (T0, 6, pytest.approx(35.0)),
        (T0 + 60, 6, pytest.approx(70.0)),
    ]
    hour = series(
        portal.store.engine, resolution=Resolution.HOUR, start=T0, end=T0 + 3600, device="GPU-n1-0"
    )
    # (6 x 35 + 6 x 70) / 12 = 52.5; min 10, max 70; 12 samples.
    assert [(h.at, h.samples, h.utilization_min, h.utilization_max) for h in hour] == [
        (T0, 12, 10.0, 70.0)
    ]
    assert hour[0].utilization_avg == pytest.approx(52.5)
    assert portal.telemetry.roll_up(now=T0 + 7200) == 0  # nothing dirty: idempotent


def test_duplicates_and_late_samples_never_double_count(portal: Portal) -> None:
    idx = portal.index()
    samples = [sample("GPU-n1-1", T0 + 10 * i, util=40.0) for i in range(0, 6, 2)]
    portal.telemetry.ingest(batch("n1", *samples), idx, now=T0 + 60)
    portal.telemetry.roll_up(now=T0 + 60)
    assert minute_points(portal, "GPU-n1-1") == [(T0, 3, 40.0)]

    # The same batch again, and a batch repeating one sample twice: nothing new is stored.
    again = portal.telemetry.ingest(batch("n1", *samples), idx, now=T0 + 70)
    assert (again.accepted, again.duplicates) == (0, 3)
    twice = portal.telemetry.ingest(batch("n1", samples[0], samples[0]), idx, now=T0 + 70)
    assert (twice.accepted, twice.duplicates) == (0, 2)
    portal.telemetry.roll_up(now=T0 + 3600)
    portal.telemetry.roll_up(now=T0 + 3600)
    assert minute_points(portal, "GPU-n1-1") == [(T0, 3, 40.0)]

    # Late, out-of-order samples of that closed minute: the minute and its hour are corrected.
    late = [sample("GPU-n1-1", T0 + 10 * i, util=100.0) for i in range(1, 6, 2)]
    assert portal.telemetry.ingest(batch("n1", *late), idx, now=T0 + 3700).accepted == 3
    portal.telemetry.roll_up(now=T0 + 3700)
    assert minute_points(portal, "GPU-n1-1") == [(T0, 6, 70.0)]
    hour = series(
        portal.store.engine, resolution=Resolution.HOUR, start=T0, end=T0 + 1, device="GPU-n1-1"
    )
    assert [(h.samples, h.utilization_avg) for h in hour] == [(6, 70.0)]


def test_unknown_gpus_wrong_nodes_clock_skew_and_stale_samples_are_rejected_with_reasons(
    portal: Portal,
) -> None:
    idx = portal.index()
    now = T0 + 1000
    result = portal.telemetry.ingest(
        batch(
            "n1",
            sample("GPU-n1-0", now - 5),  # fine
            sample("GPU-nowhere", now - 5),
            sample("GPU-n2-0", now - 5, memory_total_mib=15360.0),  # a T4 on n2, sent by n1
            sample("GPU-n1-2", now + 3600),  # an hour ahead
            sample("GPU-n1-3", now - 3 * 86_400),  # past the raw retention
        ),
        idx,
        now=now,
    )
    assert (result.accepted, result.rejected) == (1, 4)
    reasons = {r.index: r.reason for r in result.rejections}
    assert "unknown GPU GPU-nowhere" in reasons[1]
    assert "on node n2, not n1" in reasons[2]
    assert "3600 s ahead of the portal's clock" in reasons[3]
    assert "older than the raw retention" in reasons[4]
    portal.telemetry.roll_up(now=now + 3600)
    for rejected in ("GPU-nowhere", "GPU-n2-0", "GPU-n1-2", "GPU-n1-3"):
        assert minute_points(portal, rejected) == []


def test_workload_series_attribute_whole_gpus_and_split_shared_gpus_by_process(
    portal: Portal,
) -> None:
    whole = portal.gpus("team-a", 2)
    a = portal.share("team-a", 500, owner="alice", name="nb-a")
    b = portal.share("team-b", 500, owner="bob", name="bob/nb-b")
    (shared,) = set(portal.devices_of(a))
    assert portal.devices_of(b) == [shared]
    idx = portal.index()
    g0, g1 = portal.devices_of(whole)
    procs = [
        {"pid": 1, "workload_id": a, "sm_util_pct": 30.0, "memory_used_mib": 2000},
        {"pid": 2, "user": "bob", "server": "nb-b", "sm_util_pct": 5.0, "memory_used_mib": 500},
        {"pid": 3, "user": "carol", "server": "", "sm_util_pct": 50.0},  # holds nothing here
    ]
    portal.telemetry.ingest(
        batch("n1", sample(g0, T0 + 1, util=20.0), sample(g1, T0 + 1, util=60.0)), idx, T0 + 2
    )
    portal.telemetry.ingest(
        batch(
            "n2",
            sample(shared, T0 + 1, util=85.0, memory_total_mib=15360.0, processes=procs),
        ),
        idx,
        T0 + 2,
    )
    portal.telemetry.roll_up(now=T0 + 60)

    def workload(wid: str, res: Resolution) -> list[tuple[float | None, float]]:
        pts = series(portal.store.engine, resolution=res, start=T0, end=T0 + 60, workload_id=wid)
        return [(p.utilization_avg, p.memory_used_max) for p in pts]

    assert workload(whole, Resolution.RAW) == [(40.0, 1000.0)]
    assert workload(whole, Resolution.MINUTE) == [(40.0, 1000.0)]
    # Shares: their processes' part of the GPU over their 500-milli share.
    assert workload(a, Resolution.MINUTE) == [(60.0, 2000.0)]
    assert workload(b, Resolution.RAW) == [(10.0, 500.0)]


def test_prune_deletes_each_level_past_its_retention(portal: Portal) -> None:
    idx = portal.index()
    portal.telemetry.ingest(batch("n1", sample("GPU-n1-0", T0 + 1)), idx, now=T0 + 2)
    portal.telemetry.roll_up(now=T0 + 3600)
    r = portal.telemetry.retention
    assert portal.telemetry.prune(now=T0 + r.raw_s) == 0
    assert portal.telemetry.prune(now=T0 + r.raw_s + 2) == 1  # the raw sample
    assert minute_points(portal, "GPU-n1-0") == [(T0, 1, 50.0)]
    assert portal.telemetry.prune(now=T0 + r.minute_s + 1) == 1  # the minute
    assert portal.telemetry.prune(now=T0 + r.hour_s + 1) == 1  # the hour


def test_retention_settings_are_checked() -> None:
    with pytest.raises(InvalidRequest, match="raw <= 1-minute <= 1-hour"):
        Retention(raw_s=10 * 86_400, minute_s=5 * 86_400)
    with pytest.raises(InvalidRequest, match="raw retention"):
        Retention(raw_s=60)


def test_unmeasured_utilization_rolls_up_to_null_and_never_weighs_as_zero(
    portal: Portal,
) -> None:
    """A device without a utilization figure (a MIG instance of an A100) keeps its memory in
    every level; utilization averages only the measured samples, and a bucket without any
    is NULL (0 % would read as idle)."""
    whole = portal.gpus("team-a", 2)
    g0, g1 = portal.devices_of(whole)
    idx = portal.index()
    # g0: minute 0 half measured (80 %, 40 %) half not; minute 1 never measured.
    # g1: never measured, in the whole hour.
    samples = [
        sample(g0, T0 + 10, util=80.0),
        sample(g0, T0 + 20, util=None, memory_used_mib=3000.0),
        sample(g0, T0 + 30, util=40.0),
        sample(g0, T0 + 40, util=None),
        sample(g0, T0 + 70, util=None, memory_used_mib=5000.0),
        sample(g0, T0 + 80, util=None, memory_used_mib=7000.0),
        sample(g1, T0 + 10, util=None, memory_used_mib=2000.0),
        sample(g1, T0 + 70, util=None, memory_used_mib=4000.0),
    ]
    assert portal.telemetry.ingest(batch("n1", *samples), idx, now=T0 + 90).accepted == 8
    portal.telemetry.roll_up(now=T0 + 3600)
    engine = portal.store.engine

    def points(
        res: Resolution, device: str | None = None, workload_id: str | None = None
    ) -> list[tuple[object, ...]]:
        pts = series(
            engine, resolution=res, start=T0, end=T0 + 3600, device=device, workload_id=workload_id
        )
        return [
            (p.samples, p.utilization_avg, p.utilization_min, p.utilization_max, p.memory_used_max)
            for p in pts
        ]

    assert points(Resolution.MINUTE, device=g0) == [
        (4, 60.0, 40.0, 80.0, 3000.0),
        (2, None, None, None, 7000.0),
    ]
    # The hour weighs the measured minute alone: 60, not (4 x 60 + 2 x 0) / 6 = 40.
    assert points(Resolution.HOUR, device=g0) == [(6, 60.0, 40.0, 80.0, 7000.0)]
    assert points(Resolution.HOUR, device=g1) == [(2, None, None, None, 4000.0)]
    # The workload holds both GPUs: its raw points average g0 and g1 where measured.
    assert points(Resolution.RAW, workload_id=whole)[:2] == [
        (2, 80.0, 80.0, 80.0, 2000.0),
        (1, None, None, None, 3000.0),
    ]
    assert points(Resolution.MINUTE, workload_id=whole) == [
        (5, 60.0, 40.0, 80.0, 3000.0),
        (3, None, None, None, 7000.0),
    ]
    assert points(Resolution.HOUR, workload_id=whole) == [(8, 60.0, 40.0, 80.0, 7000.0)]
