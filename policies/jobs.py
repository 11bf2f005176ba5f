"""Rules of training jobs that need no I/O: restart policy and backoff, what an attempt's end
means for the job, exit reasons in words, and how ranks are laid out over the gang's nodes.

The job controller (``portal.jobs.controller``) applies them; they take every fact as an
argument (exit codes, restarts used, the members' nodes) and return values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from policies.errors import InvalidRequest

MAX_RESTARTS = 1000
MAX_BACKOFF_S = 86_400.0
MAX_EXIT_CODES = 64


class TopologyMode(StrEnum):
    """How the job's topology level binds.

    - ``required``: the gang waits (reason ``topology``) until it fits at that level;
    - ``preferred``: when it does not fit at that level it is placed with ``any`` instead,
      and the job records that it relaxed.
    """

    REQUIRED = "required"
    PREFERRED = "preferred"


class JobState(StrEnum):
    """Life of a job. Terminal: succeeded, failed, cancelled."""

    QUEUED = "queued"  # the current attempt's workload waits in the allocator's queue
    RUNNING = "running"  # every member launched
    BACKOFF = "backoff"  # an attempt ended; the next one is requested at ``next_start_at``
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class JobReason(StrEnum):
    """Why a job ended the way it did (``JobState`` says how)."""

    COMPLETED = "completed"
    BACKOFF_LIMIT = "backoff_limit"
    EXIT_CODE = "exit_code"  # an exit code listed in ``fail_on_exit_codes``
    CANCELLED = "cancelled"
    LAUNCH_FAILED = "launch_failed"


NODE_LOST = "node lost"
BACKOFF_LIMIT = "backoff limit"
CANCELLED = "cancelled"
COMPLETED = "completed"


def preempted_by(tenant: str) -> str:
    """The exit reason of an attempt stopped for another tenant's reclaim."""
    return f"preempted by {tenant} reclaim"


def exit_code_of(exit_code: int | None, signal: int | None) -> int:
    """A member's exit as one code, as shells report it: a death by signal N is 128 + N."""
    if exit_code is not None:
        return exit_code
    return 128 + (signal or 0)


def exit_reason(code: int) -> str:
    return f"exit code {code}"


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How often and how soon a job restarts after a failed attempt.

    ``max_restarts``: failed attempts that may be retried (0: the first failure ends the job);
    attempts stopped by a preemption never count. The n-th restart waits
    ``min(backoff_cap_s, backoff_s * 2**(n-1))`` seconds. An exit code in
    ``fail_on_exit_codes`` ends the job at once (a bug or bad input no retry will fix).
    """

    max_restarts: int = 3
    backoff_s: float = 10.0
    backoff_cap_s: float = 300.0
    fail_on_exit_codes: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if isinstance(self.max_restarts, bool) or not 0 <= self.max_restarts <= MAX_RESTARTS:
            raise InvalidRequest("restart.max_restarts", self.max_restarts, f"0 to {MAX_RESTARTS}")
        if not 0 <= self.backoff_s <= MAX_BACKOFF_S:
            raise InvalidRequest(
                "restart.backoff_s", self.backoff_s, f"seconds from 0 to {MAX_BACKOFF_S:g}"
            )
        if not self.backoff_s <= self.backoff_cap_s <= MAX_BACKOFF_S:
            raise InvalidRequest(
                "restart.backoff_cap_s",
                self.backoff_cap_s,
                f"seconds from backoff_s ({self.backoff_s:g}) to {MAX_BACKOFF_S:g}",
            )
        if len(self.fail_on_exit_codes) > MAX_EXIT_CODES:
            raise InvalidRequest(
                "restart.fail_on_exit_codes",
                f"{len(self.fail_on_exit_codes)} codes",
                f"at most {MAX_EXIT_CODES}",
            )
        for code in self.fail_on_exit_codes:
            if not 1 <= code <= 255:
                raise InvalidRequest(
                    "restart.fail_on_exit_codes", code, "exit codes from 1 to 255 (0 succeeds)"
                )

    def delay_s(self, restart: int) -> float:
        """Seconds to wait before restart number ``restart`` (1-based)."""
        if restart < 1 or self.backoff_s == 0:
            return 0.0
        # 2**(n-1) overflows a float long before the cap matters: stop doubling at the cap.
        delay = self.backoff_s
        for _ in range(restart - 1):
            delay *= 2
            if delay >= self.backoff_cap_s:
                break
        return min(delay, self.backoff_cap_s)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What follows an attempt's end: restart after ``delay_s``, or end the job with
    ``reason``. ``counted``: the attempt used up one of ``max_restarts``."""

    restart: bool
    counted: bool
    delay_s: float = 0.0
    reason: JobReason | None = None


def after_failure(policy: RestartPolicy, restarts_used: int, code: int | None) -> Verdict:
    """An attempt failed (a member exited non-zero with ``code``, or its node was lost:
    ``code`` None) after ``restarts_used`` counted restarts."""
    if code is not None and code in policy.fail_on_exit_codes:
        return Verdict(restart=False, counted=True, reason=JobReason.EXIT_CODE)
    if restarts_used >= policy.max_restarts:
        return Verdict(restart=False, counted=True, reason=JobReason.BACKOFF_LIMIT)
    return Verdict(restart=True, counted=True, delay_s=policy.delay_s(restarts_used + 1))


def after_preemption() -> Verdict:
    """A preempted attempt restarts at once (it waits in the queue anyway) and never counts."""
    return Verdict(restart=True, counted=False)


@dataclass(frozen=True, slots=True)
class RankSlot:
    """One rank of the gang: which member (allocation) runs it, where, and its place on that
    node (``local_rank`` of ``local_world_size``, node ``node_rank``)."""

    rank: int
    member: int
    node: str
    node_rank: int
    local_rank: int
    local_world_size: int


def rank_layout(members: Sequence[tuple[int, str]]) -> list[RankSlot]:
    """Ranks laid out contiguously per node: members are ``(member index, node)``; nodes are
    ordered by their lowest member index, and ranks follow member order within a node, so
    the ranks of one node form one interval (what ``torchrun``'s ``NODE_RANK`` assumes).

    Raises:
        InvalidRequest: a member index appears twice.
    """
    seen: set[int] = set()
    by_node: dict[str, list[int]] = {}
    for member, node in sorted(members):
        if member in seen:
            raise InvalidRequest("member", member, "each member index once")
        seen.add(member)
        by_node.setdefault(node, []).append(member)
    out: list[RankSlot] = []
    for node_rank, (node, on_node) in enumerate(by_node.items()):
        for local, member in enumerate(on_node):
            out.append(RankSlot(len(out), member, node, node_rank, local, len(on_node)))
    return out
