"""How a job's attempt ends: its members are stopped, its devices drained then released, and
the job restarted or ended as the restart policy says; with the record-keeping the
controller's steps share (every change committed through the store before memory changes).

``AttemptEnding`` is the base of ``portal.jobs.controller.JobController``, which owns the
state declared here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from policies.errors import NotFound
from policies.jobs import (
    BACKOFF_LIMIT,
    COMPLETED,
    NODE_LOST,
    JobReason,
    JobState,
    Verdict,
    after_failure,
    after_preemption,
    exit_code_of,
    preempted_by,
)
from portal.allocator import Allocator, WorkloadStatus
from portal.jobs.backend import Backend
from portal.jobs.elastic import ElasticJobs
from portal.jobs.runner import RunnerError
from portal.jobs.spec import JobSpec
from portal.store import jobs as stored
from portal.store.records import AttemptRecord, ChangeSet, EventRecord, JobRecord

log = logging.getLogger(__name__)

NODE_LOST_REASON = "node-lost"  # the allocator's reason for a workload whose node went away


STOP_MARGIN_S = 15.0
"""After the grace, how long members killed with SIGKILL get to be reported ended before the
devices are released anyway (a runner that lost them must not hold GPUs forever)."""


@dataclass(frozen=True, slots=True)
class Drain:
    """An ended attempt whose members were told to stop: its workload keeps the devices until
    every member has ended or ``until`` passes, so nothing else starts on GPUs a member still
    uses while it checkpoints."""

    job_id: str
    attempt: int
    members: int
    until: datetime


class AttemptEnding:
    """Ending attempts and the shared record-keeping of a ``JobController``."""

    _alloc: Allocator
    backend: Backend | None
    elastic: ElasticJobs
    _stop_grace_s: float
    _clock: Callable[[], datetime] | None
    # (job id, attempt) -> rank -> exit code, of attempts that run.
    _exits: dict[tuple[str, int], dict[int, int]]
    # Attempts a member of which the runner reported on a lost node.
    _lost: set[tuple[str, int]]
    # Workload id -> its ended attempt, still stopping (see ``Drain``).
    _draining: dict[str, Drain]
    # Preempted workload -> the tenant reclaiming (from the allocator's events).
    _claimants: dict[str, str]

    @property
    def now(self) -> datetime:
        return (self._clock or self._alloc.clock)()

    def _collect(self, active: Collection[JobRecord]) -> None:
        """Record the exits of running and stopping attempts, then release the devices of
        stopping attempts whose members all ended (or whose time is up)."""
        assert self.backend is not None
        watched = {(j.id, j.attempt) for j in active if j.state is JobState.RUNNING}
        watched |= {(d.job_id, d.attempt) for d in self._draining.values()}
        watched |= self.elastic.watched()
        for e in self.backend.runner.poll():
            if (e.job_id, e.attempt) in watched:  # others are old news
                code = exit_code_of(e.exit_code, e.signal)
                self._exits.setdefault((e.job_id, e.attempt), {})[e.rank] = code
                if e.node_lost:
                    self._lost.add((e.job_id, e.attempt))
        now = self.now
        for wid, d in list(self._draining.items()):
            ended = self._exits.get((d.job_id, d.attempt), {})
            if len(ended) >= d.members or now >= d.until:
                del self._draining[wid]
                self._exits.pop((d.job_id, d.attempt), None)
                self._lost.discard((d.job_id, d.attempt))
                self._alloc.release(wid, reason="job attempt ended")

    def _preempted(self, job: JobRecord, st: WorkloadStatus) -> None:
        claimant = self._claimant(st)
        grace = self._stop_grace_s
        if st.preempt_deadline is not None:
            grace = max(0.0, (st.preempt_deadline - self.now).total_seconds())
        self._end(job, after_preemption(), preempted_by(claimant), None, grace_s=grace)

    def _workload_ended(self, job: JobRecord, st: WorkloadStatus) -> None:
        """The attempt's workload ended outside the controller: its node was lost, or it
        was released or failed by someone else."""
        spec = self._spec(job)
        if st.reason == NODE_LOST_REASON:
            reason = NODE_LOST
        else:
            reason = f"workload {st.state.value}: {st.reason or st.message}"
        self._end(job, after_failure(spec.restart, job.restarts, None), reason, None, grace_s=0)

    def _end(
        self,
        job: JobRecord,
        verdict: Verdict | None,
        reason: str,
        code: int | None,
        *,
        grace_s: float | None = None,
        note: str = "",
    ) -> None:
        """End the current attempt: stop its members, release its workload, then restart
        or end the job as ``verdict`` says (None: cancelled)."""
        self._stop_members(job, self._stop_grace_s if grace_s is None else grace_s)
        now = self.now
        attempt = self._attempt(job) if job.attempt else None
        if verdict is None:
            state, job_reason, message = JobState.CANCELLED, JobReason.CANCELLED, "cancelled"
        elif verdict.restart:
            state, job_reason = JobState.BACKOFF, None
            message = f"attempt {job.attempt} ended ({reason}); next in {verdict.delay_s:g} s"
        else:
            state, job_reason = JobState.FAILED, verdict.reason
            message = f"attempt {job.attempt} ended ({reason}); not restarted"
            if verdict.reason is JobReason.BACKOFF_LIMIT:
                message = f"{reason}: all {job.restarts} restarts used"
                reason = BACKOFF_LIMIT
        counted = bool(verdict and verdict.counted)
        new = self._versioned(
            job,
            state=state,
            reason=job_reason.value if job_reason else job.reason,
            message=f"{message}{f' ({note})' if note else ''}",
            restarts=job.restarts + (1 if counted and state is JobState.BACKOFF else 0),
            preemptions=job.preemptions + (1 if verdict and not verdict.counted else 0),
            next_start_at=(
                now + timedelta(seconds=verdict.delay_s)
                if verdict is not None and verdict.restart
                else None
            ),
            ended_at=None if state is JobState.BACKOFF else now,
        )
        ended = []
        if attempt is not None and not attempt.exit_reason:
            ended = [
                replace(attempt, ended_at=now, exit_reason=reason, exit_code=code, counted=counted)
            ]
        self._commit([new], ended, f"job.{state.value}", new, f"{job.name}: {new.message}")

    def _finish(self, job: JobRecord, state: JobState, reason: JobReason, message: str) -> None:
        """End the job for good (succeeded, or failed without a restart to decide)."""
        self._stop_members(job, self._stop_grace_s)
        now = self.now
        new = self._versioned(
            job,
            state=state,
            reason=reason.value,
            message=message,
            ended_at=now,
            next_start_at=None,
        )
        ended = []
        if job.attempt:
            attempt = self._attempt(job)
            if not attempt.exit_reason:
                done = COMPLETED if state is JobState.SUCCEEDED else reason.value
                code = 0 if state is JobState.SUCCEEDED else None
                ended = [replace(attempt, ended_at=now, exit_reason=done, exit_code=code)]
        self._commit([new], ended, f"job.{state.value}", new, f"{job.name}: {message}")

    def _stop_members(self, job: JobRecord, grace_s: float) -> None:
        """Stop the attempt's members, if it ran (SIGTERM now, SIGKILL after ``grace_s``,
        without waiting), and give its devices back once they have ended (``_Drain``); an
        attempt that never launched gives them back at once."""
        self.elastic.release_slices(job, "job attempt ended")
        wid = job.workload_id
        if job.state is JobState.RUNNING and self.backend is not None and wid is not None:
            ended = len(self._exits.get((job.id, job.attempt), {}))
            members = self.elastic.world(job)
            if ended < members:
                try:
                    self.backend.runner.stop(job.id, job.attempt, grace_s, wait=False)
                except RunnerError as exc:  # e.g. no member left on this host
                    log.warning("job %s attempt %d: %s", job.id, job.attempt, exc)
                else:
                    until = self.now + timedelta(seconds=grace_s + STOP_MARGIN_S)
                    self._draining[wid] = Drain(job.id, job.attempt, members, until)
                    return
        self._exits.pop((job.id, job.attempt), None)
        self._lost.discard((job.id, job.attempt))
        if wid is not None and job.state in (JobState.QUEUED, JobState.RUNNING):
            self._alloc.release(wid, reason=f"job {job.state.value} ended")

    def _claimant(self, st: WorkloadStatus) -> str:
        """The tenant whose reclaim preempted ``st``."""
        claimant = self._claimants.pop(st.id, None)
        if claimant is not None:
            try:
                return self._alloc.status(claimant).tenant
            except NotFound:
                pass
        # The allocator's message starts with the reclaiming tenant ("team-b reclaims ...").
        first = st.message.split(" ", 1)[0]
        return first if st.message.startswith(f"{first} reclaims") else "another tenant"

    def _attempt(self, job: JobRecord) -> AttemptRecord:
        for a in reversed(stored.attempts(self._alloc.store, job.id)):
            if a.number == job.attempt:
                return a
        raise NotFound("attempt", f"{job.id}/{job.attempt}")

    @staticmethod
    def _spec(job: JobRecord) -> JobSpec:
        return JobSpec.from_dict(job.tenant, job.owner, job.name, job.spec)

    def _versioned(self, job: JobRecord, **changes: object) -> JobRecord:
        return replace(job, updated_at=self.now, version=job.version + 1, **changes)  # type: ignore[arg-type]

    def _commit(
        self,
        jobs: list[JobRecord],
        attempts: list[AttemptRecord],
        kind: str,
        job: JobRecord,
        message: str,
    ) -> None:
        event = EventRecord(self.now, kind, job.tenant, job.workload_id, message, {"job": job.id})
        self._alloc.store.commit(ChangeSet(jobs=jobs, attempts=attempts, events=[event]))
