"""Rules of inference services that need no I/O: replica bounds, the scaling rule, model
references, and how many replicas a service should have.

The service controller (``portal.inference.controller``) applies them; they take every fact as
an argument (the metric's readings with their times, replicas now, the last request's time) and
return values.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from policies.errors import InvalidRequest

MAX_REPLICAS = 256
MAX_WINDOW_S = 86_400.0
MAX_IDLE_S = 30 * 86_400.0
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MODEL_SCHEMES = ("file", "http", "https", "s3", "gs", "hf")


class ServiceState(StrEnum):
    """Life of a service. Terminal: deleted, failed."""

    ACTIVE = "active"  # the controller keeps its replicas between min and max
    FAILED = "failed"  # its replicas kept failing to start (``MAX_START_FAILURES`` in a row)
    DELETED = "deleted"

    @property
    def terminal(self) -> bool:
        return self is not ServiceState.ACTIVE


class ReplicaState(StrEnum):
    """Life of a replica. Terminal: ended."""

    QUEUED = "queued"  # its workload waits in the allocator's queue (quota, capacity)
    STARTING = "starting"  # the engine process runs; its health path does not answer 200 yet
    READY = "ready"  # healthy: the gateway sends it requests
    ASLEEP = "asleep"  # a warm replica, loaded and put to sleep: woken instead of a cold start
    STOPPING = "stopping"  # told to stop; its devices are released once it has ended
    ENDED = "ended"

    @property
    def terminal(self) -> bool:
        return self is ReplicaState.ENDED


class ScalingMetric(StrEnum):
    """What the autoscaler compares with the target, per replica."""

    WAITING_REQUESTS = "waiting_requests"  # requests queued in the engines and the gateway
    TIME_TO_FIRST_TOKEN = "time_to_first_token"  # seconds, the gateway's recent p90
    GPU_UTILIZATION = "gpu_utilization"  # percent, from telemetry
    CONCURRENCY = "concurrency"  # requests in flight


class WarmPolicy(StrEnum):
    """How the warm pool is sized: ``replicas.warm`` as such, or as the budget of a pre-warm
    planner sizing it from the service's forecast arrivals (``policies.prewarm``)."""

    FIXED = "fixed"
    FORECAST = "forecast"


MAX_START_FAILURES = 5
"""Replicas in a row that ended before they were ever ready: then the service is ``failed``
(a wrong command or model would otherwise take and free devices forever)."""


@dataclass(frozen=True, slots=True)
class Replicas:
    """How many replicas serve: never fewer than ``min`` (0 allows scale-to-zero), never more
    than ``max``; besides them, ``warm`` kept started and asleep, woken before a cold start
    (not counted in ``max``: the tenant's limit bounds them all)."""

    min: int = 1
    max: int = 1
    warm: int = 0

    def __post_init__(self) -> None:
        for name in ("min", "max", "warm"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_REPLICAS:
                raise InvalidRequest(f"replicas.{name}", v, f"an integer from 0 to {MAX_REPLICAS}")
        if self.max < 1:
            raise InvalidRequest("replicas.max", self.max, f"1 to {MAX_REPLICAS}")
        if self.max < self.min:
            raise InvalidRequest("replicas.max", self.max, f"at least min ({self.min})")
        if self.warm > self.max:
            raise InvalidRequest("replicas.warm", self.warm, f"at most max ({self.max})")


@dataclass(frozen=True, slots=True)
class ScalingRule:
    """Scale so that ``metric`` per replica stays near ``target``: up when it has been above
    for ``up_window_s``, down when below for ``down_window_s``; to zero (when ``min`` is 0)
    after ``idle_s`` without a request. ``warm_policy`` sizes the warm pool."""

    metric: ScalingMetric = ScalingMetric.WAITING_REQUESTS
    target: float = 4.0
    up_window_s: float = 5.0
    down_window_s: float = 300.0
    idle_s: float = 600.0
    warm_policy: WarmPolicy = WarmPolicy.FIXED

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1e6:
            raise InvalidRequest("scaling.target", self.target, "a number above 0, up to 1e6")
        for name in ("up_window_s", "down_window_s"):
            v = getattr(self, name)
            if not 0 <= v <= MAX_WINDOW_S:
                raise InvalidRequest(f"scaling.{name}", v, f"seconds from 0 to {MAX_WINDOW_S:g}")
        if not 0 < self.idle_s <= MAX_IDLE_S:
            raise InvalidRequest(
                "scaling.idle_s", self.idle_s, f"seconds above 0 to {MAX_IDLE_S:g}"
            )


@dataclass(frozen=True, slots=True)
class ModelRef:
    """Where the weights come from and what they must hash to."""

    uri: str
    digest: str

    def __post_init__(self) -> None:
        check_model_uri(self.uri)
        if not DIGEST.fullmatch(self.digest):
            raise InvalidRequest("model.digest", self.digest, "sha256: and 64 lowercase hex digits")

    @property
    def local_path(self) -> str | None:
        """The folder of a ``file://`` URI, else None."""
        parts = urlsplit(self.uri)
        return parts.path if parts.scheme == "file" else None


def check_model_uri(uri: str) -> None:
    """A model URI names a scheme the portal knows and a place: ``file:///abs/path`` (no
    host), or ``https://host/...``, ``s3://bucket/key``, ``gs://bucket/key``, ``hf://org/name``."""
    valid = "a URI: file:///folder, https://host/path, s3://bucket/key, gs://bucket/key or hf://org/name"
    if not isinstance(uri, str) or len(uri) > 4096 or any(c.isspace() for c in uri):
        raise InvalidRequest("model.uri", repr(uri), valid)
    try:
        parts = urlsplit(uri)
    except ValueError:
        raise InvalidRequest("model.uri", repr(uri), valid) from None
    if parts.scheme not in MODEL_SCHEMES:
        raise InvalidRequest("model.uri", repr(uri), valid)
    if parts.scheme == "file":
        if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
            raise InvalidRequest("model.uri", repr(uri), "file:///an/absolute/folder")
    elif not parts.netloc or (parts.scheme != "hf" and not parts.path.strip("/")):
        raise InvalidRequest("model.uri", repr(uri), valid)


@dataclass(frozen=True, slots=True)
class Reading:
    """One evaluation's value of the metric (per replica), at ``at`` seconds."""

    at: float
    value: float


def desired_replicas(
    rule: ScalingRule,
    bounds: Replicas,
    current: int,
    readings: Sequence[Reading],
    now: float,
    idle_for_s: float | None,
) -> int:
    """How many replicas the service should have now.

    - Up: every reading of the last ``up_window_s`` is above the target → enough replicas
      for the newest reading's total load at the target (``ceil(value * current / target)``);
    - down: every reading of the last ``down_window_s`` is below it → as many as the highest
      of them needs (so a square wave shorter than the window never scales down);
    - zero: ``min`` is 0 and no request came for ``idle_s`` (``idle_for_s``: seconds since
      the last request, None for never) → 0; a service at zero with a new request → 1.
    The answer stays within ``min`` and ``max``; ``readings`` are oldest first.
    """
    if current == 0:
        recent = idle_for_s is not None and idle_for_s < rule.idle_s
        return max(bounds.min, 1 if recent else 0)
    if bounds.min == 0 and (idle_for_s is None or idle_for_s >= rule.idle_s):
        return 0
    want = current
    up = _window(readings, now, rule.up_window_s)
    if up and all(r.value > rule.target for r in up):
        want = max(current, -(-int(up[-1].value * current * 1000) // int(rule.target * 1000)))
    else:
        down = _window(readings, now, rule.down_window_s)
        if down and all(r.value < rule.target for r in down):
            need = max(r.value for r in down) * current / rule.target
            want = min(current, max(1, -(-int(need * 1000) // 1000)))
    return max(bounds.min, min(bounds.max, want))


def _window(readings: Sequence[Reading], now: float, window_s: float) -> list[Reading]:
    """The readings of the last ``window_s`` seconds, or none when they do not yet cover the
    whole window (a decision needs the window's worth of evidence)."""
    inside = [r for r in readings if r.at >= now - window_s]
    older = [r for r in readings if r.at < now - window_s]
    if not inside or (window_s > 0 and not older and inside[0].at > now - window_s):
        return []
    return inside
