"""Cost accounting over the store: summaries, chargeback, budgets with burn rate and forecast.

``Accounting`` joins three sources and prices them with ``policies.pricing``:
- allocation history (``history.usage_intervals``), the only source of allocated time;
- prices and money budgets (``prices.PriceConfig``);
- measured utilization, when a source is given (``UtilizationSource``): efficiency and idle
  spend need it; without one, used GPU-hours, efficiency and idle spend are reported as unknown
  rather than as zero.

Periods are UTC calendar days or months, or the whole window asked for. Budgets run per calendar
month (UTC), like the allocator's GPU-hour budgets (``Quota.budget_gpu_hours``).
"""

from __future__ import annotations

import bisect
import calendar
import itertools
import math
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from fractions import Fraction
from typing import Protocol

from policies.alerts.samples import BudgetSample
from policies.errors import InvalidRequest
from policies.flavors import Flavor
from policies.pricing import (
    DEFAULT_IDLE_THRESHOLD_PCT,
    CostLine,
    CostTotal,
    GroupBy,
    Period,
    PriceBook,
    PriceChange,
    PriceSchedule,
    UsageInterval,
    UtilizationSegment,
    chargeback_csv,
    cost_lines,
    projected_spend,
    totals,
)
from portal.accounting.closed_days import (
    CLOSE_MARGIN_S,
    DAY_S,
    DEFAULT_MAX_DAYS,
    ClosedDays,
    blocks,
    can_keep,
)
from portal.accounting.history import epoch_seconds, usage_intervals
from portal.accounting.prices import PriceConfig
from portal.store.records import QuotaRecord
from portal.store.writer import Store

MAX_PERIODS = 1000
PRICED_KEPT = 16
"""Answers of ``Accounting._price`` kept (the open hours of the windows read last)."""
"""Most periods one question may split into (about three years of days)."""


class UtilizationSource(Protocol):
    """Measured utilization of the allocations behind ``intervals`` within ``[start, end)``
    (epoch s): segments per allocation id, non-overlapping per allocation, in percent of what
    the allocation holds. Seconds without a segment are unmeasured.
    ``portal.accounting.telemetry.TelemetryUtilization`` reads the telemetry roll-ups.

    Contract (closed days are priced once, ``portal.accounting.closed_days``): at one
    ``resolution_s``, the segments read for a part ``[a, b)`` of a window agree, within
    ``[a, b)``, with those read for the whole window; what a source answers about a time no
    longer changes ``settle_s`` seconds after it; until then, ``version`` changes whenever
    what it answers about ``[start, end)`` does.
    """

    settle_s: float

    def resolution_s(self, start: int, end: int) -> int:
        """The measurement step a report over ``[start, end)`` reads at."""
        ...

    def version(self, start: int, end: int, resolution_s: int) -> object:
        """A value (compared with ``==``) that changes when the measurements of
        ``[start, end)`` at ``resolution_s`` do."""
        ...

    def __call__(
        self, intervals: Sequence[UsageInterval], start: int, end: int, resolution_s: int
    ) -> Iterable[UtilizationSegment]: ...


class Step(StrEnum):
    """How a window is split into periods."""

    WHOLE = "whole"
    DAY = "day"
    MONTH = "month"


def month_of(at: datetime) -> Period:
    """The UTC calendar month holding ``at``."""
    start = datetime(at.year, at.month, 1, tzinfo=UTC)
    days = calendar.monthrange(at.year, at.month)[1]
    return Period(epoch_seconds(start), epoch_seconds(start + timedelta(days=days)))


def periods(start: datetime, end: datetime, step: Step) -> list[Period]:
    """``[start, end)`` split at UTC day or month boundaries (the first and last may be partial)."""
    lo, hi = epoch_seconds(start), epoch_seconds(end)
    if hi <= lo:
        raise InvalidRequest(
            "window", f"{start.isoformat()} .. {end.isoformat()}", "end after start"
        )
    if step is Step.WHOLE:
        return [Period(lo, hi)]
    cuts = [lo]
    at = start.astimezone(UTC)
    while True:
        if step is Step.DAY:
            at = datetime(at.year, at.month, at.day, tzinfo=UTC) + timedelta(days=1)
        else:
            at = datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)
        t = epoch_seconds(at)
        if t >= hi:
            break
        cuts.append(t)
        if len(cuts) > MAX_PERIODS:
            raise InvalidRequest(
                "window",
                f"{start.isoformat()} .. {end.isoformat()} by {step}",
                f"at most {MAX_PERIODS} periods",
            )
    cuts.append(hi)
    return [Period(a, b) for a, b in itertools.pairwise(cuts)]


@dataclass(frozen=True, slots=True)
class CostReport:
    """Exact cost lines of a window and what they rest on."""

    periods: tuple[Period, ...]
    lines: tuple[CostLine, ...]
    currency: str
    measured: bool  # a utilization source was asked; used hours, efficiency, idle are known
    unpriced_models: tuple[str, ...]  # allocated but without a price: counted at 0

    def grouped(self, by: Sequence[GroupBy]) -> dict[tuple[str, ...], CostTotal]:
        return totals(self.lines, by)

    def total(self) -> CostTotal:
        return totals(self.lines, ()).get(
            (), CostTotal(Fraction(0), Fraction(0), Fraction(0), Fraction(0))
        )


class BudgetKind(StrEnum):
    MONEY = "money"  # a tenant's monthly amount, from the pricing configuration
    GPU_HOURS = "gpu_hours"  # a quota's GPU-equivalent-hours per month


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """A budget in the current month: spent so far, burn rate and forecast to the month's end.

    Amounts are in the currency (money) or GPU-equivalent-hours (gpu_hours), exact.
    """

    tenant: str
    flavor: str | None  # the quota's flavor for gpu_hours budgets
    kind: BudgetKind
    period: Period
    budget: Fraction
    spent: Fraction
    burn_per_hour: Fraction  # spent / elapsed hours
    projected: Fraction  # spent / elapsed x period length
    exhausted_at: int | None  # when the budget runs out at this rate (epoch s), if in the period

    @property
    def over(self) -> bool:
        return self.projected > self.budget


class Accounting:
    """Prices the allocation history of ``store``. Safe to share between threads (the store
    and ``closed_days``, the lines of closed days it keeps, are thread-safe).

    ``max_closed_days`` bounds how many closed days' lines are kept (least recently used go).
    """

    def __init__(
        self,
        store: Store,
        prices: PriceConfig | None = None,
        *,
        utilization: UtilizationSource | None = None,
        idle_threshold_pct: float = DEFAULT_IDLE_THRESHOLD_PCT,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        max_closed_days: int = DEFAULT_MAX_DAYS,
    ) -> None:
        self.store = store
        self.prices = prices or PriceConfig()
        self.utilization = utilization
        self.idle_threshold_pct = idle_threshold_pct
        self.clock = clock
        self.closed_days = ClosedDays(max_closed_days)
        self._priced: dict[tuple[object, ...], tuple[CostLine, ...]] = {}
        self._priced_lock = threading.Lock()

    def report(
        self,
        start: datetime,
        end: datetime,
        step: Step = Step.WHOLE,
        tenants: Collection[str] | None = None,
        *,
        now: datetime | None = None,
    ) -> CostReport:
        """Cost lines of ``[start, end)`` split by ``step``, for ``tenants`` (None: all);
        allocations still held count until ``now`` (default: the clock).

        Whole UTC days that ended (allocation rows final), and the ended hours of the day in
        progress, come from ``closed_days`` (priced once, every tenant; while late
        measurements may still come, checked against the utilization source's ``version``);
        the rest (a partial first or last day, the last hour or so) is priced now, reading
        only the allocations that overlap it. The exact sums equal pricing the window at once.
        """
        chosen = periods(start, end, step)
        held_until = now if now is not None else self.clock()
        lo, hi = chosen[0].start, chosen[-1].end
        resolution = self.utilization.resolution_s(lo, hi) if self.utilization is not None else 0
        ended_until, settled_until = self._closed_until(held_until)
        shown = None if tenants is None else frozenset(tenants)
        lines: list[CostLine] = []
        for run, ended in _runs(blocks(lo, hi, ended_until), ended_until):
            if ended:
                lines += self._closed_lines(run, resolution, shown, settled_until)
            else:
                lines += self._price(run, shown, held_until, resolution)
        merged = _rekey(lines, chosen)
        models = {Flavor.parse(line.flavor).model for line in merged}
        return CostReport(
            periods=tuple(chosen),
            lines=tuple(merged),
            currency=self.prices.currency,
            measured=self.utilization is not None,
            unpriced_models=tuple(sorted(models - set(self.prices.book.schedules))),
        )

    def _closed_until(self, held_until: datetime) -> tuple[int, int]:
        """Blocks ending at or before the first time (epoch s) have their final allocation
        rows; those ending at or before the second, their final measurements too."""
        now_s = epoch_seconds(self.clock())
        # A report that stops held allocations before a day ends prices that day its own way.
        ended = min(now_s - CLOSE_MARGIN_S, epoch_seconds(held_until))
        if self.utilization is None:
            return ended, ended
        return ended, min(ended, now_s - CLOSE_MARGIN_S - math.ceil(self.utilization.settle_s))

    def _closed_lines(
        self,
        ended: Sequence[Period],
        resolution: int,
        tenants: frozenset[str] | None,
        settled_until: int,
    ) -> list[CostLine]:
        """Lines of ``ended`` blocks (``can_keep``) of ``tenants``, pricing (every tenant)
        those not kept.

        A block whose measurements may still change is kept with the source's ``version`` of
        them and priced again when that differs; once settled, it is checked one last time.
        """
        self.closed_days.bind((self.prices.book, self.idle_threshold_pct, self.utilization))
        found: dict[Period, tuple[CostLine, ...]] = {}
        missing: dict[Period, object] = {}  # block -> the version its new lines are kept with
        for b in ended:
            kept = self.closed_days.get(b, resolution)
            if kept is not None and kept.version is None:
                found[b] = kept.lines
                continue
            version = None
            if self.utilization is not None and (kept is not None or b.end > settled_until):
                # Read before pricing: a change in between makes the next look price again.
                version = self.utilization.version(b.start, b.end, resolution)
            if kept is not None and kept.version == version:
                found[b] = kept.lines
                if b.end <= settled_until:
                    self.closed_days.put(b, resolution, kept.lines, None)
                continue
            missing[b] = None if b.end <= settled_until else version
        for b in [b for b in missing if b.seconds != DAY_S]:
            grown = self._grown_head(b, resolution)
            if grown is not None:
                self.closed_days.put(b, resolution, grown, missing.pop(b))
                found[b] = tuple(grown)
        for run in _contiguous([b for b in ended if b in missing]):
            by_block: dict[Period, list[CostLine]] = {b: [] for b in run}
            until = datetime.fromtimestamp(run[-1].end, UTC)
            for line in self._price(run, None, until, resolution):
                by_block[line.period].append(line)
            for b, block_lines in by_block.items():
                self.closed_days.put(b, resolution, block_lines, missing[b])
                found[b] = tuple(block_lines)
        out: list[CostLine] = []
        for b in ended:
            out += (x for x in found[b] if tenants is None or x.tenant in tenants)
        return out

    def _grown_head(self, block: Period, resolution: int) -> list[CostLine] | None:
        """Lines of the day in progress up to ``block.end`` from the shorter part of it kept
        before (if still valid) and the hours since: an hour later, one hour is priced, not
        the whole day again."""
        head = self.closed_days.head(block.start, resolution)
        if head is None or head[0].end >= block.end:
            return None
        before, kept = head
        utilization = self.utilization
        if (
            kept.version is not None
            and utilization is not None
            and kept.version != utilization.version(before.start, before.end, resolution)
        ):
            return None
        since = Period(before.end, block.end)
        until = datetime.fromtimestamp(block.end, UTC)
        return _rekey([*kept.lines, *self._price([since], None, until, resolution)], [block])

    def _price(
        self,
        pieces: Sequence[Period],
        tenants: Collection[str] | None,
        held_until: datetime,
        resolution: int,
    ) -> list[CostLine]:
        """Lines of the contiguous ``pieces``, priced from the allocations overlapping them.

        The last few answers are kept: the reads of one page (a report by day, by flavor, by
        owner, budgets) price the same open hour up to the same second. A kept answer is
        used only for the same pieces, tenants, resolution and end of held allocations (a
        whole second, as pricing counts), while the store's generation (nothing committed)
        and the measurements' version are unchanged: it is what pricing again would give.
        """
        lo, hi = pieces[0].start, pieces[-1].end
        version = self.utilization.version(lo, hi, resolution) if self.utilization else None
        key = (
            tuple(pieces),
            None if tenants is None else frozenset(tenants),
            resolution,
            min(epoch_seconds(held_until), hi),
            self.store.generation,
            version,
        )
        with self._priced_lock:
            kept = self._priced.get(key)
        if kept is not None:
            return list(kept)
        start, end = datetime.fromtimestamp(lo, UTC), datetime.fromtimestamp(hi, UTC)
        intervals = usage_intervals(self.store, start, end, held_until, tenants)
        lines: list[CostLine] = []
        if intervals:
            book = self.book_for(intervals)
            segments: list[UtilizationSegment] = []
            if self.utilization is not None:
                segments = list(self.utilization(intervals, lo, hi, resolution))
            lines = cost_lines(intervals, book, pieces, segments, self.idle_threshold_pct)
        with self._priced_lock:
            self._priced[key] = tuple(lines)
            while len(self._priced) > PRICED_KEPT:
                self._priced.pop(next(iter(self._priced)))
        return lines

    def chargeback(
        self, start: datetime, end: datetime, step: Step, tenants: Collection[str] | None = None
    ) -> str:
        """The chargeback CSV of the window (see ``policies.pricing.chargeback_csv``)."""
        report = self.report(start, end, step, tenants)
        return chargeback_csv(report.lines, report.currency)

    def budgets(
        self,
        quotas: Iterable[QuotaRecord],
        tenants: Collection[str] | None = None,
        *,
        now: datetime | None = None,
    ) -> list[BudgetStatus]:
        """Every money budget (configured per tenant) and GPU-hour budget (on ``quotas``) of
        ``tenants`` (None: all) in the UTC month of ``now`` (default: the clock) until then,
        tenants in name order."""
        now = now if now is not None else self.clock()
        month = month_of(now)
        now_s = min(max(epoch_seconds(now), month.start + 1), month.end)
        gpu = [
            q
            for q in quotas
            if q.budget_gpu_hours is not None and (tenants is None or q.tenant in tenants)
        ]
        money = {t: b for t, b in self.prices.budgets.items() if tenants is None or t in tenants}
        if not gpu and not money:
            return []
        start = datetime.fromtimestamp(month.start, UTC)
        end = datetime.fromtimestamp(now_s, UTC)
        report = self.report(start, end, Step.WHOLE, tenants, now=now)
        by_tenant = report.grouped((GroupBy.TENANT,))
        by_flavor = report.grouped((GroupBy.TENANT, GroupBy.FLAVOR))
        zero = CostTotal(Fraction(0), Fraction(0), Fraction(0), Fraction(0))
        out = [
            _status(
                t, None, BudgetKind.MONEY, month, now_s, Fraction(b), by_tenant.get((t,), zero).cost
            )
            for t, b in money.items()
        ]
        for q in gpu:
            assert q.budget_gpu_hours is not None
            spent = by_flavor.get((q.tenant, q.flavor), zero).allocated_gpu_hours
            # From the shortest repr: a budget of 0.1 means 1/10, not its binary float.
            budget = Fraction(repr(q.budget_gpu_hours))
            out.append(
                _status(
                    q.tenant,
                    q.flavor,
                    BudgetKind.GPU_HOURS,
                    month,
                    now_s,
                    budget,
                    spent,
                )
            )
        return sorted(out, key=lambda b: (b.tenant, b.kind, b.flavor or ""))

    def warm(self) -> None:
        """Price the month so far by day for every tenant, as the Cost view and the Tenant
        view's members ask for it: its ended days are then kept, so the first viewer after a
        start (or after a day ends) does not wait for a cold month. The service runs this at
        start and every few minutes."""
        now = self.clock()
        start = datetime.fromtimestamp(month_of(now).start, UTC)
        if now > start:
            self.report(start, now, Step.DAY, now=now)

    def budget_samples(
        self, at: float | None = None, tenants: Collection[str] | None = None
    ) -> list[BudgetSample]:
        """Money budgets at ``at`` (epoch s; default: the clock) as the alert engine's samples
        (rule ``budget_burn``); usable as ``portal.alerting``'s ``BudgetSource``."""
        now = datetime.fromtimestamp(at, UTC) if at is not None else self.clock()
        return [
            BudgetSample(
                tenant=b.tenant,
                at=now.timestamp(),
                spent=_decimal(b.spent),
                budget=_decimal(b.budget),
                period_start=b.period.start,
                period_end=b.period.end,
            )
            for b in self.budgets((), tenants, now=now)
        ]

    def book_for(self, intervals: Iterable[UsageInterval]) -> PriceBook:
        """The configured prices, plus a price of 0 for allocated models without one (so their
        GPU-hours still count; the report lists them as unpriced)."""
        book = self.prices.book
        missing = sorted({iv.flavor.model for iv in intervals} - set(book.schedules))
        if not missing:
            return book
        free = {m: PriceSchedule(m, (PriceChange(0, Decimal(0)),)) for m in missing}
        return PriceBook({**book.schedules, **free})


def _runs(pieces: Sequence[Period], ended_until: int) -> list[tuple[list[Period], bool]]:
    """Consecutive blocks grouped by whether their lines can be kept (``can_keep``)."""
    out: list[tuple[list[Period], bool]] = []
    for p in pieces:
        closed = can_keep(p, ended_until)
        if out and out[-1][1] == closed:
            out[-1][0].append(p)
        else:
            out.append(([p], closed))
    return out


def _contiguous(blocks: Sequence[Period]) -> list[list[Period]]:
    """``blocks`` (in order) in runs without gaps: each run is read and priced at once."""
    out: list[list[Period]] = []
    for d in blocks:
        if out and out[-1][-1].end == d.start:
            out[-1].append(d)
        else:
            out.append([d])
    return out


def _rekey(lines: Iterable[CostLine], chosen: Sequence[Period]) -> list[CostLine]:
    """Lines of blocks summed into the ``chosen`` period holding each block, in
    ``cost_lines``' order (period, tenant, owner, flavor). Every block lies inside one chosen
    period: periods are cut at UTC midnights, blocks at every midnight."""
    starts = [p.start for p in chosen]
    acc: dict[tuple[Period, str, str, str], list[Fraction]] = {}
    for line in lines:
        period = chosen[bisect.bisect_right(starts, line.period.start) - 1]
        row = acc.setdefault((period, line.tenant, line.owner, line.flavor), [Fraction(0)] * 4)
        row[0] += line.allocated_gpu_hours
        row[1] += line.used_gpu_hours
        row[2] += line.cost
        row[3] += line.idle_cost
    return [CostLine(*key, *acc[key]) for key in sorted(acc, key=lambda k: (k[0].start, *k[1:]))]


def _status(
    tenant: str,
    flavor: str | None,
    kind: BudgetKind,
    month: Period,
    now_s: int,
    budget: Fraction,
    spent: Fraction,
) -> BudgetStatus:
    elapsed = now_s - month.start
    rate_per_s = spent / elapsed
    exhausted: int | None = None
    if rate_per_s > 0:
        # At a steady rate the budget runs out after budget / rate seconds of the month.
        t = month.start + budget / rate_per_s
        if t < month.end:
            exhausted = int(t)
    return BudgetStatus(
        tenant=tenant,
        flavor=flavor,
        kind=kind,
        period=month,
        budget=budget,
        spent=spent,
        burn_per_hour=rate_per_s * 3600,
        projected=projected_spend(spent, month, now_s),
        exhausted_at=exhausted,
    )


def _decimal(x: Fraction) -> Decimal:
    return Decimal(x.numerator) / Decimal(x.denominator)
