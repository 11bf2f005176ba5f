"""Why each request that met a cold start met one: a breakdown per cell from the requests'
times to first token, the service's replicas sampled every step and, for the forecast
strategy, its plan at each step.

A request **met a cold start** when no replica was ready or asleep at the last sample before
it came (every ``STEP_S``) and its time to first token was at least ``MIN_WAIT_S``: it waited
for a replica to load (a wake from the warm pool answers within a second; a slow answer
while a replica was ready is the machine, not a cold start, and is counted apart as
``slow, replica up``). The gateway's ``held_total`` counts loads and wakes alike; it is
reported beside. Each cold start is put in the first class that fits what the planner and
the service were doing when it came:

- ``untrusted``: the forecast was not trusted (its reason was not ``forecast``): the floor;
- ``refill after scale-down``: the pool was planned but had no loaded replica, and a replica
  had been ready within the last load time: the serving replica went (idle) and the pool
  only started loading then;
- ``planned too late``: the pool was planned but not loaded, nothing ready for a load time
  before: it was planned less than a load time ahead of the request;
- ``none planned``: no warm replica was planned (the forecast expected nothing) and none
  was ready: a scale from zero (every cold start of ``reactive``).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence

from policies.forecast import HOURS_PER_DAY

CLASSES = ("untrusted", "refill after scale-down", "planned too late", "none planned")
SLOW = "slow, replica up"
MIN_WAIT_S = 2.0
"""A wait no wake takes: the test engine's wake answers in milliseconds, a load in seconds."""


def _before(times: Sequence[float], t: float) -> int:
    """The index of the last sample at or before ``t``, -1 if none."""
    return bisect.bisect_right(times, t) - 1


def classify(
    requests: Sequence[tuple[float, float | None]],
    states: Sequence[tuple[float, int, int, int]],
    plans: Sequence[tuple[float, int, str]],
    load_s: float,
) -> tuple[list[float], Counter[str]]:
    """The arrivals of the requests that met a cold start, and each one's class, with the
    slow ones beside (module docstring). ``requests``: (arrival, TTFT or None); ``states``:
    (s, desired, ready, asleep); ``plans``: (s, warm planned, reason), empty for a strategy
    without a planner. Times are seconds into the trace."""
    st_t = [s[0] for s in states]
    pl_t = [p[0] for p in plans]
    cold: list[float] = []
    out: Counter[str] = Counter()
    for at, ttft in sorted(requests, key=lambda r: r[0]):
        if ttft is None or ttft < MIN_WAIT_S:
            continue
        i = _before(st_t, at)
        ready, asleep = (states[i][2], states[i][3]) if i >= 0 else (0, 0)
        if ready or asleep:
            out[SLOW] += 1
            continue
        cold.append(at)
        j = _before(pl_t, at)
        warm, reason = (plans[j][1], plans[j][2]) if j >= 0 else (0, "forecast")
        k = _before(st_t, at - load_s)
        recent = any(s[2] > 0 for s in states[max(0, k) : i + 1])
        if reason != "forecast":
            out["untrusted"] += 1
        elif warm > 0:
            out["refill after scale-down" if recent else "planned too late"] += 1
        else:
            out["none planned"] += 1
    return cold, out


def by_hour(cold: Sequence[float], day_s: float) -> Counter[int]:
    """Cold requests per simulated hour of the day."""
    return Counter(int((at % day_s) / (day_s / HOURS_PER_DAY)) for at in cold)
