"""Ray jobs: an entrypoint run as the driver of a Ray cluster, on a tenant's cluster or on a
one-off cluster created for the job and deleted when it ends.

A Ray job holds no device of its own: the cluster's slices do, so priority (the cluster's),
queueing, preemption and cost are the cluster's, which are those of any workload. A one-off
job's cost is its cluster's slices (``workload_ids``), priced like a training job's attempts.

The life of a job, advanced by ``step`` (in each round of the service's ``ray`` loop, after
the clusters were brought in line):

1. **queued** until its cluster is ``running`` (head up, every admitted worker joined);
2. **running**: attempt *n* starts the entrypoint (``portal.ray.drivers``) against the head;
3. **end**: exit 0 → ``succeeded``; a non-zero exit → ``failed``, unless the cluster's head
   was started again meanwhile (the cluster was preempted or lost its head): then the attempt
   is recorded with that reason and the next one starts once the cluster runs again, which
   never counts as a failure (as a preempted training attempt). A stop → ``cancelled``. A
   cluster deleted under a job ends it ``failed``.
4. a one-off job that ended deletes its cluster: every slice released, quota free.

Every change is committed through the store (``ChangeSet.ray_jobs``) before memory changes;
this controller is the only writer of Ray jobs, under the Ray controller's lock.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from policies.errors import Conflict, NotFound, PortalError, Unavailable
from policies.jobs import CANCELLED, COMPLETED, JobState, exit_code_of, exit_reason
from policies.ray import RayState
from portal.jobs.backend import LogChunk
from portal.jobs.runner import RunnerError
from portal.ray.controller import RayController
from portal.ray.drivers import DriverRun, Drivers
from portal.ray.jobspec import RayJobSpec
from portal.ray.nodes import STOP_GRACE_S
from portal.ray.spec import RaySpec
from portal.store import ray as stored
from portal.store.records import ChangeSet, EventRecord, RayJobAttempt, RayJobRecord
from portal.store.writer import Store

log = logging.getLogger(__name__)

HEAD_RESTARTED = "the cluster's head started again (preempted or lost); run again once it runs"
CLUSTER_GONE = "its Ray cluster was deleted"


@dataclass(frozen=True, slots=True)
class RayJobView:
    """A job as its owner sees it, with where its cluster stands."""

    job: RayJobRecord
    cluster_state: RayState
    cluster_message: str


class RayJobs:
    """Ray jobs over one Ray controller. Without ``drivers`` it takes, lists and stops jobs
    (and creates and deletes one-off clusters) but runs no entrypoint."""

    def __init__(
        self,
        rays: RayController,
        *,
        drivers: Drivers | None = None,
        refuse: str | None = None,
    ) -> None:
        self.rays = rays
        self.drivers = drivers
        self._refuse = refuse  # why no job is taken here (a 503), if none is
        self._last_created: datetime | None = None
        # Exits the runner reported, until the job's step takes them: (job, attempt) -> code.
        self._exits: dict[tuple[str, int], int] = {}

    @property
    def now(self) -> datetime:
        return self.rays.now

    @property
    def _store(self) -> Store:
        return self.rays.store

    # ---------------------------------------------------------------- the API's side

    def submit(self, cluster_id: str, owner: str, spec: RayJobSpec) -> RayJobView:
        """Queue ``spec`` on a tenant's cluster; it starts once the cluster runs.

        Raises:
            NotFound: no such cluster.
            Conflict: the cluster is stopped (nothing is created).
        """
        with self.rays.lock:
            cluster = self.rays.get(cluster_id)
            if self._refuse is not None:
                raise Unavailable(self._refuse)
            if self.drivers is not None:
                self.drivers.check(spec)
            if cluster.state.terminal:
                raise Conflict(
                    f"Ray cluster {cluster_id} is stopped: submit to a cluster that is not, "
                    "or as a one-off job with a cluster of its own"
                )
            if cluster.state.released:
                # Idle or suspended: the job needs its workers, through admission again (a
                # resume the tenant's limit refuses raises here, and no job is queued).
                self.rays.resume(cluster_id)
            job = self._record(cluster.tenant, owner, cluster_id, spec, one_off=False)
            self._commit(job, "ray.job.submitted", f"queued on Ray cluster {cluster.name}")
            self._advance(job)
            return self.view(job.id)

    def submit_one_off(self, cluster: RaySpec, spec: RayJobSpec) -> RayJobView:
        """Create a cluster for ``spec`` alone (admitted like any Ray cluster); the job starts
        once it runs, and the cluster is deleted when the job ends. Bad input raises before
        anything is created."""
        if self._refuse is not None:
            raise Unavailable(self._refuse)
        if self.drivers is not None:
            self.drivers.check(spec)
        with self.rays.lock:
            created = self.rays.create(cluster).cluster
            try:
                job = self._record(cluster.tenant, cluster.owner, created.id, spec, one_off=True)
                self._commit(job, "ray.job.submitted", "one-off: waiting for its cluster")
            except BaseException:
                self.rays.delete(created.id)
                raise
            self._advance(job)
            return self.view(job.id)

    def get(self, job_id: str) -> RayJobRecord:
        found = stored.job(self._store, job_id)
        if found is None:
            raise NotFound("Ray job", job_id)
        return found

    def view(self, job_id: str) -> RayJobView:
        return self._view(self.get(job_id))

    def jobs(
        self, tenants: Collection[str] | None = None, cluster_id: str | None = None
    ) -> list[RayJobView]:
        return [
            self._view(j) for j in stored.jobs(self._store, tenants=tenants, cluster_id=cluster_id)
        ]

    def stop(self, job_id: str) -> RayJobView:
        """Stop the driver (SIGTERM, SIGKILL after the grace) and end the job ``cancelled``;
        a one-off job's cluster is deleted with it. Idempotent."""
        with self.rays.lock:
            job = self.get(job_id)
            if not job.state.terminal:
                self._end(job, JobState.CANCELLED, CANCELLED, None, "stopped")
            return self.view(job_id)

    def workload_ids(self, job: RayJobRecord) -> list[str]:
        """The workloads that held devices for the job: a one-off cluster's slices (a job on
        a tenant's cluster shares it, and the cluster's cost is the tenant's)."""
        if not job.one_off:
            return []
        return [s.workload_id for s in stored.slices(self._store, job.cluster_id)]

    def read_log(self, job_id: str, attempt: int, offset: int, limit: int) -> LogChunk:
        if self.drivers is None:
            return LogChunk(b"", 0, "no backend runs Ray jobs here")
        return self.drivers.read_log(job_id, attempt, offset, limit)

    # ---------------------------------------------------------------- the loop's side

    def step(self) -> None:
        """One round: collect driver exits, then advance every job that has not ended."""
        with self.rays.lock:
            active = stored.jobs(self._store, active=True)
            if self.drivers is not None:
                running = [_run(j) for j in active if j.attempts and not j.attempts[-1].ended_at]
                for e in self.drivers.poll(running):
                    self._exits[(e.job_id, e.attempt)] = exit_code_of(e.exit_code, e.signal)
            for job in active:
                try:
                    self._advance(job)
                except PortalError as exc:
                    log.warning("Ray job %s: %s", job.id, exc.message)
            # Exits of drivers whose job ended already (stopped) are nobody's.
            ids = {j.id for j in active}
            self._exits = {k: v for k, v in self._exits.items() if k[0] in ids}

    def _advance(self, job: RayJobRecord) -> None:
        cluster = self.rays.get(job.cluster_id)
        current = job.attempts[-1] if job.attempts else None
        running = current is not None and current.ended_at is None
        if running:
            assert current is not None
            code = self._exits.pop((job.id, current.number), None)
            if cluster.state.terminal:
                self._end(job, JobState.FAILED, CLUSTER_GONE, None, CLUSTER_GONE)
            elif code is None:
                return
            elif code == 0:
                self._end(job, JobState.SUCCEEDED, COMPLETED, 0, "succeeded")
            elif cluster.head != current.head:
                ended = replace(current, ended_at=self.now, exit_code=code, reason=HEAD_RESTARTED)
                job = self._versioned(
                    job, state=JobState.QUEUED, message=HEAD_RESTARTED, attempts=_last(job, ended)
                )
                self._commit(job, "ray.job.requeued", HEAD_RESTARTED)
            else:
                why = exit_reason(code)
                self._end(job, JobState.FAILED, why, code, why)
            return
        if cluster.state.terminal:
            self._end(job, JobState.FAILED, CLUSTER_GONE, None, CLUSTER_GONE)
        elif cluster.state is RayState.RUNNING and cluster.address and self.drivers is not None:
            self._launch(job, cluster.address, cluster.head)
        elif job.message != (note := f"cluster: {cluster.message}"):
            self._commit(self._versioned(job, message=note), "", "")

    def _launch(self, job: RayJobRecord, address: str, head: int) -> None:
        assert self.drivers is not None
        number = job.attempt + 1
        attempt = RayJobAttempt(number=number, started_at=self.now, head=head)
        try:
            run = DriverRun(job.id, number, job.cluster_id, job.tenant)
            self.drivers.start(run, address, RayJobSpec.from_dict(job.spec))
        except (RunnerError, PortalError) as exc:
            failed = replace(attempt, ended_at=self.now, reason=exc.message)
            job = replace(job, attempt=number, attempts=(*job.attempts, failed))
            self._end(job, JobState.FAILED, exc.message, None, f"not started: {exc.message}")
            return
        job = self._versioned(
            job,
            state=JobState.RUNNING,
            attempt=number,
            attempts=(*job.attempts, attempt),
            message=f"attempt {number} running against {address}",
        )
        self._commit(job, "ray.job.running", job.message)

    def _end(
        self, job: RayJobRecord, state: JobState, reason: str, code: int | None, message: str
    ) -> None:
        attempts = job.attempts
        current = attempts[-1] if attempts else None
        if current is not None and current.ended_at is None:
            # A driver that exited (``code``) keeps what it left (its pod's log on Kubernetes).
            if self.drivers is not None and code is None:
                try:
                    run = DriverRun(job.id, current.number, job.cluster_id, job.tenant)
                    self.drivers.stop(run, STOP_GRACE_S)
                except RunnerError as exc:  # it ended already
                    log.info("Ray job %s: %s", job.id, exc.message)
            attempts = _last(
                job, replace(current, ended_at=self.now, exit_code=code, reason=reason)
            )
        new = self._versioned(
            job, state=state, attempts=attempts, message=message, ended_at=self.now
        )
        self._commit(new, f"ray.job.{state.value}", message)
        if job.one_off:
            # The cluster was the job's alone: deleting it releases every slice.
            self.rays.delete(job.cluster_id)

    # ---------------------------------------------------------------- helpers

    def _record(
        self, tenant: str, owner: str, cluster_id: str, spec: RayJobSpec, *, one_off: bool
    ) -> RayJobRecord:
        now = self.now
        if self._last_created is not None and now <= self._last_created:
            now = self._last_created + timedelta(microseconds=1)
        self._last_created = now
        return RayJobRecord(
            id=uuid.uuid4().hex,
            tenant=tenant,
            owner=owner,
            cluster_id=cluster_id,
            one_off=one_off,
            spec=spec.to_dict(),
            state=JobState.QUEUED,
            created_at=now,
            updated_at=now,
            message="waiting for its cluster",
        )

    def _view(self, job: RayJobRecord) -> RayJobView:
        cluster = self.rays.get(job.cluster_id)
        return RayJobView(job, cluster.state, cluster.message)

    def _versioned(self, job: RayJobRecord, **changes: object) -> RayJobRecord:
        return replace(job, updated_at=self.now, version=job.version + 1, **changes)  # type: ignore[arg-type]

    def _commit(self, job: RayJobRecord, kind: str, message: str) -> None:
        events = (
            [EventRecord(self.now, kind, job.tenant, None, message, {"ray_job": job.id})]
            if kind
            else []
        )
        self._store.commit(ChangeSet(ray_jobs=[job], events=events))


def _run(job: RayJobRecord) -> DriverRun:
    return DriverRun(job.id, job.attempts[-1].number, job.cluster_id, job.tenant)


def _last(job: RayJobRecord, attempt: RayJobAttempt) -> tuple[RayJobAttempt, ...]:
    return (*job.attempts[:-1], attempt)
