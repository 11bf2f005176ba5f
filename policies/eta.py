"""A simple, explainable estimate of how long a pending workload waits.

Everything ahead of it in the queue (``position_amounts``) and the workload itself (``need``)
must fit, in the same unit, into what is free now plus what running work releases as it ends.
Walking the running work by expected end time, the estimate is the first end at which

    free_now + Σ released so far >= Σ position_amounts + need

Work with no expected end (``end_at`` infinite or NaN) releases nothing; work already past its
expected end counts as ending now. ``None`` when the known ends never free enough. The
estimate ignores placement (fragmentation, topology) and new arrivals with higher priority;
it is a hint for people, not a promise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from policies.errors import InvalidRequest


def estimate_wait(
    position_amounts: Sequence[int],
    running_ends: Sequence[tuple[float, int]],
    free_now: int,
    need: int,
    now: float,
) -> float | None:
    """Seconds from ``now`` until ``need`` (after everything ahead of it) likely fits."""
    if need < 0 or free_now < 0 or any(a < 0 for a in position_amounts):
        raise InvalidRequest(
            "amounts", f"need={need} free_now={free_now} ahead={list(position_amounts)}", ">= 0"
        )
    required = sum(position_amounts) + need
    available = free_now
    if available >= required:
        return 0.0
    ends = sorted((end, amount) for end, amount in running_ends if math.isfinite(end))
    for end_at, amount in ends:
        if amount < 0:
            raise InvalidRequest("running amount", amount, ">= 0")
        available += amount
        if available >= required:
            return max(0.0, end_at - now)
    return None
