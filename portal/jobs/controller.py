"""The job controller: runs each training job as a series of attempts, one allocator
workload of kind ``job`` per attempt.

Because an attempt is an ordinary workload (``gang_size`` = members), quota, queue position,
reason and ETA, fairness, cost and alerts apply to jobs unchanged, and the allocator places
the gang all-or-nothing: a job that does not fit holds no device and no quota.

The life of an attempt, advanced by ``step`` (the service's ``jobs`` loop):

1. **request**: a workload with the job's devices; the job is ``queued`` while it waits (a
   ``preferred`` topology that waits for ``topology`` is re-requested at ``any``, once per
   attempt, and the job records that it relaxed);
2. **launch**: once placed, the members are launched, ranks contiguous per node, with the
   rendezvous environment and ``GPUPORTAL_RESUME_FROM`` (the newest complete checkpoint);
3. **end**: all members exit 0 → ``succeeded``. A member exits non-zero, or the node of a
   member is lost → the whole gang is stopped and released, and the job waits out its backoff
   (``backoff``) and requests the next attempt; after ``max_restarts`` such failures, or on an
   exit code in ``fail_on_exit_codes``, it ends ``failed`` and is never recreated. The
   allocator preempting the workload (another tenant reclaims its guarantee) → the members get
   SIGTERM and the grace period the allocator gave, the devices are released, and the next
   attempt is requested at once; a preemption never counts against ``max_restarts``.

Every change is committed through the store (``ChangeSet.jobs``/``attempts``) before memory
changes; the controller is the only writer of jobs, under its own lock. It calls the
allocator, never the other way round (the one observer it subscribes only records notes).
How an attempt ends (stop, drain, restart or end) is in ``portal.jobs.ending``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

from policies.errors import Conflict, InvalidRequest, NotFound, PortalError, Unavailable
from policies.jobs import (
    CANCELLED,
    NODE_LOST,
    JobReason,
    JobState,
    TopologyMode,
    Verdict,
    after_failure,
    exit_reason,
)
from policies.requests import DeviceRequest, WorkloadKind, WorkloadRequest
from portal.allocator import Allocator, WorkloadStatus
from portal.allocator.draft import Decision
from portal.allocator.state import State
from portal.jobs import launch
from portal.jobs.backend import Backend, LogChunk, LogReader, read_file_log
from portal.jobs.checkpoints import newest_complete_checkpoint
from portal.jobs.elastic import ElasticJobs
from portal.jobs.ending import STOP_MARGIN_S, AttemptEnding, Drain
from portal.jobs.runner import MemberLaunch, RunnerError
from portal.jobs.spec import Backend as BackendKind
from portal.jobs.spec import ClusterFacts, JobSpec, api_field, fits_cluster
from portal.store import jobs as stored
from portal.store.records import AttemptRecord, ChangeSet, EventRecord, JobRecord, WorkloadState

log = logging.getLogger(__name__)

LOST_AT_RESTART = "members gone while the portal restarted"
DEFAULT_STOP_GRACE_S = 10.0


def _preempting(st: WorkloadStatus) -> bool:
    """The allocator told the workload to stop for a reclaim (or already ended it so)."""
    return st.state is WorkloadState.PREEMPTING or (
        st.state is WorkloadState.RELEASED and st.reason == "preempted"
    )


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as its owner sees it: the record, and its current attempt's workload (queue
    reason, position and ETA while it waits; allocations while it runs)."""

    job: JobRecord
    workload: WorkloadStatus | None


ATTEMPT_KEY_PREFIX = "gpuportal-job:"
"""Idempotency keys of the workloads the controller requests for attempts: one per attempt,
so a controller that died before recording an attempt finds its workload again at start."""


def attempt_key(job_id: str, attempt: int, *, relaxed: bool = False) -> str:
    return f"{ATTEMPT_KEY_PREFIX}{job_id}/{attempt}{'/any' if relaxed else ''}"


class JobController(AttemptEnding):
    """Jobs over one allocator. Thread-safe. Without a ``backend`` it takes, lists and
    cancels jobs but runs nothing (``step`` is then a no-op): the API on its own, checking
    jobs for what a backend of ``kind`` needs."""

    def __init__(
        self,
        alloc: Allocator,
        *,
        backend: Backend | None = None,
        kind: BackendKind = BackendKind.LOCAL,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        clock: Callable[[], datetime] | None = None,
        refuse: str | None = None,
    ) -> None:
        self._alloc = alloc
        self.backend = backend
        # What jobs must carry to run (a command, or an image): the backend's, when given.
        self.kind = backend.kind if backend is not None else kind
        self._stop_grace_s = stop_grace_s
        # Why this controller takes no new jobs (no backend could run them), or None.
        self._refuse = refuse
        self._clock = clock
        self._lock = threading.RLock()
        # What each of these holds: see ``AttemptEnding``.
        self._exits = {}
        self._lost = set()
        self._draining = {}
        self._claimants = {}
        self._started = False
        self._last_created: datetime | None = None
        # Launches a pass collects (``_launching``), carried out together at its end.
        self._pending: list[tuple[JobRecord, JobSpec, WorkloadStatus]] | None = None
        # The new jobs of an ``enqueue_many``, committed together at its end.
        self._submitted: ChangeSet | None = None
        self.elastic = ElasticJobs(self, alloc)

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Listen for preemptions and re-adopt what still runs after a portal restart:
        running attempts whose members ended meanwhile end as they did; those the backend
        no longer has at all end (not counted) and are requeued."""
        with self._lock:
            if self._started:
                return
            self._started = True
            self._alloc.subscribe(self._observe)
            if self.backend is None:
                return
            adopted = set(self.backend.runner.adopt())
            active = stored.active_jobs(self._alloc.store)
            # Members that ended while the portal was down left their exits: those attempts
            # ended as their members did (the next round advances them), not lost.
            self._collect(active)
            for job in active:
                if job.state is not JobState.RUNNING or (job.id, job.attempt) in adopted:
                    continue
                ended = self._exits.get((job.id, job.attempt), {})
                if len(ended) >= self.elastic.world(job) or any(ended.values()):
                    continue
                self._end(job, Verdict(restart=True, counted=False), LOST_AT_RESTART, None)
            self._release_leftovers(adopted)
            running = stored.active_jobs(self._alloc.store)
            self.elastic.release_orphans({j.id for j in running if j.state is not JobState.BACKOFF})

    def _release_leftovers(self, adopted: set[tuple[str, int]]) -> None:
        """Workloads of ended attempts that were still stopping when the portal went down:
        drained again if their members still run, else released."""
        store = self._alloc.store
        current = {j.workload_id for j in stored.active_jobs(store) if j.workload_id}
        for w in self._alloc.workloads():
            if w.kind != WorkloadKind.JOB.value or w.id in current or w.id in self._draining:
                continue
            attempt = stored.attempt_of_workload(store, w.id)
            if attempt is None:
                if self._requested_by_a_job(w.id):
                    # Requested for an attempt the portal died before recording: nobody
                    # will ever run or release it.
                    self._alloc.release(w.id, reason="job not recorded")
                continue  # else a workload of kind job requested directly, not by a job
            job = stored.job(store, attempt.job_id)
            if (attempt.job_id, attempt.number) in adopted and job is not None:
                members = int(job.spec["members"])  # type: ignore[call-overload]
                until = self.now + timedelta(seconds=self._stop_grace_s + STOP_MARGIN_S)
                self._draining[w.id] = Drain(attempt.job_id, attempt.number, members, until)
            else:
                self._alloc.release(w.id, reason="job attempt ended")

    def _requested_by_a_job(self, workload_id: str) -> bool:
        def key(st: State) -> str | None:
            lv = st.live.get(workload_id)
            return lv.rec.idempotency_key if lv is not None else None

        found = self._alloc.read(key)
        return found is not None and found.startswith(ATTEMPT_KEY_PREFIX)

    def _observe(self, decision: Decision) -> None:
        # Under the allocator's lock: only remember, never call back.
        for e in decision.events:
            if e.kind == "workload.preempting" and e.workload_id is not None:
                claimant = e.data.get("claimant")
                if isinstance(claimant, str):
                    self._claimants[e.workload_id] = claimant

    # ---------------------------------------------------------------- the API's side

    def submit(self, spec: JobSpec, *, job_id: str | None = None) -> JobView:
        """Take a job and request its first attempt. Bad input raises before anything is
        created (the allocator's own checks included). ``job_id``: the id to give it (a Job
        admitted from Kubernetes keeps one derived from its uid); a new one by default."""
        return self.view(self.enqueue(spec, job_id=job_id).id)

    def enqueue(self, spec: JobSpec, *, job_id: str | None = None) -> JobRecord:
        """``submit``, answering with the job's record alone: a view's place in the queue and
        ETA cost a walk over the queue, which a caller admitting many jobs does not read."""
        (result,) = self.enqueue_many([(spec, job_id)])
        if isinstance(result, PortalError):
            raise result
        return result

    def enqueue_many(
        self, jobs: Sequence[tuple[JobSpec, str | None]]
    ) -> list[JobRecord | PortalError]:
        """``enqueue`` each (spec, job id), answering each with its record or the error that
        refused it (one refusal leaves the others admitted; ``Conflict``: a job of that id
        exists already). The jobs placed at once are launched together, as many at a time as
        the runner allows (``_launching``)."""
        results: list[JobRecord | PortalError] = []
        with self._lock, self._launching():
            self._submitted = batch = ChangeSet()
            try:
                for spec, job_id in jobs:
                    try:
                        results.append(self._enqueue(spec, job_id))
                    except PortalError as exc:
                        results.append(exc)
                if batch.jobs:
                    self._alloc.store.commit(batch)  # one commit for the pass, not one a job
            except BaseException:
                for j in batch.jobs:  # not recorded: nothing may hold their devices
                    self._alloc.release(j.workload_id or "", reason="job not recorded")
                if self._pending is not None:
                    self._pending.clear()
                raise
            finally:
                self._submitted = None
        return results

    def _enqueue(self, spec: JobSpec, job_id: str | None) -> JobRecord:
        spec.check_backend(self.kind)
        if self._refuse is not None:
            raise Unavailable(self._refuse)
        fits_cluster(spec, self._alloc.read(ClusterFacts.of))
        # Under the lock: two callers admitting the same job (by its id) create it once.
        batched = self._submitted.jobs if self._submitted is not None else []
        if job_id is not None and (
            stored.job(self._alloc.store, job_id) is not None
            or any(j.id == job_id for j in batched)
        ):
            raise Conflict(f"job {job_id!r} exists already: a job id is taken once")
        now = self.now
        # Lists show jobs in submission order: keep creation times strictly increasing
        # when the clock repeats itself.
        if self._last_created is not None and now <= self._last_created:
            now = self._last_created + timedelta(microseconds=1)
        self._last_created = now
        job = JobRecord(
            id=job_id or uuid.uuid4().hex,
            tenant=spec.tenant,
            owner=spec.owner,
            name=spec.name,
            spec=spec.to_dict(),
            state=JobState.QUEUED,
            created_at=now,
            updated_at=now,
            version=0,  # not stored yet: its first write is version 1
        )
        try:
            return self._request(job, spec, first=True)
        except InvalidRequest as exc:
            raise api_field(exc) from None

    def get(self, job_id: str) -> JobRecord:
        job = stored.job(self._alloc.store, job_id)
        if job is None:
            raise NotFound("job", job_id)
        return job

    def view(self, job_id: str) -> JobView:
        job = self.get(job_id)
        return JobView(job, self._workload(job))

    def jobs(self, tenants: Collection[str] | None = None) -> list[JobView]:
        return [
            JobView(j, self._workload(j)) for j in stored.jobs(self._alloc.store, tenants=tenants)
        ]

    def active_jobs(self) -> list[JobRecord]:
        """Jobs that have not ended, in submission order."""
        return stored.active_jobs(self._alloc.store)

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        self.get(job_id)
        return stored.attempts(self._alloc.store, job_id)

    def gpu_hours(self, job_id: str) -> float:
        """GPU-equivalent hours the job's attempts and slices have held so far."""
        return stored.gpu_hours(self._alloc.store, self.get(job_id), self.now)

    def log_path(self, job_id: str, attempt: int, rank: int) -> Path | None:
        """Where the member's log is, or None without a backend."""
        if self.backend is None:
            return None
        return self.backend.runner.log_path(job_id, attempt, rank)

    def read_log(self, job_id: str, attempt: int, rank: int, offset: int, limit: int) -> LogChunk:
        """Up to ``limit`` bytes of the member's log from ``offset``: from the runner when
        its logs are not files here (``LogReader``), else from ``log_path``."""
        runner: object = self.backend.runner if self.backend is not None else None
        if isinstance(runner, LogReader):
            return runner.read_log(job_id, attempt, rank, offset, limit)
        path = self.log_path(job_id, attempt, rank)
        if path is None:
            return LogChunk(b"", 0, "no backend runs jobs here")
        return read_file_log(path, offset, limit)

    def cancel(self, job_id: str) -> JobView:
        """Stop the job's members (SIGTERM, then SIGKILL after the stop grace), release or
        dequeue its workload, and end it ``cancelled``. Idempotent."""
        with self._lock:
            job = self.get(job_id)
            if not job.state.terminal:
                self._end(job, None, CANCELLED, None)
                if self.backend is not None:
                    self._collect(stored.active_jobs(self._alloc.store))
            return self.view(job_id)

    # ---------------------------------------------------------------- the loop's side

    def step(self) -> None:
        """One round: collect member exits, then advance every active job."""
        if self.backend is None:
            return
        with self._lock:
            if not self._started:
                self.start()
            active = stored.active_jobs(self._alloc.store)
            self._collect(active)
            with self._launching():
                for job in active:
                    try:
                        self._advance(job)
                    except PortalError as exc:
                        # One job's trouble (a refused request on restart) must not stop others.
                        log.warning("job %s: %s", job.id, exc.message)
            # Members stopped in this round may have ended already: free their devices now.
            self._collect(stored.active_jobs(self._alloc.store))

    def _advance(self, job: JobRecord) -> None:
        spec = self._spec(job)
        if job.state is JobState.BACKOFF:
            if job.next_start_at is None or job.next_start_at <= self.now:
                try:
                    self._request(job, spec, first=False)
                except PortalError as exc:
                    self._finish(job, JobState.FAILED, JobReason.LAUNCH_FAILED, exc.message)
            return
        assert job.workload_id is not None
        # No ETA: each would walk the queue, and a round reads every queued job's workload.
        st = self._alloc.status(job.workload_id, estimate=False)
        if job.state is JobState.QUEUED:
            if st.state is WorkloadState.RUNNING:
                self._launch(job, spec, st)
            elif st.state is WorkloadState.QUEUED:
                self._maybe_relax(job, spec, st)
            elif _preempting(st):
                self._preempted(job, st)  # placed and preempted before its launch
            elif st.state.terminal:
                self._workload_ended(job, st)
            return
        # RUNNING: the allocator's verdicts first (our own stop makes members exit non-zero).
        if _preempting(st):
            self._preempted(job, st)
            return
        if st.state.terminal:
            self._workload_ended(job, st)
            return
        if (job.id, job.attempt) in self._lost:
            # The runner saw a member's node go (or stay not ready) before the inventory did.
            self._lost.discard((job.id, job.attempt))
            assert self.backend is not None  # only a backend reports exits
            try:
                # Its members count as ended, but their pods may linger on the lost node.
                self.backend.runner.stop(job.id, job.attempt, 0, wait=False)
            except RunnerError as exc:
                log.warning("job %s attempt %d: %s", job.id, job.attempt, exc)
            verdict = after_failure(spec.restart, job.restarts, None)
            self._end(job, verdict, NODE_LOST, None, grace_s=0)
            return
        codes = self._exits.get((job.id, job.attempt), {})
        # The first member to fail is the cause: the runner reports exits in the order the
        # members ended, and ``codes`` keeps that order (the others often fail because of it).
        failed = [(r, c) for r, c in codes.items() if c != 0]
        if failed:
            rank, code = failed[0]
            verdict = after_failure(spec.restart, job.restarts, code)
            self._end(job, verdict, exit_reason(code), code, note=f"rank {rank} exited {code}")
        elif len(codes) >= self.elastic.world(job):
            self._finish(job, JobState.SUCCEEDED, JobReason.COMPLETED, "every member exited 0")
        elif not codes:
            self.elastic.advance(job, spec, st)

    # ---------------------------------------------------------------- steps of an attempt

    def _request(self, job: JobRecord, spec: JobSpec, *, first: bool) -> JobRecord:
        """Request the next attempt's workload and record the attempt."""
        number = job.attempt + 1
        resume = self._resume_point(spec)
        status = self._alloc.request(
            self._workload_request(job, spec, spec.devices),
            idempotency_key=attempt_key(job.id, number),
            expected_duration_s=spec.expected_duration_s,
            estimate=False,  # its place in the queue would cost a walk over the queue
        )
        now = self.now
        attempt = AttemptRecord(
            job_id=job.id,
            number=number,
            workload_id=status.id,
            queued_at=now,
            topology=spec.devices.topology.value,
            resume_from=None if resume is None else str(resume[0]),
            resume_step=None if resume is None else resume[1],
        )
        new = self._versioned(
            job,
            state=JobState.QUEUED,
            attempt=number,
            workload_id=status.id,
            next_start_at=None,
            topology_relaxed=False,
            message=f"attempt {number} requested",
        )
        kind = "job.submitted" if first else "job.requeued"
        message = f"{job.name}: attempt {number} requested" + (
            f", resuming from step {resume[1]}" if resume else ""
        )
        try:
            if first and self._submitted is not None:  # ``enqueue_many`` commits it
                self._submitted.jobs.append(new)
                self._submitted.attempts.append(attempt)
                self._submitted.events.append(
                    EventRecord(now, kind, new.tenant, new.workload_id, message, {"job": new.id})
                )
            else:
                self._commit([new], [attempt], kind, new, message)
        except BaseException:
            self._alloc.release(status.id, reason="job not recorded")
            raise
        if status.state is WorkloadState.RUNNING and self.backend is not None:
            self._launch(new, spec, status)
        return new

    def _maybe_relax(self, job: JobRecord, spec: JobSpec, st: WorkloadStatus) -> None:
        """A preferred topology that waits for topology is re-requested at ``any``."""
        relaxed = spec.relaxed()
        if (
            spec.topology_mode is not TopologyMode.PREFERRED
            or job.topology_relaxed
            or st.reason != "topology"
            or relaxed == spec.devices
        ):
            return
        # Leave the queue first: the strict request's place (and any node reserved for it)
        # would otherwise hold the relaxed one back.
        self._alloc.release(st.id, reason="topology relaxed")
        status = self._alloc.request(
            self._workload_request(job, spec, relaxed),
            idempotency_key=attempt_key(job.id, job.attempt, relaxed=True),
            expected_duration_s=spec.expected_duration_s,
        )
        attempt = replace(
            self._attempt(job), workload_id=status.id, topology=relaxed.topology.value
        )
        level = spec.devices.topology.value
        new = self._versioned(
            job,
            workload_id=status.id,
            topology_relaxed=True,
            message=f"topology {level} (preferred) does not fit now: placed at any instead",
        )
        self._commit([new], [attempt], "job.topology_relaxed", new, new.message)
        if status.state is WorkloadState.RUNNING:
            self._launch(new, spec, status)

    def _launch(self, job: JobRecord, spec: JobSpec, st: WorkloadStatus) -> None:
        assert self.backend is not None
        if not self.elastic.ready(job):
            return  # a resize: the last attempt's members are still checkpointing
        if self._pending is not None:
            self._pending.append((job, spec, st))
        else:
            self._launch_all([(job, spec, st)])

    @contextmanager
    def _launching(self) -> Iterator[None]:
        """Collect the launches of a pass and carry them out together when it ends (under
        the lock: nothing else sees the jobs in between)."""
        if self._pending is not None:  # nested: the outer pass launches
            yield
            return
        self._pending = []
        try:
            yield
        finally:
            pending, self._pending = self._pending, None
            if pending:
                self._launch_all(pending)

    def _launch_all(self, items: Sequence[tuple[JobRecord, JobSpec, WorkloadStatus]]) -> None:
        """Launch each placed job's members, up to the runner's ``launch_concurrency`` at a
        time (a Kubernetes launch waits on apiserver round trips, not on this process), then
        record the attempts that started in one commit."""
        assert self.backend is not None
        runner = self.backend.runner
        plans = []
        for job, spec, st in items:
            attempt = self._attempt(job)
            allocations = self.elastic.allocations(job, st.allocations)
            members = launch.member_launches(
                self.backend, job.id, job.attempt, spec, allocations, attempt.resume_from
            )
            plans.append((job, spec, attempt, allocations, members))

        def run(members: Sequence[MemberLaunch]) -> RunnerError | None:
            try:
                runner.launch(members)
            except RunnerError as exc:
                return exc
            return None

        workers = min(len(plans), max(1, int(getattr(runner, "launch_concurrency", 1))))
        if workers > 1:
            with ThreadPoolExecutor(workers, thread_name_prefix="jobs-launch") as pool:
                outcomes = list(pool.map(run, [p[4] for p in plans]))
        else:
            outcomes = [run(p[4]) for p in plans]
        now = self.now
        change = ChangeSet()
        for (job, spec, attempt, allocations, members), failed in zip(plans, outcomes, strict=True):
            if failed is not None:
                verdict = after_failure(spec.restart, job.restarts, None)
                self._end(job, verdict, f"launch failed: {failed}", None)
                continue
            started = replace(
                attempt,
                started_at=now,
                nodes=launch.nodes_of(allocations),
                world_size=len(members),
            )
            message = f"attempt {job.attempt} running"
            if job.topology_relaxed:
                message += f"; {job.message}"
            new = self._versioned(job, state=JobState.RUNNING, message=message)
            change.jobs.append(new)
            change.attempts.append(started)
            where = ", ".join(started.nodes)
            text = f"{job.name}: attempt {job.attempt} running on {where}"
            change.events.append(
                EventRecord(now, "job.running", new.tenant, new.workload_id, text, {"job": new.id})
            )
        if change.jobs:
            self._alloc.store.commit(change)

    # ---------------------------------------------------------------- helpers

    def _resume_point(self, spec: JobSpec) -> tuple[Path, int] | None:
        if spec.checkpoint_dir is None or self.backend is None:
            return None
        return newest_complete_checkpoint(Path(spec.checkpoint_dir))

    def _workload_request(
        self, job: JobRecord, spec: JobSpec, devices: DeviceRequest
    ) -> WorkloadRequest:
        return WorkloadRequest(
            tenant=job.tenant,
            owner=job.owner,
            name=job.name,
            devices=devices,
            kind=WorkloadKind.JOB,
            gang_size=spec.members,
            priority=spec.priority,
        )

    def _workload(self, job: JobRecord) -> WorkloadStatus | None:
        if job.workload_id is None:
            return None
        try:
            return self._alloc.status(job.workload_id)
        except NotFound:
            return None
