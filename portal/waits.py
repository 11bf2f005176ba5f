"""How a wait in the queue is told to people: one wording for the spawn page, the dashboards
and the CLI, so they never disagree about the same workload.

The portal gives a queued workload a ``reason``, a ``message`` (the reason as a sentence) and
an ``eta_s``; ``eta_s`` is None when only a release of running work without an expected end can
admit it (``docs/quota.md``, ETA). Such a wait says so ("waits for a release; no estimate"),
never a time nobody estimated.
"""

from __future__ import annotations

import math
from typing import Protocol

NO_ESTIMATE = "waits for a release; no estimate"
"""What a wait without an estimate says: the portal gives none when only a release admits the
request and no running work it waits for has an expected end."""

_RELEASE = "waits for a release"


def duration(seconds: float | None) -> str:
    """A wait in words: ``under a minute``, ``12 min``, ``2 h 5 min``; ``unknown`` for None."""
    if seconds is None or math.isinf(seconds):
        return "unknown"
    minutes = math.ceil(seconds / 60)
    if seconds < 60:
        return "under a minute"
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def likely(low: float | None, high: float | None) -> str:
    """The p20-p80 interval of a wait in words (``8 min to 20 min``, ``up to 20 min``); ''
    when it says nothing the point does not (no interval, or both ends read the same)."""
    if low is None or high is None:
        return ""
    lo, hi = duration(low), duration(high)
    if lo == hi or hi == "unknown":
        return ""
    return f"up to {hi}" if low < 60 else f"{lo} to {hi}"


def eta_words(eta_s: float | None, low: float | None = None, high: float | None = None) -> str:
    """The ETA on its own (a table's ETA column): ``12 min``, ``12 min (likely 8 min to 20
    min)`` with an interval, or ``NO_ESTIMATE``."""
    if eta_s is None:
        return NO_ESTIMATE
    span = likely(low, high)
    return f"{duration(eta_s)} (likely {span})" if span else duration(eta_s)


def wait_words(eta_s: float | None, low: float | None = None, high: float | None = None) -> str:
    """``estimated wait 12 min`` (with its interval when given), or ``NO_ESTIMATE`` when the
    portal has no estimate."""
    return NO_ESTIMATE if eta_s is None else f"estimated wait {eta_words(eta_s, low, high)}"


class Wait(Protocol):
    """What a workload's status and a queue entry say about a wait (the API's ``WaitOut``)."""

    @property
    def eta_s(self) -> float | None: ...
    @property
    def eta_low_s(self) -> float | None: ...
    @property
    def eta_high_s(self) -> float | None: ...
    @property
    def eta_reason(self) -> str: ...


def wait_of(w: Wait) -> str:
    """A wait with its interval and why, e.g. ``estimated wait 12 min (likely 8 min to 20
    min): 3 workloads ahead of you; the next H100 frees in about 12 min when a job reaches
    its time limit``. Without an estimate only ``NO_ESTIMATE``: its reason says the same."""
    said = wait_words(w.eta_s, w.eta_low_s, w.eta_high_s)
    return f"{said}: {w.eta_reason}" if w.eta_s is not None and w.eta_reason else said


def why_and_when(message: str, eta_s: float | None, wait: Wait | None = None) -> str:
    """The reason's sentence and the wait, e.g. ``team-a quota for H100-80GB: 4/4 gpus in use,
    1 requested (limit 4); estimated wait 12 min``; with ``wait`` (a status or queue entry)
    the wait's interval and reason too (``wait_of``). A message that already says it waits
    for a release (the portal's idle-tenant case) is not told so twice: only ``no estimate``
    follows."""
    when = wait_of(wait) if wait is not None else wait_words(eta_s)
    if not message:
        return when
    if eta_s is None and message.rstrip(".").endswith(_RELEASE):
        return f"{message.rstrip('.')}; no estimate"
    return f"{message}; {when}"


def queue_line(
    position: int | None, reason: str, message: str, eta_s: float | None, wait: Wait | None = None
) -> str:
    """A queued workload in one line: ``#3 · quota: <message>; estimated wait 12 min``."""
    where = f"#{position} · " if position is not None else ""
    why = f"{reason}: " if reason else ""
    return f"{where}{why}{why_and_when(message, eta_s, wait)}"
