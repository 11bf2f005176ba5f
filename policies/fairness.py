"""Weighted dominant-resource fair share over flavors, with a decayed usage history.

Usage and capacity are compared in GPU-equivalents (``policies.quota.gpu_equivalent``), per
flavor. A tenant's share is

    current  = max over flavors f of  used_geq[f] / capacity_geq[f]      (dominant share)
    past     = history / Σ_f capacity_geq[f]
    share    = ((1 - history_weight) * current + history_weight * past) / weight

``history`` is an exponentially decayed average of the tenant's GPU-equivalents in use: with a
half-life ``h`` and usage ``c`` constant since the last update ``Δ`` seconds ago,

    decay    = 2 ** (-Δ / h)
    history' = history * decay + c * (1 - decay)

which is the exact continuous-time average, so a tenant holding ``c`` forever converges to
``c`` and an idle tenant's history halves every ``h`` seconds.

Worked example (tested in ``tests/policies/test_fairness.py``): capacity 8 ``H100-80GB`` (8
GEQ) and 14 ``A100-40GB/1g.5gb`` (14 × 1/7 = 2 GEQ); a tenant of weight 2 uses 2 H100 (2/8 =
0.25) and 7 1g.5gb (1 GEQ, 1/2 = 0.5): current = 0.5. Its history was 4.0 GEQ one half-life
ago and it held 2.0 GEQ since: history' = 4.0 × 0.5 + 2.0 × 0.5 = 3.0, past = 3.0 / 10 = 0.3.
With history_weight 0.5: share = (0.5 × 0.5 + 0.5 × 0.3) / 2 = 0.2.

Queue order: priority (high first), then the tenant's share (low first), then enqueue time
(early first), then the sequence number; deterministic for equal inputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Protocol, TypeVar

from policies.errors import InvalidRequest

DEFAULT_HISTORY_WEIGHT = 0.5


def _half_life(half_life_s: float) -> float:
    if not (isinstance(half_life_s, int | float) and math.isfinite(half_life_s)) or (
        half_life_s <= 0
    ):
        raise InvalidRequest("half_life_s", half_life_s, "a number of seconds > 0")
    return float(half_life_s)


def _decay(last_at: float, now: float, half_life_s: float) -> float:
    # A clock that steps back (restart, skew) must not inflate history: treat it as no time.
    elapsed = max(0.0, now - last_at)
    return math.pow(2.0, -elapsed / _half_life(half_life_s))


def decayed(value: float, last_at: float, now: float, half_life_s: float) -> float:
    """``value`` recorded at ``last_at``, halved for every ``half_life_s`` until ``now``."""
    return value * _decay(last_at, now, half_life_s)


def accumulate(
    history_value: float,
    last_at: float,
    now: float,
    current_gpu_equivalents: float,
    half_life_s: float,
) -> float:
    """Fold ``current_gpu_equivalents``, held from ``last_at`` to ``now``, into the history."""
    if current_gpu_equivalents < 0:
        raise InvalidRequest("current_gpu_equivalents", current_gpu_equivalents, "a number >= 0")
    d = _decay(last_at, now, half_life_s)
    return history_value * d + current_gpu_equivalents * (1.0 - d)


def dominant_share(
    usage_geq_by_flavor: Mapping[str, float],
    capacity_geq_by_flavor: Mapping[str, float],
    weight: float,
    history: float = 0.0,
    history_weight: float = DEFAULT_HISTORY_WEIGHT,
) -> float:
    """The tenant's weighted share (module docstring). Flavors without capacity count as
    fully used when the tenant holds any of them (1.0), and are otherwise ignored."""
    if not weight > 0:
        raise InvalidRequest("weight", weight, "a number > 0")
    if not 0.0 <= history_weight <= 1.0:
        raise InvalidRequest("history_weight", history_weight, "a number from 0 to 1")
    current = 0.0
    for flavor, used in usage_geq_by_flavor.items():
        cap = capacity_geq_by_flavor.get(flavor, 0.0)
        if cap > 0:
            current = max(current, used / cap)
        elif used > 0:
            current = max(current, 1.0)
    total = sum(c for c in capacity_geq_by_flavor.values() if c > 0)
    past = history / total if total > 0 else 0.0
    return ((1.0 - history_weight) * current + history_weight * past) / weight


class Queued(Protocol):
    """What ``queue_order`` needs from a pending item."""

    @property
    def priority(self) -> int: ...
    @property
    def tenant(self) -> str: ...
    @property
    def enqueued_at(self) -> float: ...
    @property
    def seq(self) -> int: ...


QueuedT = TypeVar("QueuedT", bound=Queued)


def queue_key(item: Queued, shares: Mapping[str, float]) -> tuple[int, float, float, int]:
    """Where ``item`` sorts: priority desc, tenant share asc (missing: 0), enqueue time, seq."""
    return (-item.priority, shares.get(item.tenant, 0.0), item.enqueued_at, item.seq)


def queue_order(items: Iterable[QueuedT], shares: Mapping[str, float]) -> list[QueuedT]:
    """Items sorted by ``queue_key``."""
    return sorted(items, key=lambda i: queue_key(i, shares))
