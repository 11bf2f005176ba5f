"""Spawns per hour forecast for each spawn option, from the demand forecast.

The demand forecast knows arrivals per flavor (``portal.forecast.demand_series``, every
tenant's summed, Holt-Winters as the capacity view fits them); a spawn option is one shape of
request on a flavor. An option's rate is its flavor's forecast arrivals for the current hour
times the option's share of the flavor's recent arrivals: notebooks requested with exactly the
option's devices over all workloads placed on the flavor in the last ``recent_days``. Jobs and
services on a flavor thus lower its notebooks' share instead of counting as spawns.

The platform's own tenant (the placeholders) is left out of both: a placeholder must not
forecast itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import Table, select

from policies.forecast import holt_winters
from policies.requests import DeviceRequest, WorkloadKind
from portal.allocator import codec
from portal.forecast.series import demand_series
from portal.prestart.pool import PrestartSpec
from portal.store.models import metadata
from portal.store.writer import Store

_ALLOCATIONS: Table = metadata.tables["allocations"]
_WORKLOADS: Table = metadata.tables["workloads"]

HISTORY_DAYS = 28
"""Days of hourly arrivals the forecast learns from (as the capacity view's default)."""
RECENT_DAYS = 7
"""Days of placed workloads the options' shares are counted over."""


def shape(d: DeviceRequest) -> tuple[object, ...]:
    """What makes a request the same option: kind, count, models, MIG profile, share."""
    return (d.kind, d.count, tuple(sorted(d.models)), d.mig_profile, d.milli)


def flavor_arrivals(
    store: Store, now: datetime, *, exclude: str, history_days: int = HISTORY_DAYS
) -> dict[str, float]:
    """Arrivals per flavor forecast for the hour ``now`` is in (every tenant but
    ``exclude``); flavors without history are absent."""
    hour = now.replace(minute=0, second=0, microsecond=0)
    start = hour - timedelta(days=history_days)
    hours = history_days * 24
    per_flavor: dict[str, list[float]] = defaultdict(lambda: [0.0] * hours)
    for s in demand_series(store, start, hour, now):
        if s.tenant == exclude:
            continue
        total = per_flavor[s.flavor]
        for i, v in enumerate(s.arrivals):
            total[i] += v
    out: dict[str, float] = {}
    for flavor, series in per_flavor.items():
        # From the flavor's first arrival on: hours before it are no evidence of zero demand.
        first = next((i for i, v in enumerate(series) if v), None)
        if first is None:
            continue
        out[flavor] = max(0.0, holt_winters(series[first:], 1).values[0])
    return out


def option_shares(
    store: Store,
    options: Iterable[PrestartSpec],
    now: datetime,
    *,
    exclude: str,
    recent_days: int = RECENT_DAYS,
) -> dict[str, float]:
    """Each option's share of its flavor's workloads placed in the last ``recent_days``
    (notebooks of exactly its devices over all); options never spawned are absent."""
    by_shape = {(o.flavor, shape(o.devices)): o.key for o in options}
    a, w = _ALLOCATIONS.c, _WORKLOADS.c
    query = (
        select(w.id, w.kind, w.request, a.flavor)
        .join(_ALLOCATIONS, a.workload_id == w.id)
        .where(w.created_at >= now - timedelta(days=recent_days), w.tenant != exclude)
        .order_by(w.id, a.created_at, a.id)
    )
    seen: set[str] = set()
    placed: dict[str, int] = defaultdict(int)
    spawned: dict[str, int] = defaultdict(int)
    with store.engine.connect() as conn:
        for r in conn.execute(query):
            if r.id in seen:
                continue  # a gang's other members, or a later allocation
            seen.add(r.id)
            placed[r.flavor] += 1
            if r.kind != WorkloadKind.NOTEBOOK.value:
                continue
            key = by_shape.get((r.flavor, shape(codec.device_request_from_dict(r.request))))
            if key is not None:
                spawned[key] += 1
    flavor_of = {o.key: o.flavor for o in options}
    return {key: n / placed[flavor_of[key]] for key, n in spawned.items()}


def option_rates(
    store: Store, options: Sequence[PrestartSpec], now: datetime, *, exclude: str
) -> dict[str, float]:
    """Spawns per hour forecast for each option (module docstring)."""
    arrivals = flavor_arrivals(store, now, exclude=exclude)
    shares = option_shares(store, options, now, exclude=exclude)
    return {o.key: arrivals.get(o.flavor, 0.0) * shares.get(o.key, 0.0) for o in options}
