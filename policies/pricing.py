"""Prices, cost, efficiency and idle spend of allocation intervals. Pure: time is an argument.

Money is exact until the end: every amount is computed as a ``fractions.Fraction`` (a MIG
3g.40gb on a 7-slice GPU costs 3/7 of the GPU price, which no decimal holds exactly) and turned
into a ``decimal.Decimal`` of whole cents only when shown (``to_cents``), rounding half to even
(banker's rounding, ``ROUND_HALF_EVEN``) so that rounding errors do not drift one way over many
lines. Totals are rounded from exact sums, never summed from rounded lines.

Formulas (``docs/cost.md`` has a worked example):
- price of a flavor-hour = model price per GPU-hour x share, where the share is 1 for a whole
  GPU, compute slices / the model's total compute slices for a MIG instance, milli / 1000 for
  a share (``share_fraction``);
- cost of an interval = sum over its pieces of price in force x share x amount x seconds / 3600,
  split exactly at price changes and period boundaries;
- efficiency = used GPU-equivalent-hours / allocated GPU-equivalent-hours, where used is the
  allocated GPU-equivalents x measured utilization / 100;
- idle spend = cost of the allocated seconds whose measured utilization was below the idle
  threshold. Unmeasured seconds count as allocated, unused and not idle (no evidence either way).
"""

from __future__ import annotations

import bisect
import csv
import io
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from enum import StrEnum
from fractions import Fraction

from policies import mig
from policies.errors import InvalidRequest, NotFound
from policies.flavors import MILLI_PER_GPU, Flavor, FlavorKind

SECONDS_PER_HOUR = 3600
CENT = Decimal("0.01")
DEFAULT_IDLE_THRESHOLD_PCT = 5.0


def _epoch(field: str, value: int) -> None:
    # Whole seconds keep every split exact; a float would bring binary fractions in.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(field, repr(value), "whole epoch seconds (int)")


def to_cents(amount: Fraction | Decimal) -> Decimal:
    """Round an exact amount to whole cents, half to even (0.125 -> 0.12, 0.375 -> 0.38)."""
    if isinstance(amount, Fraction):
        # ``round`` of a Fraction is exact and rounds half to even.
        return (Decimal(round(amount * 100)) / 100).quantize(CENT)
    return amount.quantize(CENT, rounding=ROUND_HALF_EVEN)


@dataclass(frozen=True, slots=True)
class PriceChange:
    """A whole-GPU price per hour that applies from ``effective_from`` (epoch s) on."""

    effective_from: int
    per_gpu_hour: Decimal

    def __post_init__(self) -> None:
        _epoch("effective from", self.effective_from)
        price = self.per_gpu_hour
        if not isinstance(price, Decimal) or not price.is_finite() or price < 0:
            raise InvalidRequest("price per GPU-hour", price, "a finite Decimal >= 0")


@dataclass(frozen=True, slots=True)
class PriceSchedule:
    """The prices of one GPU model over time, earliest first."""

    model: str
    changes: tuple[PriceChange, ...]

    def __post_init__(self) -> None:
        if not self.changes:
            raise InvalidRequest("price schedule", self.model, "at least one price change")
        starts = [c.effective_from for c in self.changes]
        if any(b <= a for a, b in itertools.pairwise(starts)):
            raise InvalidRequest(
                "price schedule", f"{self.model} {starts}", "strictly increasing effective times"
            )

    def price_at(self, at: int) -> Decimal:
        """The price in force at ``at``; before the first change there is no price."""
        current: Decimal | None = None
        for change in self.changes:
            if change.effective_from > at:
                break
            current = change.per_gpu_hour
        if current is None:
            raise InvalidRequest(
                "time", f"{at} for {self.model}", f">= {self.changes[0].effective_from}"
            )
        return current

    def change_times(self, start: int, end: int) -> list[int]:
        """Effective times strictly inside ``(start, end)``."""
        return [c.effective_from for c in self.changes if start < c.effective_from < end]


@dataclass(frozen=True, slots=True)
class PriceBook:
    """Price schedules by GPU model."""

    schedules: Mapping[str, PriceSchedule]

    @classmethod
    def of(cls, *schedules: PriceSchedule) -> PriceBook:
        return cls({s.model: s for s in schedules})

    def schedule(self, model: str) -> PriceSchedule:
        try:
            return self.schedules[model]
        except KeyError:
            raise NotFound("priced GPU model", model, list(self.schedules)) from None


def share_fraction(flavor: Flavor) -> Fraction:
    """The part of a whole GPU one unit of ``flavor`` is priced as, exactly."""
    if flavor.kind is FlavorKind.GPU:
        return Fraction(1)
    if flavor.kind is FlavorKind.MIG:
        assert flavor.profile is not None
        geom = mig.geometry(flavor.model)
        return Fraction(geom.profile(flavor.profile).compute_slices, geom.compute_slices)
    return Fraction(1, MILLI_PER_GPU)


@dataclass(frozen=True, slots=True)
class Period:
    """A billing period ``[start, end)`` in epoch seconds."""

    start: int
    end: int

    def __post_init__(self) -> None:
        _epoch("period start", self.start)
        _epoch("period end", self.end)
        if self.end <= self.start:
            raise InvalidRequest("period", f"[{self.start}, {self.end})", "end > start")

    @property
    def seconds(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class UsageInterval:
    """One allocation held ``[start, end)`` (epoch s): ``amount`` units of ``flavor``."""

    allocation_id: str
    workload_id: str
    tenant: str
    owner: str
    flavor: Flavor
    amount: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not isinstance(self.amount, int) or self.amount <= 0:
            raise InvalidRequest("amount", self.amount, "a positive integer in the flavor's unit")
        _epoch("allocation start", self.start)
        _epoch("allocation end", self.end)
        if self.end < self.start:
            raise InvalidRequest(
                "allocation interval", f"[{self.start}, {self.end})", "end >= start"
            )

    @property
    def gpu_equivalent(self) -> Fraction:
        return share_fraction(self.flavor) * self.amount


@dataclass(frozen=True, slots=True)
class UtilizationSegment:
    """Measured utilization (% of the allocated share) of one allocation over ``[start, end)``."""

    allocation_id: str
    start: int
    end: int
    utilization_pct: float

    def __post_init__(self) -> None:
        u = self.utilization_pct
        if not isinstance(u, int | float) or math.isnan(u) or not 0 <= u <= 100:
            raise InvalidRequest("utilization", u, "a percentage in [0, 100]")
        _epoch("utilization start", self.start)
        _epoch("utilization end", self.end)
        if self.end <= self.start:
            raise InvalidRequest(
                "utilization segment", f"[{self.start}, {self.end})", "end > start"
            )


@dataclass(frozen=True, slots=True)
class CostLine:
    """Exact cost of one tenant, owner and flavor in one period. Hours are GPU-equivalent-hours."""

    period: Period
    tenant: str
    owner: str
    flavor: str
    allocated_gpu_hours: Fraction
    used_gpu_hours: Fraction
    cost: Fraction
    idle_cost: Fraction

    @property
    def efficiency(self) -> float | None:
        """Used over allocated GPU-equivalent-hours; ``None`` when nothing was allocated."""
        if self.allocated_gpu_hours == 0:
            return None
        return float(self.used_gpu_hours / self.allocated_gpu_hours)


class GroupBy(StrEnum):
    TENANT = "tenant"
    OWNER = "owner"
    FLAVOR = "flavor"
    PERIOD = "period"


@dataclass(frozen=True, slots=True)
class CostTotal:
    allocated_gpu_hours: Fraction
    used_gpu_hours: Fraction
    cost: Fraction
    idle_cost: Fraction

    @property
    def efficiency(self) -> float | None:
        if self.allocated_gpu_hours == 0:
            return None
        return float(self.used_gpu_hours / self.allocated_gpu_hours)


_Key = tuple[Period, str, str, str]  # period, tenant, owner, flavor


def _segments_by_allocation(
    segments: Iterable[UtilizationSegment],
) -> dict[str, list[UtilizationSegment]]:
    out: dict[str, list[UtilizationSegment]] = defaultdict(list)
    for seg in segments:
        out[seg.allocation_id].append(seg)
    for aid, segs in out.items():
        segs.sort(key=lambda s: s.start)
        for a, b in itertools.pairwise(segs):
            if b.start < a.end:
                raise InvalidRequest(
                    "utilization segments",
                    f"{aid} [{a.start}, {a.end}) and [{b.start}, {b.end})",
                    "segments of one allocation that do not overlap",
                )
    return out


def cost_lines(
    intervals: Iterable[UsageInterval],
    prices: PriceBook,
    periods: Sequence[Period],
    utilization: Iterable[UtilizationSegment] = (),
    idle_threshold_pct: float = DEFAULT_IDLE_THRESHOLD_PCT,
) -> list[CostLine]:
    """Exact cost per (period, tenant, owner, flavor), sorted by those keys.

    Time outside every period is not charged. Periods must not overlap.
    """
    if (
        isinstance(idle_threshold_pct, bool)
        or not isinstance(idle_threshold_pct, int | float)
        or not 0 <= idle_threshold_pct <= 100
    ):
        raise InvalidRequest("idle threshold", idle_threshold_pct, "a percentage in [0, 100]")
    ordered = sorted(periods, key=lambda p: p.start)
    for a, b in itertools.pairwise(ordered):
        if b.start < a.end:
            raise InvalidRequest(
                "periods", f"[{a.start}, {a.end}) and [{b.start}, {b.end})", "non-overlapping"
            )
    segs = _segments_by_allocation(utilization)
    bounds = sorted({t for p in ordered for t in (p.start, p.end)})
    ends = [p.end for p in ordered]
    # Whole seconds summed per group in the loop; money and hours become Fractions once per
    # group at the end. Exact, because every amount is linear in the seconds.
    held: dict[tuple[_Key, Fraction, Decimal], list[int]] = {}  # [allocated s, idle s]
    used: dict[tuple[_Key, Fraction], dict[int, int]] = {}  # denominator -> sum(s x numerator)
    for iv in intervals:
        sched = prices.schedule(iv.flavor.model)
        ge = iv.gpu_equivalent
        mine = segs.get(iv.allocation_id, [])
        cuts = {iv.start, iv.end, *sched.change_times(iv.start, iv.end)}
        cuts.update(
            bounds[bisect.bisect_right(bounds, iv.start) : bisect.bisect_left(bounds, iv.end)]
        )
        for seg in mine:
            cuts.update(t for t in (seg.start, seg.end) if iv.start < t < iv.end)
        points = sorted(cuts)
        pi = bisect.bisect_right(ends, points[0])  # the first period ending after the start
        si = 0
        # This interval's seconds by (period index, price) and utilization sums by period
        # index; merged into the groups once per interval, not once per piece.
        mine_held: dict[tuple[int, Decimal], list[int]] = {}
        mine_used: dict[int, dict[int, int]] = {}
        for lo, hi in itertools.pairwise(points):
            # Pieces go forward in time: the period and the segment holding ``lo`` only move on.
            while pi < len(ordered) and ordered[pi].end <= lo:
                pi += 1
            if pi == len(ordered):
                break
            if ordered[pi].start > lo:
                continue
            while si < len(mine) and mine[si].end <= lo:
                si += 1
            seconds = mine_held.setdefault((pi, sched.price_at(lo)), [0, 0])
            seconds[0] += hi - lo
            if si < len(mine) and mine[si].start <= lo:
                util = mine[si].utilization_pct
                num, den = util.as_integer_ratio()
                by_den = mine_used.setdefault(pi, {})
                by_den[den] = by_den.get(den, 0) + (hi - lo) * num
                if util < idle_threshold_pct:
                    seconds[1] += hi - lo
        flavor = str(iv.flavor)
        for (i, price), (allocated_s, idle_s) in mine_held.items():
            key: _Key = (ordered[i], iv.tenant, iv.owner, flavor)
            group = held.setdefault((key, ge, price), [0, 0])
            group[0] += allocated_s
            group[1] += idle_s
        for i, by_den in mine_used.items():
            group_used = used.setdefault(((ordered[i], iv.tenant, iv.owner, flavor), ge), {})
            for den, n in by_den.items():
                group_used[den] = group_used.get(den, 0) + n
    acc: dict[_Key, list[Fraction]] = {}
    for (key, ge, price), (allocated_s, idle_s) in held.items():
        sums = acc.setdefault(key, [Fraction(0)] * 4)
        per_second = ge / SECONDS_PER_HOUR
        sums[0] += per_second * allocated_s
        sums[2] += Fraction(price) * per_second * allocated_s
        sums[3] += Fraction(price) * per_second * idle_s
    for (key, ge), by_den in used.items():
        # used = allocated GPU-equivalent-hours x utilization / 100, summed exactly.
        measured = sum((Fraction(n, d) for d, n in by_den.items()), Fraction(0))
        acc[key][1] += ge * measured / (SECONDS_PER_HOUR * 100)
    return [
        CostLine(period, tenant, owner, flavor, *acc[(period, tenant, owner, flavor)])
        for period, tenant, owner, flavor in sorted(
            acc, key=lambda k: (k[0].start, k[1], k[2], k[3])
        )
    ]


def totals(lines: Iterable[CostLine], by: Sequence[GroupBy]) -> dict[tuple[str, ...], CostTotal]:
    """Exact sums of ``lines`` grouped by the named keys (periods keyed by their start)."""
    sums: dict[tuple[str, ...], list[Fraction]] = {}
    for line in lines:
        values = {
            GroupBy.TENANT: line.tenant,
            GroupBy.OWNER: line.owner,
            GroupBy.FLAVOR: line.flavor,
            GroupBy.PERIOD: str(line.period.start),
        }
        key = tuple(values[g] for g in by)
        row = sums.setdefault(key, [Fraction(0)] * 4)
        row[0] += line.allocated_gpu_hours
        row[1] += line.used_gpu_hours
        row[2] += line.cost
        row[3] += line.idle_cost
    return {k: CostTotal(*v) for k, v in sums.items()}


CHARGEBACK_COLUMNS = (
    "period_start",  # ISO 8601 UTC
    "period_end",  # ISO 8601 UTC, exclusive
    "tenant",
    "owner",
    "flavor",  # canonical flavor name
    "allocated_gpu_hours",  # GPU-equivalent-hours, 4 decimals
    "used_gpu_hours",  # GPU-equivalent-hours, 4 decimals
    "efficiency",  # used / allocated, 4 decimals; empty when nothing was allocated
    "cost",  # in ``currency``, cents, half to even
    "idle_cost",  # in ``currency``, cents, half to even
    "currency",
)


def _iso(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hours(x: Fraction) -> str:
    return str((Decimal(x.numerator) / Decimal(x.denominator)).quantize(Decimal("0.0001")))


def chargeback_csv(lines: Iterable[CostLine], currency: str = "USD") -> str:
    """The chargeback CSV text (header ``CHARGEBACK_COLUMNS``, one row per line, ``\\n`` ends)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CHARGEBACK_COLUMNS)
    for line in lines:
        eff = line.efficiency
        writer.writerow(
            (
                _iso(line.period.start),
                _iso(line.period.end),
                line.tenant,
                line.owner,
                line.flavor,
                _hours(line.allocated_gpu_hours),
                _hours(line.used_gpu_hours),
                "" if eff is None else f"{eff:.4f}",
                str(to_cents(line.cost)),
                str(to_cents(line.idle_cost)),
                currency,
            )
        )
    return buf.getvalue()


def projected_spend(spent: Decimal | Fraction, period: Period, now: int) -> Fraction:
    """Spend at the end of ``period`` at the burn rate so far: spent / elapsed x period length.

    Raises ``InvalidRequest`` before the period started (no rate yet); after it ended the
    projection is what was spent.
    """
    elapsed = min(now, period.end) - period.start
    if elapsed <= 0:
        raise InvalidRequest("time", now, f"> the period start {period.start}")
    return Fraction(spent) * period.seconds / elapsed
