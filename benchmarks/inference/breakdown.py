"""Why each request that met a cold start met one: a breakdown per cell from the requests'
times to first token, the service's replicas sampled every step and, for the forecast
strategy, its plan at each step.

A request **met a cold start** when its time to first token is at least half the engine's
load time (and at least 1 s): a wake from the warm pool answers within a second, a load takes
the load time, so the two cannot be confused at the load times measured. (The gateway's ``held_total``
counts both; it is reported beside.) Each such request is put in the first class that fits
what the planner and the service were doing when it arrived:

- ``untrusted``: the forecast was not trusted (its reason was not ``forecast``): the floor;
- ``refill after scale-down``: the pool was planned but had no loaded replica, and a replica
  had been ready within the last load time: the serving replica went (idle) and the pool
  only started loading then;
- ``planned too late``: the pool was planned but not loaded, nothing ready for a load time
  before: it was planned less than a load time ahead of the request;
- ``none planned``: no warm replica was planned (the forecast expected nothing) and none
  was ready: a scale from zero (every cold start of ``reactive``);
- ``other``: something was ready or asleep (a burst beyond the ready replicas, a sample
  older than the change).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence

from policies.forecast import HOURS_PER_DAY

CLASSES = ("untrusted", "refill after scale-down", "planned too late", "none planned", "other")


def _before(times: Sequence[float], t: float) -> int:
    """The index of the last sample at or before ``t``, -1 if none."""
    return bisect.bisect_right(times, t) - 1


def cold_requests(requests: Sequence[tuple[float, float | None]], load_s: float) -> list[float]:
    """The arrivals (s into the trace) of the answered requests that met a cold start."""
    least = max(load_s / 2, 1.0)
    return sorted(at for at, ttft in requests if ttft is not None and ttft >= least)


def classify(
    cold: Sequence[float],
    states: Sequence[tuple[float, int, int, int]],
    plans: Sequence[tuple[float, int, str]],
    load_s: float,
) -> Counter[str]:
    """Each cold request's class (module docstring). ``states``: (s, desired, ready, asleep);
    ``plans``: (s, warm planned, reason), empty for a strategy without a planner."""
    st_t = [s[0] for s in states]
    pl_t = [p[0] for p in plans]
    out: Counter[str] = Counter()
    for at in cold:
        i = _before(st_t, at)
        ready, asleep = (states[i][2], states[i][3]) if i >= 0 else (0, 0)
        j = _before(pl_t, at)
        warm, reason = (plans[j][1], plans[j][2]) if j >= 0 else (0, "forecast")
        k = _before(st_t, at - load_s)
        recent = any(s[2] > 0 for s in states[max(0, k) : i + 1])
        if ready or asleep:
            out["other"] += 1
        elif reason != "forecast":
            out["untrusted"] += 1
        elif warm > 0:
            out["refill after scale-down" if recent else "planned too late"] += 1
        else:
            out["none planned"] += 1
    return out


def by_hour(cold: Sequence[float], day_s: float) -> Counter[int]:
    """Cold requests per simulated hour of the day."""
    return Counter(int((at % day_s) / (day_s / HOURS_PER_DAY)) for at in cold)
