"""Rules of elastic training jobs that need no I/O: the members bound, the per-tenant
settings, and when a job grows or shrinks.

An elastic job runs between ``min`` and ``max`` members: ``min`` as its gang, each member
beyond as an extra one-member slice. It grows by one member when the GPU utilization of its
members stayed above the threshold for the whole window and capacity is free; it gives back
its newest slice once that slice's GPUs have been idle for the idle time. Time and samples are
arguments: the caller reads the clock and the telemetry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from policies.errors import Forbidden, InvalidRequest
from policies.requests import MAX_GANG_SIZE, MAX_PRIORITY

DEFAULT_THRESHOLD = 0.8
DEFAULT_WINDOW_S = 300.0
DEFAULT_IDLE_S = 1800.0
MAX_SECONDS = 7 * 86_400.0


@dataclass(frozen=True, slots=True)
class MemberBounds:
    """How many members an elastic job runs: from ``min`` (its gang) to ``max``."""

    min: int
    max: int

    def __post_init__(self) -> None:
        for name, value in (("members.min", self.min), ("members.max", self.max)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidRequest(name, repr(value), f"a whole number from 1 to {MAX_GANG_SIZE}")
        if not 1 <= self.min <= MAX_GANG_SIZE:
            raise InvalidRequest("members.min", self.min, f"1 to {MAX_GANG_SIZE}")
        if not self.min <= self.max <= MAX_GANG_SIZE:
            raise InvalidRequest(
                "members.max", self.max, f"{self.min} (members.min) to {MAX_GANG_SIZE}"
            )


@dataclass(frozen=True, slots=True)
class ElasticSettings:
    """A tenant's growth policy: grow when utilization stays at or above ``threshold`` (a
    fraction) for ``window_s`` seconds; release a slice idle (below ``idle_below``) for
    ``idle_s`` seconds."""

    threshold: float = DEFAULT_THRESHOLD
    window_s: float = DEFAULT_WINDOW_S
    idle_s: float = DEFAULT_IDLE_S
    idle_below: float = 0.01

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise InvalidRequest("elastic.threshold", self.threshold, "a fraction from 0 to 1")
        for name, value in (("elastic.window_s", self.window_s), ("elastic.idle_s", self.idle_s)):
            if not 0.0 <= value <= MAX_SECONDS:
                raise InvalidRequest(name, value, f"seconds from 0 to {MAX_SECONDS:g}")
        if not 0.0 <= self.idle_below <= self.threshold:
            raise InvalidRequest(
                "elastic.idle_below", self.idle_below, f"a fraction from 0 to {self.threshold:g}"
            )


@dataclass(frozen=True, slots=True)
class ElasticLimits:
    """What a platform admin lets a tenant's own admins set: growth no more eager than
    ``min_threshold`` over at least ``min_window_s``, idle slices kept at most ``max_idle_s``
    (eager growth and idle slices both take capacity others could use)."""

    min_threshold: float = 0.0
    min_window_s: float = 0.0
    max_idle_s: float = MAX_SECONDS

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_threshold <= 1.0:
            raise InvalidRequest(
                "limits.min_threshold", self.min_threshold, "a fraction from 0 to 1"
            )
        for name, value in (
            ("limits.min_window_s", self.min_window_s),
            ("limits.max_idle_s", self.max_idle_s),
        ):
            if not 0.0 <= value <= MAX_SECONDS:
                raise InvalidRequest(name, value, f"seconds from 0 to {MAX_SECONDS:g}")

    def admit(self, tenant: str, settings: ElasticSettings) -> None:
        """Raise ``Forbidden`` when ``settings`` leave these limits (a tenant admin's edit)."""
        if settings.threshold < self.min_threshold:
            raise Forbidden(
                f"elastic.threshold {settings.threshold:g} is below {self.min_threshold:g}, "
                f"the lowest the platform admin allows for {tenant}"
            )
        if settings.window_s < self.min_window_s:
            raise Forbidden(
                f"elastic.window_s {settings.window_s:g} is below {self.min_window_s:g}, "
                f"the shortest the platform admin allows for {tenant}"
            )
        if settings.idle_s > self.max_idle_s:
            raise Forbidden(
                f"elastic.idle_s {settings.idle_s:g} is above {self.max_idle_s:g}, "
                f"the longest the platform admin allows for {tenant}"
            )


@dataclass(frozen=True, slots=True)
class Sample:
    """A GPU utilization sample (fraction 0..1) at ``at`` (seconds, any epoch)."""

    at: float
    utilization: float


class Resize(StrEnum):
    GROW = "grow"
    SHRINK = "shrink"
    NONE = "none"


def _covers(samples: Sequence[Sample], now: float, span_s: float) -> bool:
    """The samples reach back at least ``span_s`` seconds before ``now``."""
    return bool(samples) and min(s.at for s in samples) <= now - span_s


def decide(
    *,
    members: int,
    bounds: MemberBounds,
    settings: ElasticSettings,
    job_samples: Sequence[Sample],
    newest_slice_samples: Sequence[Sample],
    capacity_free: bool,
    now: float,
) -> Resize:
    """Whether the job should add a member, give back its newest slice, or stay.

    ``job_samples``: the utilization of all its members' GPUs; ``newest_slice_samples``: that
    of the newest slice's GPUs (empty without a slice). Samples older than the span that
    matters are ignored; too short a history decides nothing (no evidence either way).
    """
    if members > bounds.min:
        idle = [s for s in newest_slice_samples if s.at >= now - settings.idle_s]
        if _covers(newest_slice_samples, now, settings.idle_s) and all(
            s.utilization < settings.idle_below for s in idle
        ):
            return Resize.SHRINK
    if members < bounds.max and capacity_free:
        recent = [s for s in job_samples if s.at >= now - settings.window_s]
        if (
            recent
            and _covers(job_samples, now, settings.window_s)
            and all(s.utilization >= settings.threshold for s in recent)
        ):
            return Resize.GROW
    return Resize.NONE


def slice_priority(job_priority: int) -> int:
    """A slice runs one step below its job, so a reclaim takes slices before the gang."""
    return max(-MAX_PRIORITY, job_priority - 1)
