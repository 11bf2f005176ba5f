"""Closed days priced once add up to pricing the window at once, exactly.

Ten days of allocations (whole GPUs, MIG 3g.40gb, T4 shares; three tenants) made and released
through the real allocator at odd times, with utilization samples of the whole-GPU workloads
ingested through the real telemetry path while they run and rolled up to minutes and hours.
H100 prices change three times inside the history; T4 has no price (counted at 0, listed).

``uncached`` is the definition: one read of every allocation in the window, one utilization
read at the window's resolution, one ``cost_lines`` over the asked periods. Random windows
(not aligned to days, with sub-second ends), steps, tenant filters and ends of held allocations
are asked from one ``Accounting`` (its closed days filling up as questions come) and compared
line by line with ``uncached``.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import pytest
from sqlalchemy import event

from policies.flavors import Flavor, FlavorKind
from policies.pricing import UtilizationSegment, cost_lines
from policies.requests import DeviceRequest
from portal.accounting import Accounting, price_config
from portal.accounting import telemetry as telemetry_module
from portal.accounting.closed_days import CLOSE_MARGIN_S, DAY_S
from portal.accounting.history import epoch_seconds, usage_intervals
from portal.accounting.service import CostReport, Step, periods
from portal.accounting.telemetry import TelemetryUtilization
from portal.allocator import Allocator
from portal.store.records import WorkloadState
from portal.store.writer import Store
from portal.telemetry.service import Telemetry
from portal.telemetry.wire import GpuSample, SampleBatch, Source
from tests.portal.accounting.test_cost_scenario import h100_mig
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, share, t4, wl

T0 = datetime(2026, 11, 2, 5, 17, 23, 400_000, tzinfo=UTC)
DAYS = 10
TENANTS = ("a", "b", "c")
PRICES = price_config(
    {
        "prices": {
            "H100-80GB": [
                {"per_gpu_hour": "4.00"},
                {"from": "2026-11-03T13:00:00Z", "per_gpu_hour": "3.10"},
                {"from": "2026-11-06T00:00:00Z", "per_gpu_hour": "3.37"},
                {"from": "2026-11-09T22:41:07Z", "per_gpu_hour": "2.99"},
            ]
        },
    }
)
MIG = DeviceRequest(FlavorKind.MIG, mig_profile="3g.40gb", models=frozenset({"H100-80GB"}))


@dataclass
class History:
    store: Store
    alloc: Allocator
    telemetry: Telemetry
    clock: ManualClock  # the allocator's and the telemetry's
    end: datetime  # when the simulated history stops


def sample(alloc: Allocator, at: datetime, rng: random.Random) -> list[GpuSample]:
    """One sample per GPU held by a running whole-GPU workload: idle or busy."""
    out = []
    for w in alloc.workloads():
        if w.state is not WorkloadState.RUNNING:
            continue
        for a in w.allocations:
            if Flavor.parse(a.flavor).kind is not FlavorKind.GPU:
                continue
            for uuid in a.gpu_uuids:
                util = rng.choice((0.0, 1.5, 3.0, 40.0, 97.5))
                out.append(
                    GpuSample(
                        gpu_uuid=uuid,
                        at=at.timestamp(),
                        utilization_pct=util,
                        memory_used_mib=100.0,
                        memory_total_mib=81920.0,
                    )
                )
    return out


def simulate(db_url: str, seed: int) -> History:
    rng = random.Random(seed)
    clock = ManualClock(T0)
    store = Store(db_url)
    alloc = Allocator(store, clock=clock)
    alloc.start([hgx("n1", gpus=4), hgx("n2", gpus=4), h100_mig("m1"), t4("s1")])
    for t in TENANTS:
        alloc.set_tenant(t)
        alloc.set_quota(t, "H100-80GB", guaranteed=2, limit=8)
        # Two 3g.40gb instances, one guaranteed to each of three tenants: over-committed.
        alloc.set_quota(t, "H100-80GB/3g.40gb", guaranteed=1, limit=2, overcommit=True)
        alloc.set_quota(t, "T4/share", guaranteed=500, limit=2000)
    telemetry = Telemetry(alloc, clock=lambda: clock.now.timestamp(), attribution_ttl_s=0)
    end = T0 + timedelta(days=DAYS)
    # One workload runs throughout (a late sample needs a GPU held then and now).
    keeper = alloc.request(wl("a", gpus(1), name="keeper", owner="a-keeper"))
    assert keeper.state is WorkloadState.RUNNING
    live: list[str] = []
    n = 0
    while clock.now < end:
        for _ in range(rng.choice((0, 1, 1, 2))):
            t = rng.choice(TENANTS)
            devices = rng.choice((gpus(1), gpus(2), MIG, share(250), share(500)))
            st = alloc.request(wl(t, devices, name=f"w{n}", owner=f"{t}-u{rng.randrange(3)}"))
            n += 1
            if st.state is WorkloadState.RUNNING:
                live.append(st.id)
            else:
                alloc.release(st.id)
        for w in [w for w in live if rng.random() < 0.15]:
            alloc.release(w)
            live.remove(w)
        batch = sample(alloc, clock.now, rng)
        if batch:
            for node in {s.gpu_uuid.split("-")[1] for s in batch}:
                mine = [s for s in batch if s.gpu_uuid.split("-")[1] == node]
                result = telemetry.ingest(SampleBatch(node=node, source=Source.NVML, samples=mine))
                assert result.rejected == 0, result.rejections
        if rng.random() < 0.1:
            telemetry.maintain()
        clock.advance(minutes=rng.randrange(7, 180), seconds=rng.randrange(60))
        clock.now += timedelta(microseconds=rng.randrange(1_000_000))
    telemetry.maintain()
    return History(store, alloc, telemetry, clock, end)


def uncached(
    acc: Accounting,
    start: datetime,
    end: datetime,
    step: Step,
    tenants: Collection[str] | None,
    now: datetime,
) -> CostReport:
    """The window priced at once, from every allocation overlapping it."""
    chosen = periods(start, end, step)
    lo, hi = chosen[0].start, chosen[-1].end
    intervals = usage_intervals(acc.store, start, end, now, tenants)
    book = acc.book_for(intervals)
    segments: list[UtilizationSegment] = []
    if acc.utilization is not None and intervals:
        resolution = acc.utilization.resolution_s(lo, hi)
        segments = list(acc.utilization(intervals, lo, hi, resolution))
    lines = cost_lines(intervals, book, chosen, segments, acc.idle_threshold_pct)
    models = {Flavor.parse(x.flavor).model for x in lines}
    return CostReport(
        periods=tuple(chosen),
        lines=tuple(lines),
        currency=acc.prices.currency,
        measured=acc.utilization is not None,
        unpriced_models=tuple(sorted(models - set(acc.prices.book.schedules))),
    )


@pytest.fixture(scope="module", params=[1, 2])
def history(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[History]:
    url = f"sqlite:///{tmp_path_factory.mktemp('closed') / 'portal.db'}"
    h = simulate(url, request.param)
    try:
        yield h
    finally:
        h.store.close()


def random_question(
    rng: random.Random, end_of_history: datetime
) -> tuple[datetime, datetime, Step, frozenset[str] | None, datetime | None]:
    span = (end_of_history - T0).total_seconds() + 2 * DAY_S
    start = T0 - timedelta(days=1) + timedelta(seconds=rng.uniform(0, span))
    if rng.random() < 0.3:  # some windows start at midnight
        start = start.replace(hour=0, minute=0, second=0, microsecond=0)
    length = timedelta(seconds=rng.choice((rng.uniform(1, 7200), rng.uniform(0, 12 * DAY_S))))
    end = start + max(length, timedelta(seconds=1))
    if rng.random() < 0.3:
        end = end.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    step = rng.choice(list(Step))
    tenants = rng.choice((None, None, frozenset({"a"}), frozenset({"a", "c"}), frozenset({"z"})))
    # Held allocations counted until the clock, or until an earlier time (a past budget).
    now = None if rng.random() < 0.7 else T0 + timedelta(seconds=rng.uniform(0, span))
    return start, end, step, tenants, now


def ask_random_questions(h: History, after_end: timedelta, questions: int) -> None:
    report_clock = ManualClock(h.end + after_end)
    acc = Accounting(
        h.store, PRICES, utilization=TelemetryUtilization(h.store.engine), clock=report_clock
    )
    rng = random.Random(7)
    for _ in range(questions):
        start, end, step, tenants, now = random_question(rng, h.end)
        got = acc.report(start, end, step, tenants, now=now)
        want = uncached(acc, start, end, step, tenants, now or report_clock())
        assert got == want, (start, end, step, tenants, now)
    assert len(acc.closed_days) > 0  # the questions did go through closed days


@pytest.mark.parametrize("after_end", [timedelta(hours=3), timedelta(days=4)])
def test_closed_days_add_up_to_the_window_priced_at_once(
    history: History, after_end: timedelta
) -> None:
    # Three hours after the history, only days ended over two days (raw retention) and an
    # hour ago are closed; four days after, all of them.
    ask_random_questions(history, after_end, 60)


def test_closed_days_add_up_on_every_database(db_url: str) -> None:
    h = simulate(db_url, 5)
    try:
        ask_random_questions(h, timedelta(days=1), 25)
    finally:
        h.store.close()


def test_the_months_reports_through_closed_days_equal_the_uncached_ones(
    history: History,
) -> None:
    # What the Cost view asks (this month by day, by flavor) on a warm and a cold instance.
    clock = ManualClock(history.end + timedelta(days=3))
    warm = Accounting(
        history.store, PRICES, utilization=TelemetryUtilization(history.store.engine), clock=clock
    )
    month = datetime(2026, 11, 1, tzinfo=UTC)
    for step in (Step.DAY, Step.WHOLE, Step.MONTH, Step.DAY):
        got = warm.report(month, clock(), step)
        assert got == uncached(warm, month, clock(), step, None, clock())
        assert got.lines and got.unpriced_models == ("T4",)


def used_on(report: CostReport, day: datetime) -> Fraction:
    return sum(
        (x.used_gpu_hours for x in report.lines if x.period.start == epoch_seconds(day)),
        Fraction(0),
    )


@pytest.mark.parametrize("asked", ["at once", "after the day settled"])
def test_a_late_sample_inside_the_open_horizon_changes_the_report(db_url: str, asked: str) -> None:
    h = simulate(db_url, 3)
    try:
        acc = Accounting(
            h.store, PRICES, utilization=TelemetryUtilization(h.store.engine), clock=h.clock
        )
        month = datetime(2026, 11, 1, tzinfo=UTC)
        before = acc.report(month, h.clock(), Step.DAY)
        # A GPU that ran yesterday reports a sample now (within the raw retention): the minute
        # was unmeasured and now is busy, so yesterday's used GPU-hours grow.
        yesterday = h.clock() - timedelta(days=1)
        (held,) = next(w for w in h.alloc.workloads() if w.name == "keeper").allocations
        at = yesterday.replace(second=30, microsecond=0)
        batch = SampleBatch(
            node=held.node,
            source=Source.NVML,
            samples=[
                GpuSample(
                    gpu_uuid=held.gpu_uuids[0],
                    at=at.timestamp(),
                    utilization_pct=100.0,
                    memory_used_mib=1.0,
                    memory_total_mib=81920.0,
                )
            ],
        )
        assert h.telemetry.ingest(batch).accepted == 1
        h.telemetry.maintain()
        if asked == "after the day settled":
            # Nothing asked until the day is past the late-sample horizon: its kept lines are
            # checked one last time.
            h.clock.advance(days=3)
        after = acc.report(month, h.clock(), Step.DAY)
        assert after == uncached(acc, month, h.clock(), Step.DAY, None, h.clock())
        midnight = yesterday.replace(hour=0, minute=0, second=0, microsecond=0)
        assert used_on(after, midnight) > used_on(before, midnight)
        # And an allocation released now ends today's lines there.
        running = next(w for w in h.alloc.workloads() if w.state is WorkloadState.RUNNING)
        h.alloc.release(running.id)
        h.clock.advance(hours=1)
        assert acc.report(month, h.clock(), Step.DAY) == uncached(
            acc, month, h.clock(), Step.DAY, None, h.clock()
        )
    finally:
        h.store.close()


def test_a_warm_report_reads_only_the_allocations_of_its_open_days(db_url: str) -> None:
    h = simulate(db_url, 4)
    try:
        acc = Accounting(
            h.store, PRICES, utilization=TelemetryUtilization(h.store.engine), clock=h.clock
        )
        month = datetime(2026, 11, 1, tzinfo=UTC)
        acc.report(month, h.clock(), Step.DAY)
        h.clock.advance(seconds=1)  # within the same second the open hour's answer is kept
        reads: list[Any] = []

        def seen(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
            if "FROM allocations" in statement:
                reads.append(params)

        event.listen(h.store.engine, "before_cursor_execute", seen)
        try:
            warm = acc.report(month, h.clock(), Step.DAY)
        finally:
            event.remove(h.store.engine, "before_cursor_execute", seen)
        assert warm == uncached(acc, month, h.clock(), Step.DAY, None, h.clock())
        # One read, of the last hour or so: the days before ended (their allocation rows are
        # final) and are kept, and so are today's ended hours, those within the late-sample
        # horizon with the version of their measurements, which did not change.
        ended_until = epoch_seconds(h.clock()) - CLOSE_MARGIN_S
        first_open = ended_until - ended_until % 3600
        assert len(reads) == 1
        assert min(_times(reads[0])) == first_open
        days = (first_open - epoch_seconds(month)) // DAY_S
        assert len(acc.closed_days) == days + (first_open % DAY_S != 0)
    finally:
        h.store.close()


def test_reads_of_one_second_price_the_open_hour_once_until_something_changes(
    db_url: str,
) -> None:
    h = simulate(db_url, 5)
    try:
        acc = Accounting(
            h.store, PRICES, utilization=TelemetryUtilization(h.store.engine), clock=h.clock
        )
        month = datetime(2026, 11, 1, tzinfo=UTC)
        reads: list[Any] = []
        counting = [True]

        def seen(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
            if "FROM allocations" in statement and counting[0]:
                reads.append(params)

        def report(step: Step, end: datetime | None = None) -> CostReport:
            at = end or h.clock()
            got = acc.report(month, at, step)
            counting[0] = False  # the reference's own reads do not count
            assert got == uncached(acc, month, at, step, None, h.clock())
            counting[0] = True
            return got

        h.clock.now = h.clock.now.replace(microsecond=0)  # the reads below share one second
        daily = report(Step.DAY)
        event.listen(h.store.engine, "before_cursor_execute", seen)
        try:
            # The same second, nothing committed: the page's other reads price nothing again.
            h.clock.advance(microseconds=10)
            report(Step.WHOLE, end=datetime.fromtimestamp(daily.periods[-1].end, UTC))
            report(Step.DAY)
            assert reads == []
            # A commit moves the store's generation: priced again. The allocation was stamped
            # two seconds before it was committed (as a slow commit would be), so it belongs
            # to the second already priced: the kept answer would miss it.
            now = h.clock.now
            h.clock.now = now - timedelta(seconds=2)
            made = h.alloc.request(wl("a", gpus(1), name="late", owner="a-late"))
            assert made.state is WorkloadState.RUNNING
            h.clock.now = now + timedelta(microseconds=10)
            after = report(Step.DAY)
            assert len(reads) == 1
            assert "a-late" not in {x.owner for x in daily.lines}
            assert "a-late" in {x.owner for x in after.lines}
            # New measurements: the answer still equals pricing at once (a kept answer is used
            # only while the measurements' version stands).
            reads.clear()
            h.clock.advance(seconds=30)
            batch = sample(h.alloc, h.clock.now, random.Random(7))
            for node in {x.gpu_uuid.split("-")[1] for x in batch}:
                mine = [x for x in batch if x.gpu_uuid.split("-")[1] == node]
                h.telemetry.ingest(SampleBatch(node=node, source=Source.NVML, samples=mine))
            h.telemetry.maintain()
            report(Step.DAY)
        finally:
            event.remove(h.store.engine, "before_cursor_execute", seen)
    finally:
        h.store.close()


def _times(params: Any) -> list[int]:
    """The times bound to a statement (datetimes on PostgreSQL, ISO text on SQLite)."""
    out = []
    for v in params.values() if isinstance(params, dict) else params:
        if isinstance(v, str):
            try:
                v = datetime.fromisoformat(v)
            except ValueError:
                continue
        if isinstance(v, datetime):
            out.append(epoch_seconds(v.replace(tzinfo=UTC)))
    return out


def test_roll_ups_read_in_chunks_of_workloads_give_the_same_segments(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = TelemetryUtilization(history.store.engine)
    lo, hi = epoch_seconds(T0), epoch_seconds(history.end)
    intervals = usage_intervals(history.store, T0, history.end, history.end)
    for resolution in (60, 3600):
        whole = sorted(source(intervals, lo, hi, resolution), key=repr)
        assert whole  # the history was measured
        monkeypatch.setattr(telemetry_module, "IDS_PER_READ", 3)
        chunked = sorted(source(intervals, lo, hi, resolution), key=repr)
        monkeypatch.undo()
        assert chunked == whole


def test_threads_asking_at_once_get_the_uncached_answers(history: History) -> None:
    clock = ManualClock(history.end + timedelta(hours=5))
    acc = Accounting(
        history.store, PRICES, utilization=TelemetryUtilization(history.store.engine), clock=clock
    )
    rng = random.Random(11)
    questions = [random_question(rng, history.end) for _ in range(24)]

    def ask(q: tuple[datetime, datetime, Step, frozenset[str] | None, datetime | None]) -> bool:
        start, end, step, tenants, now = q
        got = acc.report(start, end, step, tenants, now=now)
        return got == uncached(acc, start, end, step, tenants, now or clock())

    with ThreadPoolExecutor(max_workers=6) as pool:
        assert all(pool.map(ask, questions + questions))


def test_the_day_in_progress_grows_hour_by_hour(history: History) -> None:
    # The report clock walks through a day of the history: each whole hour that ends is added
    # to the part of the day kept before, and every answer equals pricing at once.
    midnight = (history.end - timedelta(days=2)).replace(hour=0, minute=0, second=0, microsecond=0)
    clock = ManualClock(midnight + timedelta(minutes=12))
    acc = Accounting(
        history.store, PRICES, utilization=TelemetryUtilization(history.store.engine), clock=clock
    )
    month = datetime(2026, 11, 1, tzinfo=UTC)
    for _ in range(30):
        clock.advance(minutes=47)
        for step, tenants in ((Step.DAY, None), (Step.WHOLE, frozenset({"a"}))):
            got = acc.report(month, clock(), step, tenants)
            assert got == uncached(acc, month, clock(), step, tenants, clock()), clock()
    head = acc.closed_days.head(epoch_seconds(clock().replace(hour=0, minute=0, second=0)), 3600)
    assert head is not None
    ended = epoch_seconds(clock()) - CLOSE_MARGIN_S
    assert head[0].end == ended - ended % 3600


def test_warming_keeps_the_month_for_the_first_viewer(history: History) -> None:
    clock = ManualClock(history.end + timedelta(days=1))
    acc = Accounting(
        history.store, PRICES, utilization=TelemetryUtilization(history.store.engine), clock=clock
    )
    acc.warm()
    kept = len(acc.closed_days)
    assert kept > 0
    month = datetime(2026, 11, 1, tzinfo=UTC)
    # The Cost view's and the Tenant view's questions find the month's ended days kept (no
    # new block) and the answers are the uncached ones.
    for step, tenants in ((Step.DAY, None), (Step.WHOLE, None), (Step.WHOLE, frozenset({"b"}))):
        assert acc.report(month, clock(), step, tenants) == uncached(
            acc, month, clock(), step, tenants, clock()
        )
    assert len(acc.closed_days) == kept


def test_warming_at_the_first_instant_of_a_month_prices_nothing() -> None:
    store = Store("sqlite://")
    try:
        acc = Accounting(store, PRICES, clock=ManualClock(datetime(2026, 12, 1, tzinfo=UTC)))
        acc.warm()
        assert len(acc.closed_days) == 0
    finally:
        store.close()
