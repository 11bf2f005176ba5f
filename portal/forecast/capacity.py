"""The capacity outlook for leadership: forecast demand per flavor, week by week, against the
flavor's capacity and the guarantees sold on it.

Demand is the sum of every tenant's GPU-hours per hour, forecast as one series per flavor
(``policies.forecast.holt_winters``; the season follows how much history there is). A week's
``peak_gpus`` is its highest hourly forecast: GPU-equivalents held at once, the number to hold
against capacity. Guarantees are what tenants were promised: a flavor whose guarantees exceed
its capacity is oversold whatever the forecast says.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from policies import quota
from policies.errors import InvalidRequest
from policies.flavors import Flavor
from policies.forecast import HOURS_PER_WEEK, Method, holt_winters
from portal.forecast.series import demand_series
from portal.store.records import QuotaRecord
from portal.store.writer import Store

MAX_WEEKS = 13
MAX_HISTORY_DAYS = 365


@dataclass(frozen=True, slots=True)
class WeekOutlook:
    """One forecast week of one flavor."""

    start: datetime
    gpu_hours: float
    peak_gpus: float
    arrivals: float


@dataclass(frozen=True, slots=True)
class FlavorOutlook:
    """A flavor's forecast weeks against its capacity and guarantees (GPU-equivalents)."""

    flavor: str
    capacity_gpus: float
    guaranteed_gpus: float
    method: Method
    season_hours: int | None
    weeks: tuple[WeekOutlook, ...]


@dataclass(frozen=True, slots=True)
class CapacityOutlook:
    history_start: datetime
    forecast_start: datetime
    flavors: tuple[FlavorOutlook, ...]


def capacity_outlook(
    store: Store,
    capacity: Mapping[str, int],
    quotas: Iterable[QuotaRecord],
    now: datetime,
    *,
    weeks: int = 4,
    history_days: int = 28,
) -> CapacityOutlook:
    """Forecast ``weeks`` weeks from the hour ``now`` is in, learnt from ``history_days`` days
    before it (from each flavor's first demand on); every flavor with capacity, a guarantee
    or demand in the history.

    Args:
        store: the portal's store (read only).
        capacity: units per flavor (``Allocator.capacity``).
        quotas: every tenant's quotas (``Allocator.quotas()``).
        now: the current time (UTC).
    """
    for name, value, most in (
        ("weeks", weeks, MAX_WEEKS),
        ("history_days", history_days, MAX_HISTORY_DAYS),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise InvalidRequest(name, value, f"an integer from 1 to {most}")
    hour = now.replace(minute=0, second=0, microsecond=0)
    start = hour - timedelta(days=history_days)
    horizon = weeks * HOURS_PER_WEEK
    held: dict[str, list[float]] = defaultdict(lambda: [0.0] * (history_days * 24))
    arrived: dict[str, list[float]] = defaultdict(lambda: [0.0] * (history_days * 24))
    for s in demand_series(store, start, hour, now):
        _add(held[s.flavor], s.gpu_hours)
        _add(arrived[s.flavor], s.arrivals)
    guaranteed: dict[str, float] = defaultdict(float)
    for q in quotas:
        guaranteed[q.flavor] += quota.gpu_equivalent(Flavor.parse(q.flavor), q.guaranteed)
    flavors = sorted(set(capacity) | {f for f, g in guaranteed.items() if g} | set(held))
    out = []
    for name in flavors:
        # From the flavor's first demand on: hours before it (before the portal ran, or the
        # flavor existed) are no evidence of zero demand, and a season needs real history.
        first = _first_demand(held[name], arrived[name])
        demand = holt_winters(held[name][first:], horizon)
        arrivals = holt_winters(arrived[name][first:], horizon).values
        week_list = tuple(
            WeekOutlook(
                start=hour + timedelta(weeks=k),
                gpu_hours=sum(demand.values[k * HOURS_PER_WEEK : (k + 1) * HOURS_PER_WEEK]),
                peak_gpus=max(demand.values[k * HOURS_PER_WEEK : (k + 1) * HOURS_PER_WEEK]),
                arrivals=sum(arrivals[k * HOURS_PER_WEEK : (k + 1) * HOURS_PER_WEEK]),
            )
            for k in range(weeks)
        )
        out.append(
            FlavorOutlook(
                flavor=name,
                capacity_gpus=quota.gpu_equivalent(Flavor.parse(name), capacity.get(name, 0)),
                guaranteed_gpus=guaranteed.get(name, 0.0),
                method=demand.method,
                season_hours=demand.season,
                weeks=week_list,
            )
        )
    return CapacityOutlook(history_start=start, forecast_start=hour, flavors=tuple(out))


def _first_demand(*series: list[float]) -> int:
    """The first hour with demand in any of ``series``; the last hour when none has any."""
    n = len(series[0])
    return min((next((i for i, v in enumerate(s) if v), n - 1) for s in series), default=0)


def _add(total: list[float], values: Iterable[float]) -> None:
    for i, v in enumerate(values):
        total[i] += v
