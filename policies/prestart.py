"""The pre-start planner: how many notebook environments to keep started, per spawn option,
so that the spawns expected in the next minutes find one ready.

Like z2jh's user placeholders, a pre-started environment only uses what nobody else needs:

- it is sized from the forecast: spawns of an option arrive at the forecast hourly rate, as a
  Poisson process, so over ``horizon_s`` the count is Poisson with mean
  ``rate * horizon_s / 3600``; the planner keeps the smallest number that covers them with
  probability ``1 - miss`` (the Poisson quantile), at most ``max_per_option``;
- it never holds capacity a queued user needs: an option whose flavor has a queue gets none,
  and none takes more than the flavor's free capacity;
- it stays within the platform's budget (GPU-equivalents over every option), filled by the
  options most likely to be picked first, one environment at a time, so a budget too small
  for every option's quantile still covers the likeliest spawns.

Pure: the forecast, free capacity and queue are arguments; the caller reads them and acts.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from policies.errors import InvalidRequest

DEFAULT_HORIZON_S = 600.0
"""The minutes ahead a pre-started environment must cover: 10."""

DEFAULT_MISS = 0.2
"""The chance, per option, that the horizon brings more spawns than environments kept."""

DEFAULT_MAX_PER_OPTION = 4


class PrestartReason(StrEnum):
    """Why an option has the count it has."""

    FORECAST = "forecast"  # the Poisson quantile of its forecast spawns
    BUDGET = "budget"  # fewer: the platform's budget ran out
    CAPACITY = "capacity"  # fewer: its flavor has no more free capacity
    QUEUED = "queued"  # none: users wait for its flavor
    NO_DEMAND = "no-demand"  # none: no spawn forecast


@dataclass(frozen=True, slots=True)
class PrestartOption:
    """A spawn option and its forecast: ``cost`` GPU-equivalents per environment (0 for CPU
    only), spawns per hour forecast for the coming hour."""

    key: str
    flavor: str
    cost: float
    spawns_per_hour: float

    def __post_init__(self) -> None:
        for name, value in (("cost", self.cost), ("spawns_per_hour", self.spawns_per_hour)):
            if not math.isfinite(value) or value < 0:
                raise InvalidRequest(f"{self.key}.{name}", value, "a finite number >= 0")


@dataclass(frozen=True, slots=True)
class PrestartTarget:
    key: str
    count: int
    reason: PrestartReason


def poisson_quantile(mean: float, miss: float, cap: int) -> int:
    """The smallest ``k <= cap`` with ``P(N > k) <= miss`` for ``N ~ Poisson(mean)``."""
    term = math.exp(-mean)  # P(N = 0)
    covered = term
    k = 0
    while 1.0 - covered > miss and k < cap:
        k += 1
        term *= mean / k
        covered += term
    return k


def plan_prestart(
    options: Sequence[PrestartOption],
    *,
    budget: float,
    free: Mapping[str, float],
    queued: Collection[str],
    horizon_s: float = DEFAULT_HORIZON_S,
    miss: float = DEFAULT_MISS,
    max_per_option: int = DEFAULT_MAX_PER_OPTION,
) -> list[PrestartTarget]:
    """Environments to keep per option, in the order of ``options``.

    Args:
        options: the spawn options with their forecast rate.
        budget: GPU-equivalents the platform lets pre-started environments hold in all.
        free: GPU-equivalents free per flavor now (held by nobody, reserved for no one).
        queued: flavors with a pending request: their options get none.
        horizon_s: how far ahead the environments must cover.
        miss: per option, the accepted chance of more spawns than environments.
        max_per_option: the most kept for one option.
    """
    if not math.isfinite(budget) or budget < 0:
        raise InvalidRequest("budget", budget, "GPU-equivalents >= 0")
    if not math.isfinite(horizon_s) or not 0 < horizon_s <= 86_400:
        raise InvalidRequest("horizon_s", horizon_s, "seconds from 1 to 86400")
    if not 0 < miss < 1:
        raise InvalidRequest("miss", miss, "a probability strictly between 0 and 1")
    if isinstance(max_per_option, bool) or not 0 <= max_per_option <= 64:
        raise InvalidRequest("max_per_option", max_per_option, "an integer from 0 to 64")
    if len({o.key for o in options}) != len(options):
        raise InvalidRequest("options", [o.key for o in options], "distinct keys")
    wanted: dict[str, int] = {}
    reason: dict[str, PrestartReason] = {}
    for o in options:
        mean = o.spawns_per_hour * horizon_s / 3600.0
        wanted[o.key] = poisson_quantile(mean, miss, max_per_option) if mean > 0 else 0
        if o.flavor in queued and o.cost > 0:
            reason[o.key] = PrestartReason.QUEUED
        elif wanted[o.key] == 0:
            reason[o.key] = PrestartReason.NO_DEMAND
        else:
            reason[o.key] = PrestartReason.FORECAST
    counts = {o.key: 0 for o in options}
    left = budget
    room = dict(free)
    # One environment at a time to the option whose next one is likeliest to be used: the
    # k-th environment of an option is used when at least k spawns come, P(N >= k).
    open_ = [o for o in options if reason[o.key] is PrestartReason.FORECAST]
    while open_:
        best = max(open_, key=lambda o: (_p_at_least(o, counts[o.key] + 1, horizon_s), -o.cost))
        if counts[best.key] >= wanted[best.key]:
            open_.remove(best)
            continue
        if best.cost > left + 1e-9:
            reason[best.key] = PrestartReason.BUDGET
            open_.remove(best)
            continue
        if best.cost > room.get(best.flavor, 0.0) + 1e-9 and best.cost > 0:
            reason[best.key] = PrestartReason.CAPACITY
            open_.remove(best)
            continue
        counts[best.key] += 1
        left -= best.cost
        if best.cost > 0:
            room[best.flavor] = room.get(best.flavor, 0.0) - best.cost
    return [PrestartTarget(o.key, counts[o.key], reason[o.key]) for o in options]


def _p_at_least(o: PrestartOption, k: int, horizon_s: float) -> float:
    """``P(N >= k)`` for the option's spawns over the horizon."""
    mean = o.spawns_per_hour * horizon_s / 3600.0
    term = math.exp(-mean)
    below = 0.0
    for i in range(k):
        below += term
        term *= mean / (i + 1)
    return max(0.0, 1.0 - below)
