"""Rules of Ray clusters that need no I/O: the states of a cluster and its slices, and which
slices a change of the worker count releases or requests.

A Ray cluster's workers are held in **slices**: the first (the ``min`` workers) is admitted
with the head as one gang; every increase after it is a slice of its own, an allocator
workload charged and queued on its own, so an increase that quota does not allow waits with a
reason while the running part keeps running. The Ray controller (``portal.ray.controller``)
applies these rules; they take every fact as an argument and return values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from policies.errors import InvalidRequest


class RayState(StrEnum):
    """Life of a Ray cluster. Terminal: stopped."""

    QUEUED = "queued"  # its first slice (head + min workers) waits in the allocator's queue
    STARTING = "starting"  # admitted; the head or some admitted workers have not joined yet
    RUNNING = "running"  # the head is up and every admitted worker has joined
    IDLE = "idle"  # nothing ran for its idle time: workers released, the head kept
    SUSPENDED = "suspended"  # idle with ``idle_suspend``: every node stopped, nothing held
    STOPPED = "stopped"  # taken down: every process stopped, every slice released

    @property
    def terminal(self) -> bool:
        return self is RayState.STOPPED

    @property
    def released(self) -> bool:
        """Given back for idleness: holds no slice until resumed."""
        return self in (RayState.IDLE, RayState.SUSPENDED)


class SliceState(StrEnum):
    """A slice's workload: waiting, holding devices, or given back."""

    QUEUED = "queued"
    RUNNING = "running"
    RELEASED = "released"


@dataclass(frozen=True, slots=True)
class SliceFacts:
    """What the plan needs of a slice: its number (creation order) and its workers."""

    number: int
    workers: int


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """Slices to release (newest first) and workers to request as one new slice (0: none)."""

    release: tuple[int, ...]
    request: int


def check_bounds(field: str, value: int, minimum: int, maximum: int) -> None:
    """``value`` workers within ``minimum..maximum`` (``field`` names it for the error)."""
    if isinstance(value, bool) or not minimum <= value <= maximum:
        raise InvalidRequest(field, value, f"{minimum} to {maximum} workers")


def plan_scale(live: Sequence[SliceFacts], target: int) -> ScalePlan:
    """How to go from the ``live`` (queued or running) slices to ``target`` workers.

    Growing requests the difference as one new slice. Shrinking releases whole slices,
    newest first, while what is left still holds at least ``target``; a shrink that ends
    inside a slice releases that slice too and requests the remainder as a new one (a
    workload cannot give back part of its gang). Slice 1 (the gang with the head) is never
    released by a plan: ``target`` is never below ``min``, which is its size.
    """
    if target < 0:
        raise InvalidRequest("workers", target, "0 or more")
    total = sum(s.workers for s in live)
    if target >= total:
        return ScalePlan((), target - total)
    release: list[int] = []
    left = total
    for s in sorted(live, key=lambda s: s.number, reverse=True):
        if left <= target or s.number == 1:
            break
        release.append(s.number)
        left -= s.workers
    return ScalePlan(tuple(release), max(0, target - left))


def is_idle(idle_ms: Sequence[int], idle_s: float) -> bool:
    """Whether a cluster whose nodes (the head and every worker, as the head's GCS reports
    them) have each been idle ``idle_ms`` milliseconds counts as idle for ``idle_s`` seconds.
    No node reported: not idle (the read says nothing)."""
    return bool(idle_ms) and min(idle_ms) >= idle_s * 1000.0


def workers_for_demand(demand: Sequence[tuple[float, int]], gpus_per_worker: int, most: int) -> int:
    """How many more workers of ``gpus_per_worker`` GPUs (at most ``most``) the unmet GPU
    ``demand`` needs: ``(GPUs of one bundle, how many such bundles)`` as the head's GCS
    reports the tasks, actors and placement groups Ray could not schedule. Bundles are packed
    largest first onto as few workers as hold them (Ray places a bundle on one node); a
    bundle larger than one worker fits none, however many are added, so it asks for none."""
    if gpus_per_worker <= 0 or most <= 0:
        return 0
    free: list[float] = []  # what is left on each worker added so far
    for g, n in sorted(demand, reverse=True):
        if not 0 < g <= gpus_per_worker:
            continue
        for _ in range(max(0, n)):
            for i, left in enumerate(free):
                if g <= left + 1e-9:
                    free[i] = left - g
                    break
            else:
                if len(free) == most:
                    return most
                free.append(gpus_per_worker - g)
    return len(free)
