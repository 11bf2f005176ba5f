"""How a wait in the queue is told to people: one wording for the spawn page, the dashboards
and the CLI, so they never disagree about the same workload.

The portal gives a queued workload a ``reason``, a ``message`` (the reason as a sentence) and
an ``eta_s``; ``eta_s`` is None when only a release of running work without an expected end can
admit it (``docs/quota.md``, ETA). Such a wait says so ("waits for a release; no estimate"),
never a time nobody estimated.
"""

from __future__ import annotations

import math

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


def eta_words(eta_s: float | None) -> str:
    """The ETA on its own (a table's ETA column): ``12 min``, or ``NO_ESTIMATE``."""
    return NO_ESTIMATE if eta_s is None else duration(eta_s)


def wait_words(eta_s: float | None) -> str:
    """``estimated wait 12 min``, or ``NO_ESTIMATE`` when the portal has no estimate."""
    return NO_ESTIMATE if eta_s is None else f"estimated wait {duration(eta_s)}"


def why_and_when(message: str, eta_s: float | None) -> str:
    """The reason's sentence and the wait, e.g. ``team-a quota for H100-80GB: 4/4 gpus in use,
    1 requested (limit 4); estimated wait 12 min``. A message that already says it waits for a
    release (the portal's idle-tenant case) is not told so twice: only ``no estimate`` follows."""
    if not message:
        return wait_words(eta_s)
    if eta_s is None and message.rstrip(".").endswith(_RELEASE):
        return f"{message.rstrip('.')}; no estimate"
    return f"{message}; {wait_words(eta_s)}"


def queue_line(position: int | None, reason: str, message: str, eta_s: float | None) -> str:
    """A queued workload in one line: ``#3 · quota: <message>; estimated wait 12 min``."""
    where = f"#{position} · " if position is not None else ""
    why = f"{reason}: " if reason else ""
    return f"{where}{why}{why_and_when(message, eta_s)}"
