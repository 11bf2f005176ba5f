"""Elastic jobs: a job of ``members: {min, max}`` runs its ``min`` members as the attempt's
gang workload and each member beyond as a *slice*, a one-member workload of kind ``job`` of its
own, charged to the tenant like any workload.

- **grow**: when ``policies.elastic.decide`` says so, a slice is requested on free capacity
  only (``free_only``): placed at once, or not at all — it never queues ahead of others nor
  makes anyone stop, and the next try waits ``retry_s``;
- **shrink**: a slice runs one priority step below its job, so a reclaim takes slices before
  the gang; a slice told to stop (or idle for the tenant's idle time) is released;
- **resize**: either way the attempt's members are stopped (SIGTERM: they checkpoint), the
  attempt ends with reason ``resized to N``, and the next attempt, on the same gang workload
  plus the slices left, launches with the new ``WORLD_SIZE`` once the old members have ended,
  resuming from the newest complete checkpoint (``GPUPORTAL_RESUME_FROM``).

Slices are found again through their idempotency keys (``SLICE_KEY_PREFIX``), so they survive
a portal restart; an attempt that ends for any other reason (failure, preemption of the gang,
cancel, success) releases them all, and the next attempt starts again at ``min``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from policies.elastic import (
    ElasticLimits,
    ElasticSettings,
    Resize,
    Sample,
    decide,
    slice_priority,
)
from policies.errors import Forbidden, NotFound
from policies.jobs import JobState
from policies.requests import WorkloadKind, WorkloadRequest
from portal.allocator import Allocator, WorkloadStatus
from portal.allocator.intake import NoFreeRoom
from portal.allocator.state import State
from portal.jobs.checkpoints import newest_complete_checkpoint
from portal.jobs.runner import RunnerError
from portal.jobs.spec import JobSpec
from portal.store.elastic import elastic_settings
from portal.store.jobs import SLICE_KEY_PREFIX, slice_key_prefix
from portal.store.records import (
    AllocationRecord,
    AttemptRecord,
    ChangeSet,
    ElasticSettingsRecord,
    JobRecord,
    WorkloadState,
)

if TYPE_CHECKING:
    from portal.jobs.controller import JobController

log = logging.getLogger(__name__)

DEFAULT_RETRY_S = 30.0
"""After a slice that did not fit at once, how long before the next try."""

Utilization = Callable[[Sequence[str], datetime], Sequence[Sample]]
"""GPU utilization samples of the given workloads since a time (the telemetry's reading)."""


def resized(world: int) -> str:
    """The exit reason of an attempt ended by a resize."""
    return f"resized to {world}"


@dataclass(frozen=True, slots=True)
class _Stopping:
    """A resize under way: the old attempt's members were told to stop; the next attempt
    launches once they all ended or ``until`` passed."""

    attempt: int
    members: int
    until: datetime


class ElasticJobs:
    """The elastic side of a ``JobController``: it calls these hooks under its lock, and
    they work on its attempts, exits and store writes (the controller stays the one writer
    of jobs)."""

    def __init__(
        self,
        controller: JobController,
        alloc: Allocator,
        *,
        utilization: Utilization | None = None,
        retry_s: float = DEFAULT_RETRY_S,
        check_s: float = 0.0,
    ) -> None:
        self._ctl = controller
        self._alloc = alloc
        self.utilization = utilization
        self.retry_s = retry_s
        # Seconds between two readings of a job's utilization (each is a database query;
        # the policy's windows are minutes long, the jobs loop runs twice a second).
        self.check_s = check_s
        self._next_check: dict[str, datetime] = {}
        # Settings given for this process only (``set_settings``), over the stored ones.
        self._given: dict[str, ElasticSettings] = {}
        self._stopping: dict[str, _Stopping] = {}
        self._next_try: dict[str, datetime] = {}

    # ---------------------------------------------------------------- settings

    def set_settings(self, tenant: str, settings: ElasticSettings) -> None:
        """The tenant's growth policy for this process only (``save`` stores it)."""
        self._given[tenant] = settings

    def settings(self, tenant: str) -> ElasticSettings:
        """The tenant's policy: as given to this process, else as stored (read each time, a
        key lookup: a deleted and re-created tenant never inherits its old row), else the
        defaults."""
        if tenant in self._given:
            return self._given[tenant]
        found = elastic_settings(self._alloc.store, tenant)
        return found[0].settings if found else ElasticSettings()

    def stored(self, tenant: str) -> ElasticSettingsRecord:
        """The tenant's stored settings and limits; the defaults at version 0 when none."""
        if tenant not in {t.name for t in self._alloc.tenants()}:
            raise NotFound("tenant", tenant)
        found = elastic_settings(self._alloc.store, tenant)
        if found:
            return found[0]
        epoch = datetime.fromtimestamp(0, UTC)
        return ElasticSettingsRecord(tenant, ElasticSettings(), ElasticLimits(), epoch, 0)

    def save(
        self,
        tenant: str,
        settings: ElasticSettings,
        limits: ElasticLimits | None,
        *,
        platform: bool,
        expected_version: int,
    ) -> ElasticSettingsRecord:
        """Store the tenant's settings (version ``expected_version + 1``). Only a platform
        admin (``platform``) sets ``limits`` (None: keep them); anyone else edits within them.

        Raises:
            NotFound: no such tenant.
            Forbidden: limits from someone other than a platform admin, or settings outside
                the limits.
            Conflict: the stored version is not ``expected_version``.
        """
        with self._ctl._lock:
            current = self.stored(tenant)
            if not platform:
                if limits is not None:
                    raise Forbidden(f"only a platform admin may set the elastic limits of {tenant}")
                current.limits.admit(tenant, settings)
            rec = ElasticSettingsRecord(
                tenant=tenant,
                settings=settings,
                limits=current.limits if limits is None else limits,
                updated_at=self._ctl.now,
                version=expected_version + 1,
            )
            self._alloc.store.commit(ChangeSet(elastic=[rec]))
            self._given.pop(tenant, None)
            return rec

    # ---------------------------------------------------------------- slices

    def slices(self, job_id: str) -> list[WorkloadStatus]:
        """The job's slices the allocator still holds, oldest first."""
        prefix = slice_key_prefix(job_id)

        def found(st: State) -> list[tuple[datetime, str]]:
            return sorted(
                (lv.rec.created_at, wid)
                for wid, lv in st.live.items()
                if (lv.rec.idempotency_key or "").startswith(prefix)
            )

        out = []
        for _at, wid in self._alloc.read(found):
            try:
                out.append(self._alloc.status(wid, estimate=False))
            except NotFound:  # released meanwhile
                continue
        return out

    def release_slices(self, job: JobRecord, reason: str) -> None:
        """Give back every slice (the attempt ended for another reason than a resize)."""
        self._stopping.pop(job.id, None)
        for s in self.slices(job.id):
            self._alloc.release(s.id, reason=reason)

    def release_orphans(self, running: Collection[str]) -> None:
        """At start: give back the slices of jobs not running (the portal stopped between an
        attempt's end and the release of its slices)."""

        def keys(st: State) -> list[tuple[str, str]]:
            return [
                (wid, key)
                for wid, lv in st.live.items()
                if (key := lv.rec.idempotency_key or "").startswith(SLICE_KEY_PREFIX)
            ]

        for wid, key in self._alloc.read(keys):
            if key[len(SLICE_KEY_PREFIX) :].split("/", 1)[0] not in running:
                self._alloc.release(wid, reason="elastic slice of a job not running")

    def _request_slice(self, job: JobRecord, spec: JobSpec) -> WorkloadStatus | None:
        """A slice started now on free capacity, or None: a growth try never queues, never
        starts a reclaim and leaves no record when it does not fit."""
        try:
            return self._alloc.request(
                WorkloadRequest(
                    tenant=job.tenant,
                    owner=job.owner,
                    name=f"{job.name} (elastic)",
                    devices=spec.devices,
                    kind=WorkloadKind.JOB,
                    gang_size=1,
                    priority=slice_priority(spec.priority),
                ),
                idempotency_key=f"{slice_key_prefix(job.id)}{uuid.uuid4().hex}",
                estimate=False,
                free_only=True,
            )
        except NoFreeRoom:
            return None

    # ---------------------------------------------------------------- hooks

    def world(self, job: JobRecord, attempt: AttemptRecord | None = None) -> int:
        """Members of the job's current attempt."""
        if attempt is None and job.attempt:
            attempt = self._ctl._attempt(job)
        if attempt is not None and attempt.world_size is not None:
            return attempt.world_size
        members = job.spec["members"]
        assert isinstance(members, int)
        return members

    def watched(self) -> set[tuple[str, int]]:
        """Attempts whose members' exits the controller must still collect."""
        return {(jid, s.attempt) for jid, s in self._stopping.items()}

    def allocations(
        self, job: JobRecord, gang: Sequence[AllocationRecord]
    ) -> list[AllocationRecord]:
        """The gang's allocations, then each running slice's as the next member index; a
        slice reclaimed while the attempt waited to launch is given back now."""
        out = list(gang)
        if job.spec.get("max_members") is None:
            return out
        member = 1 + max((a.member for a in gang), default=-1)
        for s in self.slices(job.id):
            if s.state is WorkloadState.RUNNING:
                out.extend(replace(a, member=member) for a in s.allocations)
                member += 1
            else:
                self._alloc.release(s.id, reason="elastic slice reclaimed")
        return out

    def ready(self, job: JobRecord) -> bool:
        """Whether the next attempt may launch: no resize under way, or its old members all
        ended (or their time is up). Then the attempt resumes from the newest checkpoint,
        read now, after the old members wrote their last one."""
        stopping = self._stopping.get(job.id)
        if stopping is None:
            return True
        key = (job.id, stopping.attempt)
        ended = self._ctl._exits.get(key, {})
        if len(ended) < stopping.members and self._ctl.now < stopping.until:
            return False
        del self._stopping[job.id]
        self._ctl._exits.pop(key, None)
        spec = JobSpec.from_dict(job.tenant, job.owner, job.name, job.spec)
        if spec.checkpoint_dir is not None:
            resume = newest_complete_checkpoint(Path(spec.checkpoint_dir))
            if resume is not None:
                attempt = replace(
                    self._ctl._attempt(job), resume_from=str(resume[0]), resume_step=resume[1]
                )
                self._alloc.store.commit(ChangeSet(attempts=[attempt]))
        return True

    def advance(self, job: JobRecord, spec: JobSpec, gang: WorkloadStatus) -> bool:
        """A running elastic job: resize it when a slice was reclaimed or ended, or when the
        policy says grow or shrink. True when it acted (the controller stops there)."""
        bounds = spec.bounds
        if bounds is None or job.state is not JobState.RUNNING:
            return False
        attempt = self._ctl._attempt(job)
        world = self.world(job, attempt)
        slices = self.slices(job.id)
        lost = [s for s in slices if s.state is not WorkloadState.RUNNING]
        if lost or len(slices) != world - spec.members:
            for s in lost:
                self._alloc.release(s.id, reason="elastic slice reclaimed")
            kept = len(slices) - len(lost)
            self._resize(job, spec, spec.members + kept, "a slice was reclaimed")
            return True
        now = self._ctl.now
        checked = self._next_check.get(job.id)
        if checked is not None and now < checked:
            return False
        self._next_check[job.id] = now + timedelta(seconds=self.check_s)
        ids = [gang.id, *(s.id for s in slices)]
        settings = self.settings(job.tenant)
        since = now - timedelta(seconds=max(settings.window_s, settings.idle_s))
        sample = self.utilization
        job_samples = sample(ids, since) if sample is not None else []
        newest = sample([slices[-1].id], since) if sample is not None and slices else []
        retry_at = self._next_try.get(job.id)
        verdict = decide(
            members=world,
            bounds=bounds,
            settings=settings,
            job_samples=job_samples,
            newest_slice_samples=newest,
            capacity_free=retry_at is None or now >= retry_at,
            now=now.timestamp(),
        )
        if verdict is Resize.SHRINK:
            self._alloc.release(slices[-1].id, reason="elastic slice idle")
            self._resize(job, spec, world - 1, "a slice was idle")
            return True
        if verdict is Resize.GROW:
            if self._request_slice(job, spec) is None:
                self._next_try[job.id] = now + timedelta(seconds=self.retry_s)
                return False
            self._next_try.pop(job.id, None)
            self._resize(job, spec, world + 1, "capacity freed up")
            return True
        return False

    def _resize(self, job: JobRecord, spec: JobSpec, world: int, why: str) -> None:
        """End the running attempt (``resized to N``) and record the next one on the same
        gang workload; it launches once ``ready``."""
        ctl = self._ctl
        old = ctl._attempt(job)
        members = self.world(job, old)
        grace = ctl._stop_grace_s
        runner = ctl.backend.runner if ctl.backend is not None else None
        if runner is not None:
            try:
                runner.stop(job.id, job.attempt, grace, wait=False)
            except RunnerError as exc:
                log.warning("job %s attempt %d: %s", job.id, job.attempt, exc)
        now = ctl.now
        ended = replace(old, ended_at=now, exit_reason=resized(world), counted=False)
        number = job.attempt + 1
        nxt = AttemptRecord(
            job_id=job.id,
            number=number,
            workload_id=old.workload_id,
            queued_at=now,
            topology=old.topology,
            resume_from=old.resume_from,
            resume_step=old.resume_step,
            world_size=world,
        )
        message = f"attempt {job.attempt} {resized(world)} ({why}); attempt {number} starts"
        new = ctl._versioned(job, state=JobState.QUEUED, attempt=number, message=message)
        self._stopping[job.id] = _Stopping(
            job.attempt, members, now + timedelta(seconds=grace + 15.0)
        )
        ctl._commit([new], [ended, nxt], "job.resized", new, f"{job.name}: {message}")

    def forget(self, job_ids: Collection[str]) -> None:
        """Drop what is remembered of jobs that ended."""
        for jid in job_ids:
            self._stopping.pop(jid, None)
            self._next_try.pop(jid, None)
            self._next_check.pop(jid, None)
